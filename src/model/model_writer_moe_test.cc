// make-model's qwen3_moe and deepseek_v3 models: presets, overrides, parameter counts, and the
// tokenizer each arch gets (DeepSeek-V3's special tokens and chat template).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "model/model_writer.h"
#include "model/test_util.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace pd::model {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

SyntheticModelOptions Options(Arch arch, const std::string& dir) {
  SyntheticModelOptions o;
  o.arch = arch;
  o.out_dir = dir;
  return o;
}

TEST(MoePresetTest, TinyHasDenseAndMoeLayers) {
  for (Arch arch : {Arch::kQwen3Moe, Arch::kDeepseekV3}) {
    for (const char* preset : {"tiny", "small"}) {
      auto c = PresetConfig(arch, preset);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      int dense = 0, sparse = 0;
      for (int i = 0; i < c->num_layers; ++i) (c->IsMoeLayer(i) ? sparse : dense) += 1;
      EXPECT_GT(dense, 0) << preset;
      EXPECT_GT(sparse, 0) << preset;
      EXPECT_FALSE(c->tie_word_embeddings);
      // What the writer writes parses back to the same config.
      auto back = ParseModelConfig(ModelConfigToJson(*c), "config.json");
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_EQ(ModelConfigToJson(*back), ModelConfigToJson(*c));
    }
  }
  auto d = *PresetConfig(Arch::kDeepseekV3, "tiny");
  EXPECT_GT(d.mla.q_lora_rank, 0);
  EXPECT_TRUE(d.yarn);
  EXPECT_EQ(d.max_position_embeddings,
            d.yarn_scaling.factor * d.yarn_scaling.original_max_position_embeddings);
  EXPECT_EQ(d.num_nextn_predict_layers, 1);
  EXPECT_GT(d.moe.n_group, 1);
  EXPECT_LT(d.moe.topk_group, d.moe.n_group);
  EXPECT_EQ(d.moe.n_shared_experts, 1);
  EXPECT_EQ(d.num_kv_heads, d.num_heads);
  EXPECT_EQ(d.head_dim, d.mla.qk_rope_head_dim);
  auto q = *PresetConfig(Arch::kQwen3Moe, "tiny");
  EXPECT_TRUE(q.qk_norm);
  EXPECT_EQ(q.moe.mlp_only_layers, (std::vector<int>{1}));
  EXPECT_THAT(PresetConfig(Arch::kDeepseekV3, "qwen3-0.6b").status().message(),
              HasSubstr("unknown preset \"qwen3-0.6b\" for deepseek_v3"));
}

TEST(MoePresetTest, OneGigabytePresetsKeepTheRealProportions) {
  auto d = PresetConfig(Arch::kDeepseekV3, "deepseek-v3-1g");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->mla.kv_lora_rank, 512);
  EXPECT_EQ(d->mla.qk_rope_head_dim, 64);
  EXPECT_EQ(d->mla.qk_nope_head_dim, 128);
  EXPECT_EQ(d->mla.v_head_dim, 128);
  EXPECT_GT(d->mla.q_lora_rank, 0);
  EXPECT_EQ(d->moe.num_experts_per_tok, 8);
  EXPECT_EQ(d->moe.n_group, 8);
  EXPECT_EQ(d->moe.topk_group, 4);
  EXPECT_EQ(d->moe.n_shared_experts, 1);
  EXPECT_EQ(d->moe.first_k_dense_replace, 1);
  EXPECT_TRUE(d->yarn);
  EXPECT_EQ(d->yarn_scaling.factor, 40.0);
  EXPECT_EQ(d->yarn_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(d->max_position_embeddings, 40 * 4096);
  auto q = PresetConfig(Arch::kQwen3Moe, "qwen3-moe-1g");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->head_dim, 128);
  EXPECT_EQ(q->moe.num_experts_per_tok, 8);
  for (const ModelConfig& c : {*d, *q}) {
    EXPECT_TRUE(ParseModelConfig(ModelConfigToJson(c), "config.json").ok());
    const ParameterCounts p = CountParameters(c);
    EXPECT_GT(p.total * 2, int64_t{900} << 20) << ArchName(c.arch);  // bf16 bytes, about 1 GB
    EXPECT_LT(p.total * 2, int64_t{1200} << 20) << ArchName(c.arch);
    EXPECT_LT(p.active * 2, p.total) << ArchName(c.arch);
  }
  EXPECT_THAT(PresetConfig(Arch::kQwen3Moe, "deepseek-v3-1g").status().message(),
              HasSubstr("preset \"deepseek-v3-1g\" is for deepseek_v3, not qwen3_moe"));
  EXPECT_THAT(PresetConfig(Arch::kQwen3, "deepseek-v3-1g").status().message(),
              HasSubstr("unknown preset"));
}

TEST(MoeWriterTest, Overrides) {
  ScratchDir dir;
  SyntheticModelOptions o = Options(Arch::kDeepseekV3, dir.path());
  o.q_lora_rank = 0;
  o.yarn = false;
  o.num_nextn_predict_layers = 0;
  o.rope_interleave = false;
  o.norm_topk_prob = false;
  o.num_layers = 2;
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  auto w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const ModelConfig& c = w->config;
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  EXPECT_FALSE(c.yarn);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_FALSE(c.mla.rope_interleave);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_TRUE(w->mtp.empty());
  ASSERT_EQ(w->layers.size(), 2u);
  EXPECT_TRUE(w->layers[1].mla->q_proj.has_value());
  EXPECT_FALSE(w->layers[1].mla->q_a_proj.has_value());
  auto config = nlohmann::json::parse(*ReadFileToString(dir / "config.json"));
  EXPECT_TRUE(config["q_lora_rank"].is_null());
  EXPECT_TRUE(config["rope_scaling"].is_null());

  // qwen3_moe: fewer layers drops mlp_only_layers entries past the end.
  ScratchDir qdir;
  SyntheticModelOptions q = Options(Arch::kQwen3Moe, qdir.path());
  q.num_layers = 1;
  ASSERT_TRUE(WriteSyntheticModel(q).ok());
  auto qw = LoadModelWeights(qdir.path());
  ASSERT_TRUE(qw.ok()) << qw.status().ToString();
  EXPECT_TRUE(qw->config.moe.mlp_only_layers.empty());
}

TEST(MoeWriterTest, OverridesThatDoNotApplyAreRefused) {
  ScratchDir dir;
  SyntheticModelOptions o = Options(Arch::kQwen3Moe, dir.path());
  o.q_lora_rank = 8;
  EXPECT_THAT(WriteSyntheticModel(o).message(),
              HasSubstr("q_lora_rank applies to deepseek_v3 only, not qwen3_moe"));
  o = Options(Arch::kQwen3, dir.path());
  o.norm_topk_prob = true;
  EXPECT_THAT(WriteSyntheticModel(o).message(), HasSubstr("norm_topk_prob applies to"));
  o = Options(Arch::kDeepseekV3, dir.path());
  o.num_kv_heads = 2;
  EXPECT_THAT(WriteSyntheticModel(o).message(), HasSubstr("deepseek_v3 (MLA) has no KV heads"));
  o = Options(Arch::kDeepseekV3, dir.path());
  o.num_nextn_predict_layers = -1;
  EXPECT_THAT(WriteSyntheticModel(o).message(), HasSubstr("must not be negative"));
}

TEST(MoeWriterTest, DeterministicPerSeed) {
  ScratchDir a, b, c;
  SyntheticModelOptions o = Options(Arch::kDeepseekV3, a.path());
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  o.out_dir = b.path();
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  o.out_dir = c.path();
  o.seed = 9;
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  auto ta = ReadFileToString(a / "model.safetensors");
  EXPECT_EQ(*ta, *ReadFileToString(b / "model.safetensors"));
  EXPECT_NE(*ta, *ReadFileToString(c / "model.safetensors"));
}

// Routing must differ from token to token: over the embedding rows, the router of the first MoE
// layer (on the raw embedding, which is what it sees up to a norm) picks many expert sets.
TEST(MoeWriterTest, RoutersSpreadTokensOverExperts) {
  for (Arch arch : {Arch::kQwen3Moe, Arch::kDeepseekV3}) {
    ScratchDir dir;
    ASSERT_TRUE(WriteSyntheticModel(Options(arch, dir.path())).ok());
    auto w = LoadModelWeights(dir.path());
    ASSERT_TRUE(w.ok());
    const ModelConfig& c = w->config;
    const TensorView& router = w->layers[2].moe->router;
    std::vector<int> top_count(c.moe.num_experts, 0);
    for (int token = 0; token < 256; ++token) {
      int best = 0;
      float best_logit = -1e30f;
      for (int e = 0; e < c.moe.num_experts; ++e) {
        double logit = 0;
        for (int h = 0; h < c.hidden_size; ++h) {
          logit += double(router.At(int64_t{e} * c.hidden_size + h)) *
                   w->embed_tokens.At(int64_t{token} * c.hidden_size + h);
        }
        if (logit > best_logit) best_logit = static_cast<float>(logit), best = e;
      }
      ++top_count[best];
    }
    for (int e = 0; e < c.moe.num_experts; ++e) {
      EXPECT_GT(top_count[e], 256 / c.moe.num_experts / 4) << ArchName(arch) << " expert " << e;
    }
  }
}

TEST(MoeWriterTest, CountParameters) {
  ModelConfig c = *PresetConfig(Arch::kDeepseekV3, "tiny");
  const ParameterCounts p = CountParameters(c);
  int64_t total = 0, mtp = 0;
  for (const TensorSpec& t : RequiredTensors(c))
    total += t.shape.size() == 1 ? t.shape[0] : t.shape[0] * t.shape[1];
  for (const TensorSpec& t : MtpTensors(c))
    mtp += t.shape.size() == 1 ? t.shape[0] : t.shape[0] * t.shape[1];
  EXPECT_EQ(p.total, total);
  EXPECT_EQ(p.mtp, mtp);
  // 2 MoE layers, each with 8 - 3 unused experts of 3 x 64 x 40.
  EXPECT_EQ(p.active, total - 2 * 5 * 3 * 64 * 40);
  ModelConfig dense = *PresetConfig(Arch::kQwen3, "tiny");
  EXPECT_EQ(CountParameters(dense).active, CountParameters(dense).total);
}

TEST(MoeTokenizerTest, DeepseekV3SpecialTokensAndChatTemplate) {
  ScratchDir dir;
  ASSERT_TRUE(WriteSyntheticModel(Options(Arch::kDeepseekV3, dir.path())).ok());
  auto w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok());
  auto tok = Tokenizer::Load(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const ModelConfig& c = w->config;
  EXPECT_EQ((*tok)->vocab_size(), c.vocab_size);
  EXPECT_EQ((*tok)->bos_token_id(), c.bos_token_id);
  EXPECT_EQ((*tok)->eos_token_id(), c.eos_token_id);
  EXPECT_EQ((*tok)->TokenToId("<｜begin▁of▁sentence｜>"), c.bos_token_id);
  EXPECT_EQ((*tok)->TokenToId("<｜end▁of▁sentence｜>"), c.eos_token_id);
  EXPECT_TRUE((*tok)->TokenToId("<｜User｜>").has_value());
  EXPECT_TRUE((*tok)->TokenToId("<｜tool▁output▁end｜>").has_value());
  EXPECT_TRUE((*tok)->adds_bos_token());  // as DeepSeek-V3's tokenizer_config.json
  std::vector<ChatMessage> chat = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
  auto text = (*tok)->ApplyChatTemplate(ChatInput::FromMessages(chat, true));
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text,
            "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜>Hello.<｜end▁of▁sentence｜>"
            "<｜User｜>Bye<｜Assistant｜>");
  // The special tokens in the rendered prompt encode as single ids.
  std::vector<int32_t> ids = (*tok)->Encode(*text);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), c.bos_token_id);
  EXPECT_EQ(ids.back(), *(*tok)->TokenToId("<｜Assistant｜>"));

  // qwen3_moe gets Qwen's ChatML tokenizer, without bos.
  ScratchDir qdir;
  ASSERT_TRUE(WriteSyntheticModel(Options(Arch::kQwen3Moe, qdir.path())).ok());
  auto qtok = Tokenizer::Load(qdir.path());
  ASSERT_TRUE(qtok.ok());
  EXPECT_FALSE((*qtok)->adds_bos_token());
  EXPECT_TRUE((*qtok)->TokenToId("<|im_start|>").has_value());
  EXPECT_EQ((*qtok)->eos_token_id(), PresetConfig(Arch::kQwen3Moe, "tiny")->eos_token_id);
}

}  // namespace
}  // namespace pd::model
