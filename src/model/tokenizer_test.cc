#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "common/file_util.h"
#include "model/tokenizer_testing.h"

namespace pd::model {
namespace {

using testing::ScratchDir;
using testing::SmallTokenizer;
using Ids = std::vector<int32_t>;

std::unique_ptr<Tokenizer> Make(const nlohmann::json& root) {
  auto tok = Tokenizer::FromJson(root.dump(), "tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

std::string RoundTrip(const Tokenizer& tok, std::string_view text) {
  auto decoded = tok.Decode(tok.Encode(text));
  EXPECT_TRUE(decoded.ok()) << decoded.status().ToString();
  return decoded.ok() ? *decoded : std::string("<decode failed>");
}

TEST(Tokenizer, EncodesByMergeRank) {
  auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  // "hello": h+e (rank 0), l+l (1), he+ll (2), hell+o (3). " world": Ġ+w (4), o+r (5),
  // Ġw+or (6), l+d (7).
  EXPECT_EQ(tok->Encode("hello world"), (Ids{259, 262, 263}));
  // " hello" has no merge for Ġ+h: the space stays a byte token.
  EXPECT_EQ(tok->Encode("hello hello"), (Ids{259, 32, 259}));
  EXPECT_EQ(tok->Encode("help"), (Ids{256, 'l', 'p'}));
  EXPECT_EQ(tok->Encode("worlds"), (Ids{'w', 261, 263, 's'}));
  EXPECT_EQ(tok->Encode(""), Ids{});
  EXPECT_EQ(tok->Encode("\xff"), Ids{0xff});  // invalid UTF-8 still has byte tokens
  EXPECT_EQ(tok->vocab_size(), 268);
  EXPECT_EQ(tok->TokenString(262), "Ġwor");
  EXPECT_EQ(tok->TokenBytes(262).value(), " wor");
  EXPECT_EQ(tok->TokenToId("Ġwor"), 262);
  EXPECT_EQ(tok->TokenToId("nope"), std::nullopt);
  EXPECT_EQ(tok->chat_template(), nullptr);
  EXPECT_EQ(tok->bos_token_id(), std::nullopt);
}

TEST(Tokenizer, MergesAsPairsEqualMergesAsStrings) {
  auto a = Make(SmallTokenizer(false));
  auto b = Make(SmallTokenizer(true));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (const char* text : {"hello world", "hello hello", "help worlds", "or ld ll he"}) {
    EXPECT_EQ(a->Encode(text), b->Encode(text)) << text;
  }
}

TEST(Tokenizer, MergeRankBeatsPosition) {
  // "abc" with merges [b c, a b]: b+c has the lower rank, so the result is a + bc even though
  // a+b comes first in the text.
  auto root = SmallTokenizer();
  root["model"]["vocab"]["bc"] = 268;
  root["model"]["vocab"]["ab"] = 269;
  root["model"]["merges"] = {"b c", "a b"};
  auto tok = Make(root);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("abc"), (Ids{'a', 268}));
  EXPECT_EQ(tok->Encode("abab"), (Ids{269, 269}));
}

TEST(Tokenizer, IgnoreMergesEmitsWholeVocabWords) {
  auto root = SmallTokenizer();
  auto plain = Make(root);
  root["model"]["ignore_merges"] = true;
  auto ignoring = Make(root);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_EQ(plain->Encode("xyz"), (Ids{'x', 'y', 'z'}));
  EXPECT_EQ(ignoring->Encode("xyz"), (Ids{267}));
  EXPECT_EQ(ignoring->Encode("hello world"), (Ids{259, 262, 263}));
}

TEST(Tokenizer, AddedTokensMatchLeftmostLongest) {
  auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("<|end|>"), (Ids{264}));
  EXPECT_EQ(tok->Encode("a<|end|>!b"), (Ids{'a', 266, 'b'}));  // the longer "<|end|>!" wins
  EXPECT_EQ(tok->Encode("<|end|><|user|>hello"), (Ids{264, 265, 259}));
  EXPECT_EQ(tok->Encode("hello<|user|> world"), (Ids{259, 265, 262, 263}));
  // Almost-tokens are ordinary text.
  EXPECT_EQ(tok->Encode("<|end|"), (Ids{'<', '|', 'e', 'n', 'd', '|'}));
  EXPECT_TRUE(tok->IsSpecial(264));
  EXPECT_FALSE(tok->IsSpecial(266));
  EXPECT_FALSE(tok->IsSpecial(259));
  EXPECT_FALSE(tok->IsSpecial(100000));
  EXPECT_EQ(tok->Decode(Ids{259, 264, 266, 262}).value(), "hello<|end|><|end|>! wor");
  // skip_special drops special tokens only.
  EXPECT_EQ(tok->Decode(Ids{259, 264, 266, 262}, true).value(), "hello<|end|>! wor");
}

TEST(Tokenizer, DecodeRefusesUnknownIds) {
  auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  auto bad = tok->Decode(Ids{259, 268});
  EXPECT_EQ(bad.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(bad.status().message().find("268"), std::string::npos);
  EXPECT_FALSE(tok->Decode(Ids{-1}).ok());
  EXPECT_FALSE(tok->TokenBytes(5000).ok());
  EXPECT_EQ(tok->TokenString(-3), "");
  // A hole in the id space is not a token either.
  auto root = SmallTokenizer();
  root["added_tokens"].push_back({{"id", 300}, {"content", "<|far|>"}, {"special", true}});
  auto holes = Make(root);
  ASSERT_NE(holes, nullptr);
  EXPECT_EQ(holes->vocab_size(), 301);
  EXPECT_FALSE(holes->Decode(Ids{280}).ok());
  EXPECT_EQ(holes->Decode(Ids{300}).value(), "<|far|>");
}

// Random strings from a mix of ASCII (control characters included), Latin, CJK, emoji,
// whitespace runs, newlines and special-token text.
std::string RandomText(std::mt19937& rng) {
  static const std::vector<std::string> kPieces = {" ",
                                                   "  ",
                                                   "\n",
                                                   "\n\n",
                                                   "\r\n",
                                                   "\t",
                                                   "   \n ",
                                                   "'s",
                                                   "'LL",
                                                   "123",
                                                   "4567",
                                                   ".",
                                                   "!?",
                                                   "é",
                                                   "ß",
                                                   "日本",
                                                   "语",
                                                   "😀",
                                                   "👩‍👩‍👧",
                                                   "Ω",
                                                   "\x01",
                                                   "\x7f",
                                                   "<|end|>",
                                                   "<|user|>",
                                                   "<|end|>!",
                                                   "<|",
                                                   "|>",
                                                   "hello",
                                                   "world",
                                                   "x",
                                                   "\u00a0",
                                                   "\u2028"};
  std::string s;
  const int n = static_cast<int>(rng() % 30);
  for (int i = 0; i < n; ++i) {
    if (rng() % 3 == 0) {
      s += static_cast<char>(0x20 + rng() % 95);
    } else if (rng() % 7 == 0) {
      // any code point, surrogates excluded
      uint32_t cp = rng() % 0x110000;
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x41;
      internal::AppendUtf8(cp, &s);
    } else {
      s += kPieces[rng() % kPieces.size()];
    }
  }
  return s;
}

TEST(Tokenizer, RoundTripsRandomUtf8) {
  auto gpt2_style = Make(SmallTokenizer());
  ASSERT_NE(gpt2_style, nullptr);
  ScratchDir dir("roundtrip");
  ASSERT_TRUE(WriteSyntheticTokenizer(dir.path(), Arch::kLlama, 2000).ok());
  auto llama = Tokenizer::Load(dir.path());
  ASSERT_TRUE(llama.ok()) << llama.status().ToString();
  std::mt19937 rng(1234);
  for (int i = 0; i < 3000; ++i) {
    const std::string s = RandomText(rng);
    ASSERT_TRUE(internal::IsValidUtf8(s));
    ASSERT_EQ(RoundTrip(*gpt2_style, s), s);
    ASSERT_EQ(RoundTrip(**llama, s), s);
  }
}

TEST(Tokenizer, RoundTripsInvalidUtf8AndLongRuns) {
  auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(99);
  for (int i = 0; i < 500; ++i) {
    std::string s(rng() % 20, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    ASSERT_EQ(RoundTrip(*tok, s), s);
  }
  const std::string spaces(200000, ' ');
  EXPECT_EQ(RoundTrip(*tok, spaces + "x" + spaces), spaces + "x" + spaces);
  const std::string newlines(100000, '\n');
  EXPECT_EQ(RoundTrip(*tok, "a" + newlines), "a" + newlines);
}

TEST(Tokenizer, EncodesConcurrently) {
  ScratchDir dir("concurrent");
  ASSERT_TRUE(WriteSyntheticTokenizer(dir.path(), Arch::kQwen2, 3000).ok());
  auto loaded = Tokenizer::Load(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tokenizer& tok = **loaded;
  std::mt19937 rng(5);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back(RandomText(rng));
  std::vector<Ids> expected;
  for (const auto& text : texts) expected.push_back(tok.Encode(text));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < texts.size(); ++i)
          mismatches[t] += tok.Encode(texts[i]) != expected[i];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(Tokenizer, TokenBytesConcatenateToDecode) {
  auto tok = Make(SmallTokenizer());
  ASSERT_NE(tok, nullptr);
  const std::string text = "hello<|user|> 日本語 world 😀";
  std::string streamed;
  for (int32_t id : tok->Encode(text)) streamed += tok->TokenBytes(id).value();
  EXPECT_EQ(streamed, text);
}

TEST(Tokenizer, LoadsConfigAndChatTemplate) {
  ScratchDir dir("load_config");
  ASSERT_TRUE(WriteStringToFile(dir.path() + "/tokenizer.json", SmallTokenizer().dump()).ok());
  // No tokenizer_config.json: no bos/eos, no template.
  auto bare = Tokenizer::Load(dir.path());
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  EXPECT_EQ((*bare)->chat_template(), nullptr);
  const std::vector<ChatMessage> hi = {{"user", "hi"}};
  auto refused = (*bare)->ApplyChatTemplate(ChatInput::FromMessages(hi, true));
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("chat template"), std::string::npos);

  nlohmann::json config = {{"bos_token", {{"content", "<|user|>"}, {"lstrip", false}}},
                           {"eos_token", "<|end|>"},
                           {"chat_template", "{{ '<|im_start|>' }}"}};
  ASSERT_TRUE(WriteStringToFile(dir.path() + "/tokenizer_config.json", config.dump()).ok());
  auto tok = Tokenizer::Load(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->bos_token_id(), 265);
  EXPECT_EQ((*tok)->eos_token_id(), 264);
  ASSERT_NE((*tok)->chat_template(), nullptr);
  EXPECT_EQ((*tok)->ApplyChatTemplate(ChatInput::FromMessages(hi, true)).value(), "<|im_start|>");
}

TEST(Tokenizer, LoadMissingDirectoryIsNotFound) {
  auto tok = Tokenizer::Load("/nonexistent/pd_tokenizer_dir");
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find("/nonexistent/pd_tokenizer_dir/tokenizer.json"),
            std::string::npos);
}

}  // namespace
}  // namespace pd::model
