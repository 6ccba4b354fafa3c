#include "model/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace pd::model {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

Json Base(const char* model_type) {
  return Json{{"model_type", model_type}, {"vocab_size", 512},      {"hidden_size", 64},
              {"intermediate_size", 160}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
              {"num_key_value_heads", 2}};
}

Result<ModelConfig> Parse(const Json& j) { return ParseModelConfig(j.dump(), "m/config.json"); }

// The error's message, or "" when parsing succeeded.
std::string ErrorOf(const Json& j) {
  auto r = Parse(j);
  return r.ok() ? "" : r.status().message();
}

TEST(ConfigTest, LlamaDefaults) {
  Json j = Base("llama");
  j.erase("num_key_value_heads");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Arch::kLlama);
  EXPECT_EQ(c->num_kv_heads, 4);  // defaults to num_attention_heads
  EXPECT_EQ(c->head_dim, 16);     // hidden / heads
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_EQ(c->eos_token_id, -1);
  EXPECT_EQ(c->q_size(), 64);
  EXPECT_EQ(c->kv_size(), 64);
}

TEST(ConfigTest, LlamaReadsEverything) {
  Json j = Base("llama");
  j["attention_bias"] = true;
  j["head_dim"] = 32;
  j["rope_theta"] = 500000.0;
  j["rms_norm_eps"] = 1e-5;
  j["tie_word_embeddings"] = true;
  j["max_position_embeddings"] = 4096;
  j["bos_token_id"] = 1;
  j["eos_token_id"] = Json::array({7, 8, 9});
  j["torch_dtype"] = "bfloat16";
  j["rope_scaling"] = nullptr;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->q_size(), 128);
  EXPECT_EQ(c->kv_size(), 64);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_id, 7);  // first of the list
  EXPECT_EQ(c->torch_dtype, "bfloat16");
}

TEST(ConfigTest, Qwen2AlwaysHasBiases) {
  Json j = Base("qwen2");
  j["attention_bias"] = false;  // not a Qwen2 field: ignored
  j["tie_word_embeddings"] = true;
  j["eos_token_id"] = 5;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Arch::kQwen2);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->eos_token_id, 5);
}

TEST(ConfigTest, Qwen3HasQkNormAndReadsAttentionBias) {
  Json j = Base("qwen3");
  j["head_dim"] = 32;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->q_size(), 128);  // != hidden_size
  j["attention_bias"] = true;
  EXPECT_TRUE(Parse(j)->attention_bias);
  j.erase("head_dim");
  EXPECT_EQ(Parse(j)->head_dim, 128);  // Qwen3Config's default
}

TEST(ConfigTest, RoundTripsThroughModelConfigToJson) {
  for (const char* type : {"llama", "qwen2", "qwen3"}) {
    Json j = Base(type);
    j["head_dim"] = 24;
    j["tie_word_embeddings"] = true;
    j["bos_token_id"] = 3;
    j["eos_token_id"] = 4;
    j["torch_dtype"] = "float16";
    auto c = Parse(j);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::string text = ModelConfigToJson(*c);
    auto again = ParseModelConfig(text, "x");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    EXPECT_EQ(ModelConfigToJson(*again), text);
    EXPECT_EQ(again->head_dim, 24);
    EXPECT_EQ(again->attention_bias, c->attention_bias);
    Json written = Json::parse(text);
    EXPECT_EQ(written["model_type"], type);
    EXPECT_EQ(written["architectures"].size(), 1u);
  }
  ModelConfig c = *Parse(Base("qwen3"));
  EXPECT_EQ(Json::parse(ModelConfigToJson(c))["architectures"][0], "Qwen3ForCausalLM");
}

TEST(ConfigTest, ArchNames) {
  EXPECT_EQ(ArchName(Arch::kQwen2), "qwen2");
  EXPECT_EQ(*ParseArch("llama"), Arch::kLlama);
  EXPECT_FALSE(ParseArch("mistral").ok());
}

TEST(ConfigTest, ErrorNotJson) {
  auto r = ParseModelConfig("{\"model_type\": ", "m/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("m/config.json"));
  EXPECT_THAT(r.status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(ErrorOf(Json::array({1})), HasSubstr("JSON object"));
}

TEST(ConfigTest, ErrorUnknownModelType) {
  EXPECT_EQ(ErrorOf(Base("mistral")),
            "m/config.json: unsupported model_type \"mistral\" (supported: llama, qwen2, qwen3, "
            "qwen3_moe or deepseek_v3)");
  Json j = Base("llama");
  j.erase("model_type");
  EXPECT_THAT(ErrorOf(j), HasSubstr("m/config.json: missing \"model_type\""));
}

TEST(ConfigTest, ErrorKvHeadsMustDivideHeads) {
  Json j = Base("llama");
  j["num_attention_heads"] = 8;
  j["num_key_value_heads"] = 3;
  j["head_dim"] = 8;
  EXPECT_EQ(ErrorOf(j),
            "m/config.json: num_key_value_heads (3) must divide num_attention_heads (8)");
}

TEST(ConfigTest, ErrorNonPositiveSizes) {
  for (const char* key :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"}) {
    Json j = Base("qwen3");
    j["head_dim"] = 16;
    j[key] = 0;
    EXPECT_EQ(ErrorOf(j), std::string("m/config.json: ") + key + " must be positive, found 0")
        << key;
  }
  Json j = Base("llama");
  j["rms_norm_eps"] = -1.0;
  EXPECT_THAT(ErrorOf(j), HasSubstr("rms_norm_eps must be positive"));
}

TEST(ConfigTest, ErrorMissingRequiredField) {
  Json j = Base("qwen2");
  j.erase("hidden_size");
  EXPECT_EQ(ErrorOf(j), "m/config.json: missing required field hidden_size");
}

TEST(ConfigTest, ErrorWrongTypes) {
  Json j = Base("llama");
  j["hidden_size"] = "64";
  EXPECT_EQ(ErrorOf(j), "m/config.json: hidden_size must be an integer, found \"64\"");
  j = Base("llama");
  j["rope_theta"] = "big";
  EXPECT_THAT(ErrorOf(j), HasSubstr("rope_theta must be a number"));
  j = Base("llama");
  j["tie_word_embeddings"] = 1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("tie_word_embeddings must be true or false"));
  j = Base("llama");
  j["eos_token_id"] = Json::array();
  EXPECT_THAT(ErrorOf(j), HasSubstr("eos_token_id must be an integer or a list"));
  j = Base("llama");
  j["hidden_size"] = 1ll << 40;
  EXPECT_THAT(ErrorOf(j), HasSubstr("fits in 32 bits"));
}

// Integers config.json gives that used to be misread: a value above INT64_MAX wrapped to -1
// ("absent" for a token id), a list's first id was truncated to 32 bits, and num_attention_heads x
// head_dim overflowed q_size() (UBSan under fuzz/model_config_fuzz; the input is
// fuzz/corpus/model_config/regress_q_size_overflow.json).
TEST(ConfigTest, ErrorIntegersOutOfRange) {
  Json j = Base("llama");
  j["bos_token_id"] = Json(uint64_t{18446744073709551615u});
  EXPECT_EQ(ErrorOf(j),
            "m/config.json: bos_token_id must be an integer that fits in 32 bits, found "
            "18446744073709551615");
  j = Base("llama");
  j["eos_token_id"] = Json::array({4294967300ll, 2});
  EXPECT_EQ(ErrorOf(j),
            "m/config.json: eos_token_id must be an integer that fits in 32 bits, found "
            "4294967300");
  j = Base("qwen3");
  j["num_attention_heads"] = 65536;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = 65536;
  EXPECT_EQ(ErrorOf(j),
            "m/config.json: num_attention_heads (65536) x head_dim (65536) does not fit in 32 "
            "bits");
  j["head_dim"] = 32768;  // 2^31: one past INT32_MAX
  EXPECT_THAT(ErrorOf(j), HasSubstr("does not fit in 32 bits"));
  j["head_dim"] = 16384;
  EXPECT_EQ(ErrorOf(j), "");
}

TEST(ConfigTest, ErrorHeadDimUnderivable) {
  Json j = Base("llama");
  j["num_attention_heads"] = 6;
  j["num_key_value_heads"] = 2;
  EXPECT_THAT(ErrorOf(j),
              HasSubstr("hidden_size (64) must be a multiple of num_attention_heads (6)"));
  j["head_dim"] = 7;
  EXPECT_THAT(ErrorOf(j), HasSubstr("head_dim (7) must be even"));
}

TEST(ConfigTest, ErrorTokenIdOutsideVocab) {
  Json j = Base("qwen2");
  j["eos_token_id"] = 512;
  EXPECT_THAT(ErrorOf(j), HasSubstr("token id 512"));
}

TEST(ConfigTest, ErrorUnsupportedFeatures) {
  Json j = Base("llama");
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  auto r = Parse(j);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(r.status().message(), HasSubstr("rope_scaling"));
  j = Base("qwen2");
  j["hidden_act"] = "gelu";
  EXPECT_THAT(ErrorOf(j), HasSubstr("hidden_act \"gelu\""));
  j = Base("qwen2");
  j["use_sliding_window"] = true;
  EXPECT_THAT(ErrorOf(j), HasSubstr("use_sliding_window"));
}

TEST(ConfigTest, RopeParametersOfTransformersV5) {
  Json j = Base("llama");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_theta, 500000.0);
  j["rope_theta"] = 1000.0;  // the top-level field wins
  EXPECT_EQ(Parse(j)->rope_theta, 1000.0);
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"rope_theta", 500000.0}};
  auto r = Parse(j);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(r.status().message(), HasSubstr("m/config.json: rope_parameters {"));
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", "big"}};
  j.erase("rope_theta");
  EXPECT_THAT(ErrorOf(j), HasSubstr("rope_parameters.rope_theta must be a number"));
}

TEST(ConfigTest, LoadModelConfigNamesMissingFile) {
  auto r = LoadModelConfig("/nonexistent-dir");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent-dir/config.json"));
}

}  // namespace
}  // namespace pd::model
