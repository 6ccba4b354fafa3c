// Each kind of bad tokenizer.json / tokenizer_config.json is refused with an InvalidArgument
// naming the file and the offending entry.
#include <gtest/gtest.h>

#include "common/file_util.h"
#include "model/tokenizer.h"
#include "model/tokenizer_testing.h"

namespace pd::model {
namespace {

using testing::ScratchDir;
using testing::SmallTokenizer;

// Expects FromJson(root) to fail with InvalidArgument whose message contains every fragment.
void ExpectRefused(const std::string& text, const std::vector<std::string>& fragments) {
  auto tok = Tokenizer::FromJson(text, "/models/x/tokenizer.json");
  ASSERT_FALSE(tok.ok()) << "accepted: " << text.substr(0, 200);
  EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument) << tok.status().ToString();
  const std::string& message = tok.status().message();
  EXPECT_EQ(message.rfind("/models/x/tokenizer.json: ", 0), 0u) << message;
  for (const auto& fragment : fragments) {
    EXPECT_NE(message.find(fragment), std::string::npos)
        << "missing '" << fragment << "' in: " << message;
  }
}

TEST(TokenizerErrors, MalformedJson) {
  ExpectRefused("{\"model\": {", {"malformed JSON"});
  ExpectRefused("", {"malformed JSON"});
  ExpectRefused("[1, 2]", {"not a JSON object"});
}

TEST(TokenizerErrors, MissingModelOrVocab) {
  auto root = SmallTokenizer();
  root.erase("model");
  ExpectRefused(root.dump(), {"'model' is missing"});
  root = SmallTokenizer();
  root["model"].erase("vocab");
  ExpectRefused(root.dump(), {"model.vocab is missing"});
  root["model"]["vocab"] = nlohmann::json::object();
  ExpectRefused(root.dump(), {"model.vocab is empty"});
  root = SmallTokenizer();
  root["model"]["vocab"]["bad"] = "seven";
  ExpectRefused(root.dump(), {"model.vocab['bad']", "not an integer"});
}

TEST(TokenizerErrors, UnsupportedModelType) {
  auto root = SmallTokenizer();
  root["model"]["type"] = "Unigram";
  ExpectRefused(root.dump(), {"model.type 'Unigram' is not supported (byte-level BPE only)"});
  root["model"]["type"] = "WordPiece";
  ExpectRefused(root.dump(), {"model.type 'WordPiece' is not supported"});
  root = SmallTokenizer();
  root["model"]["continuing_subword_prefix"] = "##";
  ExpectRefused(root.dump(), {"continuing_subword_prefix"});
}

TEST(TokenizerErrors, VocabWithoutAllByteTokens) {
  auto root = SmallTokenizer();
  root["model"]["vocab"].erase("Ċ");  // the newline byte
  ExpectRefused(root.dump(), {"byte 0x0A", "'Ċ'", "all 256 byte tokens"});
}

TEST(TokenizerErrors, MergeNamingAnUnknownToken) {
  auto root = SmallTokenizer();
  root["model"]["merges"].push_back("he zz");
  ExpectRefused(root.dump(), {"model.merges[8] 'he zz'", "token 'zz' is not in model.vocab"});
  root = SmallTokenizer(/*merges_as_pairs=*/true);
  root["model"]["merges"][2] = {"qq", "ll"};
  ExpectRefused(root.dump(), {"model.merges[2]", "token 'qq' is not in model.vocab"});
}

TEST(TokenizerErrors, MergeWhoseResultIsNotInVocab) {
  auto root = SmallTokenizer();
  root["model"]["merges"].push_back("x y");
  ExpectRefused(root.dump(), {"model.merges[8] 'x y'", "merged token 'xy' is not in model.vocab"});
}

TEST(TokenizerErrors, MalformedMergeEntry) {
  auto root = SmallTokenizer();
  root["model"]["merges"].push_back("abc");
  ExpectRefused(root.dump(), {"model.merges[8] 'abc'", "expected \"left right\""});
  root = SmallTokenizer();
  root["model"]["merges"].push_back(42);
  ExpectRefused(root.dump(), {"model.merges[8] 42"});
}

TEST(TokenizerErrors, DuplicateIds) {
  auto root = SmallTokenizer();
  root["model"]["vocab"]["dup"] = 259;  // "hello" has 259
  ExpectRefused(root.dump(), {"duplicate id 259", "'dup'", "'hello'"});
}

TEST(TokenizerErrors, AddedTokenConflictingWithVocab) {
  auto root = SmallTokenizer();
  root["added_tokens"].push_back({{"id", 259}, {"content", "<|x|>"}, {"special", true}});
  ExpectRefused(root.dump(),
                {"added_tokens[3] '<|x|>' (id 259)", "already 'hello' in model.vocab"});
  root = SmallTokenizer();
  root["added_tokens"].push_back({{"id", 500}, {"content", "hello"}});
  ExpectRefused(root.dump(), {"added_tokens[3] 'hello' (id 500)", "already has id 259"});
  root = SmallTokenizer();
  root["added_tokens"].push_back({{"id", 264}, {"content", "<|other|>"}});
  ExpectRefused(root.dump(), {"added_tokens[3]", "already '<|end|>' in added_tokens"});
  root = SmallTokenizer();
  root["added_tokens"].push_back({{"id", 501}, {"content", ""}});
  ExpectRefused(root.dump(), {"added_tokens[3]", "content is empty"});
  root = SmallTokenizer();
  root["added_tokens"].push_back({{"content", "<|no id|>"}});
  ExpectRefused(root.dump(), {"added_tokens[3]", "expected {\"id\""});
}

TEST(TokenizerErrors, SameAddedTokenInVocabIsFine) {
  // GPT-2 lists <|endoftext|> in both model.vocab and added_tokens with the same id.
  auto root = SmallTokenizer();
  root["model"]["vocab"]["<|eot|>"] = 300;
  root["added_tokens"].push_back({{"id", 300}, {"content", "<|eot|>"}, {"special", true}});
  auto tok = Tokenizer::FromJson(root.dump(), "tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->Encode("a<|eot|>"), (std::vector<int32_t>{'a', 300}));
  EXPECT_TRUE((*tok)->IsSpecial(300));
}

TEST(TokenizerErrors, InvalidRegex) {
  auto root = SmallTokenizer();
  root["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(?i:'s|\\p{L"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  ExpectRefused(root.dump(), {"pre_tokenizer.pretokenizers[0] Split pattern", "invalid regex",
                              "(?i:'s|\\p{L", "offset"});
}

TEST(TokenizerErrors, Normalizers) {
  auto root = SmallTokenizer();
  root["normalizer"] = {{"type", "NFC"}};
  EXPECT_TRUE(Tokenizer::FromJson(root.dump(), "tokenizer.json").ok());  // accepted, not applied
  root["normalizer"] = {{"type", "Lowercase"}};
  ExpectRefused(root.dump(), {"normalizer 'Lowercase' is not supported"});
}

TEST(TokenizerErrors, BadTokenizerConfig) {
  ScratchDir dir("bad_config");
  ASSERT_TRUE(WriteStringToFile(dir.path() + "/tokenizer.json", SmallTokenizer().dump()).ok());
  const std::string config_path = dir.path() + "/tokenizer_config.json";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "malformed JSON"},
      {R"({"eos_token": "<|nope|>"})", "eos_token '<|nope|>' is not a token"},
      {R"({"bos_token": 7})", "bos_token must be a string"},
  };
  for (const auto& [text, fragment] : cases) {
    ASSERT_TRUE(WriteStringToFile(config_path, text).ok());
    auto tok = Tokenizer::Load(dir.path());
    ASSERT_FALSE(tok.ok()) << text;
    EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(tok.status().message().find(config_path), std::string::npos)
        << tok.status().message();
    EXPECT_NE(tok.status().message().find(fragment), std::string::npos) << tok.status().message();
  }
}

}  // namespace
}  // namespace pd::model
