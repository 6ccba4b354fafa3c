// qwen3_moe and deepseek_v3 config.json parsing: the published configs of Qwen3-30B-A3B and
// DeepSeek-V3, defaults, every refusal (naming the field and the value), and the round trip through
// ModelConfigToJson.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace pd::model {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// Qwen/Qwen3-30B-A3B's config.json as published.
const char kQwen3_30B_A3B[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// deepseek-ai/DeepSeek-V3's config.json as published (its weights are fp8, hence
// quantization_config).
const char kDeepSeekV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoConfig": "configuration_deepseek.DeepseekV3Config",
    "AutoModel": "modeling_deepseek.DeepseekV3Model",
    "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"
  },
  "aux_loss_alpha": 0.001,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "pretraining_tp": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128]
  },
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 129280
})";

Result<ModelConfig> Parse(const Json& j) { return ParseModelConfig(j.dump(), "m/config.json"); }

std::string ErrorOf(const Json& j) {
  auto r = Parse(j);
  return r.ok() ? "" : r.status().message();
}

// DeepSeek-V3's config as a bf16 conversion has it: without quantization_config.
Json DeepSeekV3Bf16() {
  Json j = Json::parse(kDeepSeekV3);
  j.erase("quantization_config");
  return j;
}

TEST(MoeConfigTest, Qwen3_30B_A3B) {
  auto c = ParseModelConfig(kQwen3_30B_A3B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Arch::kQwen3Moe);
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->num_layers, 48);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->is_mla());
  EXPECT_TRUE(c->is_moe());
  EXPECT_EQ(c->moe.num_experts, 128);
  EXPECT_EQ(c->moe.num_experts_per_tok, 8);
  EXPECT_EQ(c->moe.moe_intermediate_size, 768);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->moe.scoring, MoeConfig::Scoring::kSoftmax);
  EXPECT_EQ(c->moe.decoder_sparse_step, 1);
  EXPECT_TRUE(c->moe.mlp_only_layers.empty());
  EXPECT_FALSE(c->yarn);
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_EQ(c->eos_token_id, 151645);
  for (int layer : {0, 1, 47}) EXPECT_TRUE(c->IsMoeLayer(layer)) << layer;
}

TEST(MoeConfigTest, DeepSeekV3) {
  // The published config is fp8 (128x128 blocks, dynamic activations): read as such; other
  // block sizes are refused, naming quantization_config.
  auto fp8 = ParseModelConfig(kDeepSeekV3, "config.json");
  ASSERT_TRUE(fp8.ok()) << fp8.status().ToString();
  EXPECT_TRUE(fp8->fp8.enabled);
  nlohmann::json blocks = nlohmann::json::parse(kDeepSeekV3);
  blocks["quantization_config"]["weight_block_size"] = {64, 64};
  auto refused = ParseModelConfig(blocks.dump(), "config.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(refused.status().message(), HasSubstr("config.json: quantization_config {"));
  EXPECT_THAT(refused.status().message(), HasSubstr("weight_block_size [64,64]"));

  auto c = Parse(DeepSeekV3Bf16());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Arch::kDeepseekV3);
  EXPECT_EQ(c->hidden_size, 7168);
  EXPECT_EQ(c->num_layers, 61);
  EXPECT_EQ(c->num_heads, 128);
  EXPECT_EQ(c->num_kv_heads, 128);
  EXPECT_EQ(c->head_dim, 64);  // qk_rope_head_dim, as DeepseekV3Config sets it
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->is_mla());
  EXPECT_EQ(c->mla.q_lora_rank, 1536);
  EXPECT_EQ(c->mla.kv_lora_rank, 512);
  EXPECT_EQ(c->mla.qk_nope_head_dim, 128);
  EXPECT_EQ(c->mla.qk_rope_head_dim, 64);
  EXPECT_EQ(c->mla.v_head_dim, 128);
  EXPECT_EQ(c->mla.qk_head_dim(), 192);
  EXPECT_EQ(c->mla.latent_dim(), 576);
  EXPECT_TRUE(c->mla.rope_interleave);  // absent: transformers' default
  const MoeConfig& m = c->moe;
  EXPECT_EQ(m.num_experts, 256);
  EXPECT_EQ(m.num_experts_per_tok, 8);
  EXPECT_EQ(m.moe_intermediate_size, 2048);
  EXPECT_EQ(m.n_shared_experts, 1);
  EXPECT_EQ(m.n_group, 8);
  EXPECT_EQ(m.topk_group, 4);
  EXPECT_EQ(m.scoring, MoeConfig::Scoring::kSigmoid);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_EQ(m.routed_scaling_factor, 2.5);
  EXPECT_EQ(m.first_k_dense_replace, 3);
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  ASSERT_TRUE(c->yarn);
  EXPECT_EQ(c->yarn_scaling.factor, 40.0);
  EXPECT_EQ(c->yarn_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c->yarn_scaling.beta_fast, 32.0);
  EXPECT_EQ(c->yarn_scaling.beta_slow, 1.0);
  EXPECT_EQ(c->yarn_scaling.mscale, 1.0);
  EXPECT_EQ(c->yarn_scaling.mscale_all_dim, 1.0);
  EXPECT_EQ(c->yarn_scaling.attention_factor, 0.0);  // absent
  EXPECT_TRUE(c->yarn_scaling.truncate);
  EXPECT_EQ(c->max_position_embeddings, 163840);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->bos_token_id, 0);
  EXPECT_EQ(c->eos_token_id, 1);
  EXPECT_FALSE(c->IsMoeLayer(2));
  EXPECT_TRUE(c->IsMoeLayer(3));
  EXPECT_TRUE(c->IsMoeLayer(60));
  EXPECT_TRUE(c->IsMoeLayer(61));  // the MTP layer's block is MoE too
}

TEST(MoeConfigTest, DeepSeekV3Defaults) {
  Json j = DeepSeekV3Bf16();
  for (const char* key :
       {"n_shared_experts", "n_group", "topk_group", "first_k_dense_replace",
        "routed_scaling_factor", "norm_topk_prob", "topk_method", "scoring_func", "moe_layer_freq",
        "num_nextn_predict_layers", "rope_scaling", "bos_token_id", "eos_token_id",
        "num_key_value_heads", "max_position_embeddings"}) {
    j.erase(key);
  }
  j["q_lora_rank"] = nullptr;  // a plain q_proj, as DeepSeek-V2-Lite has
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->mla.q_lora_rank, 0);
  EXPECT_EQ(c->moe.n_shared_experts, 1);
  EXPECT_EQ(c->moe.n_group, 8);
  EXPECT_EQ(c->moe.topk_group, 4);
  EXPECT_EQ(c->moe.first_k_dense_replace, 3);
  EXPECT_EQ(c->moe.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->num_nextn_predict_layers, 0);
  EXPECT_FALSE(c->yarn);
  EXPECT_EQ(c->bos_token_id, 0);
  EXPECT_EQ(c->eos_token_id, 1);
  EXPECT_EQ(c->num_kv_heads, 128);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  // "rope_type" is read as "type" is.
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8}};
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->yarn);
  EXPECT_EQ(c->yarn_scaling.factor, 8.0);
  EXPECT_EQ(c->yarn_scaling.original_max_position_embeddings, 0);
  EXPECT_EQ(c->yarn_scaling.beta_fast, 32.0);
  EXPECT_EQ(c->yarn_scaling.beta_slow, 1.0);
}

TEST(MoeConfigTest, Qwen3MoeDefaultsAndSparseLayers) {
  Json j = Json::parse(kQwen3_30B_A3B);
  for (const char* key : {"head_dim", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"})
    j.erase(key);
  j["num_hidden_layers"] = 6;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->head_dim, 64);  // hidden / heads: Qwen3MoeConfig has no head_dim default
  EXPECT_FALSE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->moe.decoder_sparse_step, 1);
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<bool> sparse;
  for (int i = 0; i < 6; ++i) sparse.push_back(c->IsMoeLayer(i));
  EXPECT_EQ(sparse, (std::vector<bool>{false, true, false, false, false, true}));
}

TEST(MoeConfigTest, RoundTripsThroughModelConfigToJson) {
  for (const Json& j : {Json::parse(kQwen3_30B_A3B), DeepSeekV3Bf16()}) {
    auto c = Parse(j);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const std::string text = ModelConfigToJson(*c);
    auto back = ParseModelConfig(text, "again");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(ModelConfigToJson(*back), text);
    // Every key HF's config.json has that changes the computation is written under its HF name.
    Json written = Json::parse(text);
    for (const auto& [key, value] : j.items()) {
      if (key == "auto_map" || key == "transformers_version") continue;
      ASSERT_TRUE(written.contains(key)) << key;
      if (value.is_number()) {
        EXPECT_EQ(written[key].get<double>(), value.get<double>()) << key;
      } else if (key == "rope_scaling" && value.is_object()) {
        for (const auto& [k, v] : value.items()) EXPECT_EQ(written[key][k], v) << key << "." << k;
      } else {
        EXPECT_EQ(written[key], value) << key;
      }
    }
  }
  // q_lora_rank 0 is written as null, and no yarn as rope_scaling null.
  Json j = DeepSeekV3Bf16();
  j["q_lora_rank"] = nullptr;
  j["rope_scaling"] = nullptr;
  Json written = Json::parse(ModelConfigToJson(*Parse(j)));
  EXPECT_TRUE(written["q_lora_rank"].is_null());
  EXPECT_TRUE(written["rope_scaling"].is_null());
  EXPECT_EQ(written["architectures"], Json::array({"DeepseekV3ForCausalLM"}));
}

struct Refusal {
  const char* arch;  // "qwen3_moe" or "deepseek_v3"
  const char* key;   // top-level key, or "rope_scaling.KEY"
  Json value;
  const char* message;
};

class MoeRefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(MoeRefusalTest, NamesTheFieldAndTheValue) {
  const Refusal& r = GetParam();
  Json j = std::string(r.arch) == "qwen3_moe" ? Json::parse(kQwen3_30B_A3B) : DeepSeekV3Bf16();
  std::string key = r.key;
  if (key.rfind("rope_scaling.", 0) == 0) {
    j["rope_scaling"][key.substr(13)] = r.value;
  } else if (r.value.is_discarded()) {
    j.erase(key);
  } else {
    j[key] = r.value;
  }
  EXPECT_THAT(ErrorOf(j), HasSubstr(std::string("m/config.json: ") + r.message));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, MoeRefusalTest,
    ::testing::Values(
        Refusal{"deepseek_v3", "scoring_func", "softmax",
                "scoring_func \"softmax\" is not supported for deepseek_v3 (only \"sigmoid\")"},
        Refusal{"deepseek_v3", "topk_method", "greedy",
                "topk_method \"greedy\" is not supported for deepseek_v3 (only \"noaux_tc\")"},
        Refusal{"deepseek_v3", "moe_layer_freq", 2,
                "moe_layer_freq 2 is not supported for deepseek_v3 (only 1)"},
        Refusal{"deepseek_v3", "rope_scaling.type", "dynamic",
                "rope_scaling.type \"dynamic\" is not supported for deepseek_v3 (only \"yarn\")"},
        Refusal{"deepseek_v3", "rope_scaling.rope_type", "linear",
                "rope_scaling.rope_type \"linear\" is not supported for deepseek_v3"},
        Refusal{"deepseek_v3", "rope_scaling.low_freq_factor", 1.0,
                "rope_scaling.low_freq_factor 1.0 is not supported"},
        Refusal{"deepseek_v3", "rope_scaling.factor", 0.5,
                "rope_scaling.factor must be at least 1, found 0.5"},
        Refusal{"deepseek_v3", "rope_scaling.factor", "big",
                "rope_scaling.factor must be a number, found \"big\""},
        Refusal{"deepseek_v3", "rope_scaling.beta_slow", 0,
                "rope_scaling.beta_slow must be positive, found 0.0"},
        Refusal{"deepseek_v3", "rope_scaling", 4, "rope_scaling must be an object or null"},
        Refusal{"deepseek_v3", "attention_bias", true,
                "attention_bias true is not supported for deepseek_v3"},
        Refusal{"deepseek_v3", "q_lora_rank", Json::value_t::discarded,
                "missing required field q_lora_rank"},
        Refusal{"deepseek_v3", "q_lora_rank", -4, "q_lora_rank must be positive or null, found -4"},
        Refusal{"deepseek_v3", "kv_lora_rank", 0, "kv_lora_rank must be positive, found 0"},
        Refusal{"deepseek_v3", "qk_rope_head_dim", 63, "qk_rope_head_dim (63) must be even"},
        Refusal{"deepseek_v3", "qk_nope_head_dim", -1, "qk_nope_head_dim must be positive"},
        Refusal{"deepseek_v3", "v_head_dim", 0, "v_head_dim must be positive"},
        Refusal{"deepseek_v3", "n_routed_experts", 250,
                "n_routed_experts (250) must be a multiple of n_group (8)"},
        Refusal{"deepseek_v3", "n_group", 256, "n_routed_experts / n_group (256 / 256)"},
        Refusal{"deepseek_v3", "topk_group", 9, "topk_group (9) must not exceed n_group (8)"},
        Refusal{"deepseek_v3", "num_experts_per_tok", 257,
                "num_experts_per_tok (257) must not exceed n_routed_experts (256)"},
        Refusal{"deepseek_v3", "n_shared_experts", -1, "n_shared_experts must not be negative"},
        Refusal{"deepseek_v3", "first_k_dense_replace", -1,
                "first_k_dense_replace must not be negative"},
        Refusal{"deepseek_v3", "routed_scaling_factor", 0,
                "routed_scaling_factor must be positive"},
        Refusal{"deepseek_v3", "num_nextn_predict_layers", -1,
                "num_nextn_predict_layers must not be negative"},
        Refusal{"deepseek_v3", "n_routed_experts", Json::value_t::discarded,
                "missing required field n_routed_experts"},
        Refusal{"qwen3_moe", "rope_scaling", Json{{"rope_type", "yarn"}, {"factor", 4.0}},
                "rope_scaling {\"factor\":4.0,\"rope_type\":\"yarn\"} is not supported for "
                "qwen3_moe"},
        Refusal{"qwen3_moe", "num_experts", 0, "num_experts must be positive, found 0"},
        Refusal{"qwen3_moe", "num_experts_per_tok", 129,
                "num_experts_per_tok (129) must not exceed num_experts (128)"},
        Refusal{"qwen3_moe", "moe_intermediate_size", 0, "moe_intermediate_size must be positive"},
        Refusal{"qwen3_moe", "decoder_sparse_step", 0, "decoder_sparse_step must be positive"},
        Refusal{"qwen3_moe", "mlp_only_layers", Json::array({0, 48}),
                "mlp_only_layers holds 48, outside the layers [0, 48)"},
        Refusal{"qwen3_moe", "mlp_only_layers", "all",
                "mlp_only_layers must be a list of integers, found \"all\""},
        Refusal{"qwen3_moe", "norm_topk_prob", 1, "norm_topk_prob must be true or false, found 1"},
        Refusal{"qwen3_moe", "num_experts", Json::value_t::discarded,
                "missing required field num_experts"}),
    [](const auto& info) {
      std::string name =
          std::string(info.param.arch) + "_" + info.param.key + "_" + std::to_string(info.index);
      for (char& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name;
    });

// transformers v5 writes RoPE as one rope_parameters object, rope_theta included.
TEST(MoeConfigTest, RopeParametersAsTransformersV5WritesThem) {
  Json j = DeepSeekV3Bf16();
  Json rope = j["rope_scaling"];
  rope.erase("type");
  rope["rope_type"] = "yarn";
  rope["rope_theta"] = 50000.0;
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = rope;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->yarn);
  EXPECT_EQ(c->yarn_scaling.factor, 40.0);
  EXPECT_EQ(c->yarn_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c->rope_theta, 50000.0);
  j["rope_parameters"]["factor"] = 0.5;
  EXPECT_THAT(ErrorOf(j),
              HasSubstr("m/config.json: rope_parameters.factor must be at least 1, found 0.5"));
  j["rope_parameters"]["rope_type"] = "linear";
  EXPECT_THAT(ErrorOf(j), HasSubstr("m/config.json: rope_parameters.rope_type \"linear\" is not "
                                    "supported for deepseek_v3"));
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 20000}};
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->yarn);
  EXPECT_EQ(c->rope_theta, 20000.0);

  Json q = Json::parse(kQwen3_30B_A3B);
  q.erase("rope_scaling");
  q.erase("rope_theta");
  q["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  auto qc = Parse(q);
  ASSERT_TRUE(qc.ok()) << qc.status().ToString();
  EXPECT_EQ(qc->rope_theta, 1e6);
  q["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1e6}};
  EXPECT_THAT(ErrorOf(q), HasSubstr("m/config.json: rope_parameters {"));
  EXPECT_THAT(ErrorOf(q), HasSubstr("is not supported for qwen3_moe (only plain RoPE)"));
}

TEST(MoeConfigTest, ExpertsPerTokenFitTheEligibleGroups) {
  Json j = DeepSeekV3Bf16();
  j["topk_group"] = 1;  // 1 group of 32 experts eligible: 8 fit
  EXPECT_TRUE(Parse(j).ok());
  j["n_group"] = 64;  // 4 experts per group, 1 group eligible: 8 do not fit
  EXPECT_THAT(ErrorOf(j), HasSubstr("num_experts_per_tok (8) must not exceed topk_group x experts "
                                    "per group (4)"));
}

TEST(MoeConfigTest, ArchNamesParse) {
  EXPECT_EQ(*ParseArch("qwen3_moe"), Arch::kQwen3Moe);
  EXPECT_EQ(*ParseArch("deepseek_v3"), Arch::kDeepseekV3);
  EXPECT_EQ(ArchName(Arch::kQwen3Moe), "qwen3_moe");
  EXPECT_EQ(ArchName(Arch::kDeepseekV3), "deepseek_v3");
  EXPECT_THAT(ParseArch("mixtral").status().message(),
              HasSubstr("llama, qwen2, qwen3, qwen3_moe or deepseek_v3"));
}

}  // namespace
}  // namespace pd::model
