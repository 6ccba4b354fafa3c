// The pre-tokenizer split regexes against pieces worked out by hand from HF's definitions.
#include "model/tokenizer_regex.h"

#include <gtest/gtest.h>

#include "model/tokenizer_pretok.h"

namespace pd::model::internal {
namespace {

using Pieces = std::vector<std::string>;

Pieces SplitWith(std::string_view pattern, std::string_view text) {
  auto splitter = RegexSplitter::Create(pattern);
  EXPECT_TRUE(splitter.ok()) << splitter.status().ToString();
  if (!splitter.ok()) return {};
  std::vector<std::string_view> views;
  (*splitter)->Split(text, &views);
  return Pieces(views.begin(), views.end());
}

TEST(SplitRegex, Gpt2) {
  const auto p = kGpt2SplitPattern;
  EXPECT_EQ(SplitWith(p, "Hello world's  123 ...\n\n x"),
            (Pieces{"Hello", " world", "'s", " ", " 123", " ...", "\n\n", " x"}));
  EXPECT_EQ(SplitWith(p, "HELLO'S"), (Pieces{"HELLO", "'", "S"}));  // contractions: lower only
  EXPECT_EQ(SplitWith(p, "we'll 12345"), (Pieces{"we", "'ll", " 12345"}));
  EXPECT_EQ(SplitWith(p, "héllo 世界 😀!"), (Pieces{"héllo", " 世界", " 😀!"}));
  EXPECT_EQ(SplitWith(p, "a  \n"), (Pieces{"a", "  \n"}));
  EXPECT_EQ(SplitWith(p, "x\t\ty"), (Pieces{"x", "\t", "\t", "y"}));  // only " " prefixes words
  EXPECT_EQ(SplitWith(p, ""), Pieces{});
}

TEST(SplitRegex, Llama3) {
  const auto p = kLlama3SplitPattern;
  EXPECT_EQ(SplitWith(p, "Hello world's  123 ...\n\n x"),
            (Pieces{"Hello", " world", "'s", " ", " ", "123", " ...\n\n", " x"}));
  EXPECT_EQ(SplitWith(p, "HELLO'S"), (Pieces{"HELLO", "'S"}));  // (?i:...) contractions
  EXPECT_EQ(SplitWith(p, "12345"), (Pieces{"123", "45"}));
  EXPECT_EQ(SplitWith(p, "héllo 世界 😀!"), (Pieces{"héllo", " 世界", " 😀!"}));
  EXPECT_EQ(SplitWith(p, "\t\tfoo"), (Pieces{"\t", "\tfoo"}));
  EXPECT_EQ(SplitWith(p, "a\r\nb"), (Pieces{"a", "\r\n", "b"}));
  EXPECT_EQ(SplitWith(p, "x  \n\n  y"), (Pieces{"x", "  \n\n", " ", " y"}));
  EXPECT_EQ(SplitWith(p, "(foo);"), (Pieces{"(foo", ");"}));
  EXPECT_EQ(SplitWith(p, "end.  "), (Pieces{"end", ".", "  "}));
}

TEST(SplitRegex, Qwen2) {
  const auto p = kQwen2SplitPattern;
  EXPECT_EQ(SplitWith(p, "Hello world's  123 ...\n\n x"),
            (Pieces{"Hello", " world", "'s", " ", " ", "1", "2", "3", " ...\n\n", " x"}));
  EXPECT_EQ(SplitWith(p, "v1.25"), (Pieces{"v", "1", ".", "2", "5"}));
  EXPECT_EQ(SplitWith(p, "I'M"), (Pieces{"I", "'M"}));
}

TEST(SplitRegex, InvalidUtf8LandsInGaps) {
  // 0xFF never matches; the pieces still concatenate to the input.
  const std::string text = "ab\xff\xfe cd";
  const Pieces pieces = SplitWith(kLlama3SplitPattern, text);
  std::string joined;
  for (const auto& piece : pieces) joined += piece;
  EXPECT_EQ(joined, text);
  EXPECT_EQ(pieces.front(), "ab");
  EXPECT_EQ(pieces.back(), " cd");
}

TEST(SplitRegex, EmptyMatchesCutNothing) {
  EXPECT_EQ(SplitWith("x*", "abxxcx"), (Pieces{"ab", "xx", "c", "x"}));
  EXPECT_EQ(SplitWith("(?=b)", "abab"), (Pieces{"abab"}));
}

TEST(SplitRegex, InvalidPatternIsAnError) {
  auto bad = RegexSplitter::Create("(unclosed");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("(unclosed"), std::string::npos);
  EXPECT_NE(bad.status().message().find("offset"), std::string::npos);
}

TEST(PreTokenizer, ByteLevelPrefixSpaceAndSequences) {
  auto words_of = [](const nlohmann::json& node, std::string_view text) {
    auto pre = PreTokenizer::FromJson(node, "tokenizer.json");
    EXPECT_TRUE(pre.ok()) << pre.status().ToString();
    Pieces words;
    if (pre.ok()) pre->Apply(text, &words);
    return words;
  };
  EXPECT_EQ(words_of({{"type", "ByteLevel"}, {"add_prefix_space", true}}, "hi there"),
            (Pieces{" hi", " there"}));
  EXPECT_EQ(words_of({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}},
                     "hi there"),
            (Pieces{"hi there"}));
  EXPECT_EQ(words_of(nullptr, "hi there"), (Pieces{"hi there"}));
  const nlohmann::json digits = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Digits"}, {"individual_digits", true}},
        {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Isolated"}}}}};
  EXPECT_EQ(words_of(digits, "a12-b"), (Pieces{"a", "1", "2", "-", "b"}));
}

TEST(PreTokenizer, RefusesUnsupportedSteps) {
  const std::vector<nlohmann::json> bad = {
      {{"type", "Whitespace"}},
      {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "Removed"}},
      {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"invert", true}},
      {{"type", "Split"}, {"behavior", "Isolated"}},
      {{"type", "Sequence"}},
      {{"type", "Split"}, {"pattern", {{"Regex", "[a-"}}}, {"behavior", "Isolated"}},
  };
  for (const auto& node : bad) {
    auto pre = PreTokenizer::FromJson(node, "tok.json");
    ASSERT_FALSE(pre.ok()) << node.dump();
    EXPECT_EQ(pre.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(pre.status().message().rfind("tok.json: pre_tokenizer", 0), 0u)
        << pre.status().message();
  }
}

}  // namespace
}  // namespace pd::model::internal
