#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "common/file_util.h"
#include "model/tokenizer.h"
#include "model/tokenizer_testing.h"

namespace pd::model {
namespace {

using testing::ScratchDir;

struct ArchCase {
  Arch arch;
  int vocab_size;
};

class SyntheticTokenizerTest : public ::testing::TestWithParam<ArchCase> {};

// Writes and loads each (arch, vocab_size) once for the whole suite: the 152k-id one is large.
const Tokenizer* WriteAndLoad(Arch arch, int vocab_size) {
  static auto* cache = new std::map<std::pair<Arch, int>, std::unique_ptr<Tokenizer>>();
  auto& slot = (*cache)[{arch, vocab_size}];
  if (slot == nullptr) {
    ScratchDir dir("synthetic_" + std::to_string(vocab_size));
    Status written = WriteSyntheticTokenizer(dir.path(), arch, vocab_size);
    EXPECT_TRUE(written.ok()) << written.ToString();
    auto tokenizer = Tokenizer::Load(dir.path());
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    if (tokenizer.ok()) slot = std::move(tokenizer).value();
  }
  return slot.get();
}

TEST_P(SyntheticTokenizerTest, LoadsWithSpecialTokensAtTheTop) {
  const ArchCase c = GetParam();
  const Tokenizer* tok = WriteAndLoad(c.arch, c.vocab_size);
  ASSERT_NE(tok, nullptr);
  const int v = c.vocab_size;
  EXPECT_EQ(tok->vocab_size(), v);
  if (c.arch == Arch::kLlama) {
    EXPECT_EQ(tok->TokenToId("<|begin_of_text|>"), v - 5);
    EXPECT_EQ(tok->TokenToId("<|end_of_text|>"), v - 4);
    EXPECT_EQ(tok->TokenToId("<|start_header_id|>"), v - 3);
    EXPECT_EQ(tok->TokenToId("<|end_header_id|>"), v - 2);
    EXPECT_EQ(tok->TokenToId("<|eot_id|>"), v - 1);
    EXPECT_EQ(tok->bos_token_id(), v - 5);
    EXPECT_EQ(tok->eos_token_id(), v - 1);
    EXPECT_TRUE(tok->adds_bos_token());
  } else {
    EXPECT_EQ(tok->TokenToId("<|endoftext|>"), v - 3);
    EXPECT_EQ(tok->TokenToId("<|im_start|>"), v - 2);
    EXPECT_EQ(tok->TokenToId("<|im_end|>"), v - 1);
    EXPECT_EQ(tok->bos_token_id(), v - 3);
    EXPECT_EQ(tok->eos_token_id(), v - 1);
    EXPECT_FALSE(tok->adds_bos_token());
  }
  EXPECT_TRUE(tok->IsSpecial(v - 1));
  // Below the arch's specials: reserved special tokens, then the learned merges.
  const int first_arch_special = v - (c.arch == Arch::kLlama ? 5 : 3);
  const std::string below = tok->TokenString(first_arch_special - 1);
  if (below.rfind("<|reserved_special_token_", 0) == 0) {
    EXPECT_TRUE(tok->IsSpecial(first_arch_special - 1));
    EXPECT_EQ(tok->TokenToId("<|reserved_special_token_0|>").has_value(), true);
  } else {
    EXPECT_FALSE(tok->IsSpecial(first_arch_special - 1)) << below;
  }
  EXPECT_FALSE(tok->IsSpecial(256));
  EXPECT_FALSE(tok->IsSpecial(65));
  EXPECT_EQ(tok->TokenString(65), "A");
  // Every id up to vocab_size - 1 is a token.
  for (int id = 0; id < v; id += std::max(1, v / 997)) {
    EXPECT_TRUE(tok->TokenBytes(id).ok()) << id;
  }
}

TEST_P(SyntheticTokenizerTest, RoundTripsAndCompressesEnglish) {
  const ArchCase c = GetParam();
  const Tokenizer* tok = WriteAndLoad(c.arch, c.vocab_size);
  ASSERT_NE(tok, nullptr);
  const std::string english =
      "The model reads the prompt and writes an answer one token at a time. Please tell me "
      "the history of the town and the people who lived there, and how they made their bread.";
  const std::vector<int32_t> ids = tok->Encode(english);
  EXPECT_LT(ids.size(), english.size()) << "the learned merges should compress English";
  if (c.vocab_size >= 1000) {
    EXPECT_LT(ids.size(), english.size() / 2);
  }
  auto decoded = tok->Decode(ids);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, english);

  std::mt19937 rng(7);
  const std::string alphabet = "ab \n\t1.,'Z";
  for (int i = 0; i < 200; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 40);
    for (int j = 0; j < len; ++j) s += alphabet[rng() % alphabet.size()];
    if (rng() % 4 == 0) s += "日本語 😀 <|im_end|><|eot_id|>";
    auto back = tok->Decode(tok->Encode(s));
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(*back, s);
  }
}

TEST_P(SyntheticTokenizerTest, SpecialTokensInTextAndChatTemplate) {
  const ArchCase c = GetParam();
  const Tokenizer* tok = WriteAndLoad(c.arch, c.vocab_size);
  ASSERT_NE(tok, nullptr);
  const std::vector<ChatMessage> messages = {{"user", "Hi there"}};
  ASSERT_NE(tok->chat_template(), nullptr);
  auto prompt = tok->ApplyChatTemplate(ChatInput::FromMessages(messages, true));
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  const std::vector<int32_t> ids = tok->Encode(*prompt);
  ASSERT_FALSE(ids.empty());
  const int v = c.vocab_size;
  if (c.arch == Arch::kLlama) {
    EXPECT_EQ(*prompt,
              "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    EXPECT_EQ(ids.front(), v - 5);
  } else {
    EXPECT_EQ(*prompt, "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(ids.front(), v - 2);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), v - 1), 1);
  }
  auto skipped = tok->Decode(ids, /*skip_special=*/true);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(skipped->find("<|"), std::string::npos) << *skipped;
}

INSTANTIATE_TEST_SUITE_P(Archs, SyntheticTokenizerTest,
                         ::testing::Values(ArchCase{Arch::kQwen3, 20000},
                                           ArchCase{Arch::kQwen2, 1000},
                                           ArchCase{Arch::kLlama, 32000},
                                           ArchCase{Arch::kLlama, 300}));

// Qwen3-0.6B's vocabulary size: ~148k reserved added tokens. Written and loaded once (ctest runs
// each test in its own process).
TEST(SyntheticTokenizer, Qwen3FullSizeVocab) {
  const int v = 151936;
  const Tokenizer* tok = WriteAndLoad(Arch::kQwen3, v);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), v);
  EXPECT_EQ(tok->TokenToId("<|endoftext|>"), v - 3);
  EXPECT_EQ(tok->TokenToId("<|im_start|>"), v - 2);
  EXPECT_EQ(tok->TokenToId("<|im_end|>"), v - 1);
  EXPECT_EQ(tok->bos_token_id(), v - 3);
  EXPECT_EQ(tok->eos_token_id(), v - 1);
  EXPECT_TRUE(tok->IsSpecial(v - 4));
  const std::string text =
      "<|im_start|>user\nHello there, how are you?<|reserved_special_token_7|><|im_end|>\n";
  const std::vector<int32_t> ids = tok->Encode(text);
  EXPECT_EQ(ids.front(), v - 2);
  EXPECT_EQ(ids.back(), tok->TokenToId("\u010a").value_or(-1));  // "\n" as byte token "Ċ"
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok->TokenToId("<|reserved_special_token_7|>")), 1);
  EXPECT_EQ(tok->Decode(ids).value(), text);
}

TEST(SyntheticTokenizer, RefusesTooSmallVocab) {
  ScratchDir dir("synthetic_small");
  Status s = WriteSyntheticTokenizer(dir.path(), Arch::kLlama, 261);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at least 262"), std::string::npos) << s.message();
  EXPECT_TRUE(WriteSyntheticTokenizer(dir.path(), Arch::kLlama, 262).ok());
  EXPECT_EQ(WriteSyntheticTokenizer(dir.path(), Arch::kQwen2, 259).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(WriteSyntheticTokenizer(dir.path(), Arch::kQwen2, 260).ok());
  auto tok = Tokenizer::Load(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 260);
  EXPECT_EQ((*tok)->TokenToId("<|im_end|>"), 259);
}

TEST(SyntheticTokenizer, IsDeterministic) {
  ScratchDir a("synthetic_det_a");
  ScratchDir b("synthetic_det_b");
  ASSERT_TRUE(WriteSyntheticTokenizer(a.path(), Arch::kQwen3, 5000).ok());
  ASSERT_TRUE(WriteSyntheticTokenizer(b.path(), Arch::kQwen3, 5000).ok());
  auto ta = ReadFileToString(a.path() + "/tokenizer.json");
  auto tb = ReadFileToString(b.path() + "/tokenizer.json");
  ASSERT_TRUE(ta.ok() && tb.ok());
  EXPECT_EQ(*ta, *tb);
}

}  // namespace
}  // namespace pd::model
