#include "server/reasoning_parser.h"

#include <gtest/gtest.h>

#include "server/openai_response.h"
#include "server/test_fakes.h"

namespace pd::server {
namespace {

// Feeds `pieces` one by one and returns {reasoning, content} concatenated.
std::pair<std::string, std::string> Run(ReasoningParser parser,
                                        const std::vector<std::string>& pieces) {
  ReasoningSplitter s(parser);
  std::string reasoning, content;
  for (const std::string& p : pieces) {
    auto split = s.Feed(p);
    reasoning += split.reasoning;
    content += split.content;
  }
  auto last = s.Finish();
  return {reasoning + last.reasoning, content + last.content};
}

// Every way of cutting `text` in two gives the same split as feeding it whole.
void ExpectSplitAnywhere(ReasoningParser parser, const std::string& text,
                         const std::string& reasoning, const std::string& content) {
  EXPECT_EQ(Run(parser, {text}), std::make_pair(reasoning, content)) << text;
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    EXPECT_EQ(Run(parser, {text.substr(0, cut), text.substr(cut)}),
              std::make_pair(reasoning, content))
        << text << " cut at " << cut;
  }
}

TEST(ReasoningParser, DeepSeekR1) {
  const auto r1 = ReasoningParser::kDeepSeekR1;
  ExpectSplitAnywhere(r1, "<think>\nwhy\n</think>\n\nanswer", "\nwhy\n", "\n\nanswer");
  ExpectSplitAnywhere(r1, "why</think>answer", "why", "answer");  // <think> was in the prompt
  ExpectSplitAnywhere(r1, "still thinking <", "still thinking <", "");
  ExpectSplitAnywhere(r1, "a</think>b</think>c", "a", "b</think>c");
}

TEST(ReasoningParser, Qwen3) {
  const auto q = ReasoningParser::kQwen3;
  ExpectSplitAnywhere(q, "<think>\nhm\n</think>\n\nok", "\nhm\n", "\n\nok");
  ExpectSplitAnywhere(q, "no reasoning </think> here", "", "no reasoning </think> here");
  ExpectSplitAnywhere(q, "<thi", "", "<thi");
  ExpectSplitAnywhere(q, "", "", "");
}

TEST(ReasoningParser, NoneAndNames) {
  ExpectSplitAnywhere(ReasoningParser::kNone, "<think>x</think>y", "", "<think>x</think>y");
  EXPECT_EQ(*ParseReasoningParserName("qwen3"), ReasoningParser::kQwen3);
  EXPECT_EQ(*ParseReasoningParserName("deepseek_r1"), ReasoningParser::kDeepSeekR1);
  EXPECT_EQ(*ParseReasoningParserName(""), ReasoningParser::kNone);
  auto bad = ParseReasoningParserName("granite");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "--reasoning-parser 'granite' is not one of deepseek_r1, qwen3, none");
}

TextDelta Delta(std::string text, bool finished = false) {
  TextDelta d;
  d.text = std::move(text);
  d.finished = finished;
  if (finished) d.finish_reason = "stop";
  return d;
}

ResponseFormat ChatFormat(ReasoningParser parser) {
  ResponseFormat f;
  f.kind = ApiKind::kChat;
  f.id = "chatcmpl-1";
  f.model = "m";
  f.reasoning_parser = parser;
  return f;
}

TEST(ReasoningParser, ChatReplyHasReasoningContentApart) {
  testing::FakeTokenizer tokenizer;
  ResponseBuilder whole(ChatFormat(ReasoningParser::kQwen3), tokenizer);
  whole.Accumulate(Delta("<think>\nsum 2+2"));
  whole.Accumulate(Delta("\n</think>\n\n4", true));
  const auto message = nlohmann::json::parse(whole.Final(3, 5))["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "\nsum 2+2\n");
  EXPECT_EQ(message["content"], "\n\n4");

  ResponseBuilder plain(ChatFormat(ReasoningParser::kNone), tokenizer);
  plain.Accumulate(Delta("<think>x</think>y", true));
  const auto plain_message = nlohmann::json::parse(plain.Final(1, 1))["choices"][0]["message"];
  EXPECT_EQ(plain_message["content"], "<think>x</think>y");
  EXPECT_FALSE(plain_message.contains("reasoning_content"));
}

TEST(ReasoningParser, StreamDeltasCarryReasoningThenContent) {
  testing::FakeTokenizer tokenizer;
  ResponseBuilder stream(ChatFormat(ReasoningParser::kDeepSeekR1), tokenizer);
  std::vector<nlohmann::json> deltas;
  for (const TextDelta& d : {Delta("why"), Delta("</thi"), Delta("nk>ans"), Delta("wer", true)}) {
    const std::string event = stream.Chunk(d);
    ASSERT_TRUE(event.starts_with("data: ")) << event;
    deltas.push_back(nlohmann::json::parse(event.substr(6))["choices"][0]["delta"]);
  }
  EXPECT_EQ(deltas[0], nlohmann::json({{"reasoning_content", "why"}}));
  EXPECT_EQ(deltas[1], nlohmann::json({{"content", ""}}));  // "</thi" held back
  EXPECT_EQ(deltas[2], nlohmann::json({{"content", "ans"}}));
  EXPECT_EQ(deltas[3], nlohmann::json({{"content", "wer"}}));
}

}  // namespace
}  // namespace pd::server
