#include "server/text_stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/test_fakes.h"

namespace pd::server {
namespace {

using testing::FakeTokenizer;

engine::RequestOutput Out(std::vector<int32_t> ids,
                          engine::FinishReason reason = engine::FinishReason::kNone) {
  engine::RequestOutput out;
  out.new_token_ids = std::move(ids);
  out.finish_reason = reason;
  return out;
}

std::vector<int32_t> Bytes(std::string_view s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

TEST(Utf8AssemblerTest, NeverEmitsHalfACharacter) {
  Utf8Assembler a;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC, 3 bytes
  EXPECT_EQ(a.Push(euro.substr(0, 1)), "");
  EXPECT_EQ(a.Push(euro.substr(1, 1)), "");
  EXPECT_EQ(a.Push(euro.substr(2, 1) + "x"), euro + "x");
  const std::string emoji = "\xF0\x9F\x98\x80";  // 4 bytes
  EXPECT_EQ(a.Push("a" + emoji.substr(0, 2)), "a");
  EXPECT_EQ(a.pending_bytes(), 2u);
  EXPECT_EQ(a.Push(emoji.substr(2)), emoji);
  EXPECT_EQ(a.Flush(), "");
}

TEST(Utf8AssemblerTest, InvalidBytesBecomeReplacementCharacters) {
  Utf8Assembler a;
  EXPECT_EQ(a.Push("\xFF"
                   "a"),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(a.Push("\x80"), "\xEF\xBF\xBD");  // stray continuation byte
  EXPECT_EQ(a.Push("\xE2\x82"
                   "b"),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "b");  // truncated sequence
  EXPECT_EQ(a.Push("\xE2"), "");
  EXPECT_EQ(a.Flush(), "\xEF\xBF\xBD");  // incomplete at the end
}

TEST(TextGeneratorTest, CountsAndFinishesByLength) {
  FakeTokenizer tok;
  TextGenerator gen(tok, {});
  TextDelta d1 = gen.Consume(Out(Bytes("he")));
  EXPECT_EQ(d1.text, "he");
  EXPECT_FALSE(d1.finished);
  TextDelta d2 = gen.Consume(Out(Bytes("y"), engine::FinishReason::kLength));
  EXPECT_EQ(d2.text, "y");
  EXPECT_TRUE(d2.finished);
  EXPECT_EQ(d2.finish_reason, "length");
  EXPECT_EQ(gen.num_generated_tokens(), 3);
  EXPECT_TRUE(gen.Consume(Out(Bytes("z"))).empty());  // ignored after finishing
  EXPECT_EQ(gen.num_generated_tokens(), 3);
}

TEST(TextGeneratorTest, SkipsSpecialTokensAndReportsStopToken) {
  FakeTokenizer tok;
  TextGenerator gen(tok, {});
  TextDelta d = gen.Consume(Out({'o', 'k', FakeTokenizer::kEos}, engine::FinishReason::kStop));
  EXPECT_EQ(d.text, "ok");
  EXPECT_EQ(d.finish_reason, "stop");
  EXPECT_EQ(gen.num_generated_tokens(), 3);  // the EOS counts as generated, as in vLLM
  TextGenerator raw(tok, {{}, /*skip_special_tokens=*/false});
  EXPECT_EQ(raw.Consume(Out({'o', FakeTokenizer::kEos})).text, "o<|endoftext|>");
}

TEST(TextGeneratorTest, StopStringIsTrimmedAndHeldBack) {
  FakeTokenizer tok;
  TextGenerator gen(tok, {{"END", "xyz"}, true});
  std::string streamed;
  // "abcE" : "E" may start "END", so it is held back.
  TextDelta d1 = gen.Consume(Out(Bytes("abcE")));
  streamed += d1.text;
  EXPECT_EQ(streamed, "ab");  // held back: max stop length - 1 = 2 bytes
  TextDelta d2 = gen.Consume(Out(Bytes("N")));
  streamed += d2.text;
  TextDelta d3 = gen.Consume(Out(Bytes("Dtail")));
  streamed += d3.text;
  EXPECT_TRUE(d3.finished);
  EXPECT_EQ(d3.finish_reason, "stop");
  EXPECT_EQ(*d3.stop_string, "END");
  EXPECT_TRUE(d3.abort_engine);
  EXPECT_EQ(streamed, "abc");
  EXPECT_EQ(gen.text(), "abc");
  // Tokens after the one that completed the stop string are not counted.
  EXPECT_EQ(gen.num_generated_tokens(), 6);
}

TEST(TextGeneratorTest, FlushesHeldTextWhenFinishedWithoutStop) {
  FakeTokenizer tok;
  TextGenerator gen(tok, {{"ENDING"}, true});
  TextDelta d1 = gen.Consume(Out(Bytes("hi EN")));
  EXPECT_EQ(d1.text, "");
  TextDelta d2 = gen.Consume(Out(Bytes("D"), engine::FinishReason::kLength));
  EXPECT_EQ(d1.text + d2.text, "hi END");
  EXPECT_EQ(d2.finish_reason, "length");
  EXPECT_FALSE(d2.stop_string.has_value());
}

TEST(TextGeneratorTest, HoldBackNeverSplitsACharacter) {
  FakeTokenizer tok;
  TextGenerator gen(tok, {{"ab"}, true});
  const std::string s = "x\xC3\xA9y";  // x é y
  std::string streamed;
  for (int32_t id : Bytes(s)) {
    TextDelta d = gen.Consume(Out({id}));
    // Every delta is whole characters.
    Utf8Assembler check;
    EXPECT_EQ(check.Push(d.text), d.text);
    EXPECT_EQ(check.pending_bytes(), 0u);
    streamed += d.text;
  }
  streamed += gen.Consume(Out({}, engine::FinishReason::kLength)).text;
  EXPECT_EQ(streamed, s);
}

TEST(TextGeneratorTest, StopStringAcrossMultiByteCharacters) {
  FakeTokenizer tok;
  TextGenerator gen(tok, {{"\xC3\xA9!"}, true});  // "é!"
  std::string streamed;
  bool finished = false;
  for (int32_t id : Bytes("caf\xC3\xA9!more")) {
    TextDelta d = gen.Consume(Out({id}));
    streamed += d.text;
    if (d.finished) {
      finished = true;
      break;
    }
  }
  EXPECT_TRUE(finished);
  EXPECT_EQ(streamed, "caf");
}

TEST(TextGeneratorTest, AbortFinishesWithAbort) {
  FakeTokenizer tok;
  TextGenerator gen(tok, {});
  (void)gen.Consume(Out(Bytes("a")));
  TextDelta d = gen.Abort();
  EXPECT_TRUE(d.finished);
  EXPECT_EQ(d.finish_reason, "abort");
  EXPECT_TRUE(gen.Abort().empty());
}

TEST(TextGeneratorTest, TokenDisplay) {
  FakeTokenizer tok;
  EXPECT_EQ(TokenDisplay(tok, 'a', false), "a");
  EXPECT_EQ(TokenDisplay(tok, 'a', true), "token_id:97");
  EXPECT_EQ(TokenDisplay(tok, FakeTokenizer::kEos, false), "<|endoftext|>");
}

}  // namespace
}  // namespace pd::server
