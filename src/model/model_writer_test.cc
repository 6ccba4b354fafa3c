#include "model/model_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "model/test_util.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace pd::model {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

SyntheticModelOptions Options(Arch arch, DType dtype, const std::string& dir, uint64_t seed = 1) {
  SyntheticModelOptions o;
  o.arch = arch;
  o.preset = "tiny";
  o.dtype = dtype;
  o.seed = seed;
  o.out_dir = dir;
  return o;
}

TEST(PresetTest, Shapes) {
  auto q3 = PresetConfig(Arch::kQwen3, "qwen3-0.6b");
  ASSERT_TRUE(q3.ok());
  EXPECT_EQ(q3->hidden_size, 1024);
  EXPECT_EQ(q3->num_layers, 28);
  EXPECT_EQ(q3->num_heads, 16);
  EXPECT_EQ(q3->num_kv_heads, 8);
  EXPECT_EQ(q3->head_dim, 128);
  EXPECT_EQ(q3->intermediate_size, 3072);
  EXPECT_EQ(q3->vocab_size, 151936);
  EXPECT_EQ(q3->rope_theta, 1e6);
  EXPECT_EQ(q3->max_position_embeddings, 40960);
  EXPECT_TRUE(q3->tie_word_embeddings);
  EXPECT_TRUE(q3->qk_norm);
  EXPECT_EQ(q3->bos_token_id, 151936 - 3);
  EXPECT_EQ(q3->eos_token_id, 151936 - 1);

  auto l = PresetConfig(Arch::kLlama, "llama-1b");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->hidden_size, 2048);
  EXPECT_EQ(l->num_layers, 22);
  EXPECT_EQ(l->num_heads, 32);
  EXPECT_EQ(l->num_kv_heads, 4);
  EXPECT_EQ(l->head_dim, 64);
  EXPECT_EQ(l->intermediate_size, 5632);
  EXPECT_EQ(l->vocab_size, 32000);
  EXPECT_EQ(l->rms_norm_eps, 1e-5);
  EXPECT_FALSE(l->tie_word_embeddings);
  EXPECT_FALSE(l->attention_bias);
  EXPECT_EQ(l->bos_token_id, 32000 - 5);
  EXPECT_EQ(l->eos_token_id, 32000 - 1);

  auto tiny3 = PresetConfig(Arch::kQwen3, "tiny");
  EXPECT_EQ(tiny3->q_size(), 128);  // != hidden 64
  auto tiny2 = PresetConfig(Arch::kQwen2, "tiny");
  EXPECT_EQ(tiny2->head_dim, 16);
  EXPECT_TRUE(tiny2->attention_bias);
  EXPECT_EQ(tiny2->rope_theta, 1e6);
  auto small = PresetConfig(Arch::kLlama, "small");
  EXPECT_EQ(small->hidden_size, 256);
  EXPECT_EQ(small->vocab_size, 2048);
  EXPECT_EQ(small->head_dim, 32);
  EXPECT_EQ(PresetConfig(Arch::kQwen3, "small")->head_dim, 64);
  // The named presets keep their shapes under another arch, with that arch's conventions.
  auto q2big = PresetConfig(Arch::kQwen2, "qwen3-0.6b");
  EXPECT_EQ(q2big->hidden_size, 1024);
  EXPECT_TRUE(q2big->attention_bias);
  EXPECT_FALSE(q2big->qk_norm);
}

TEST(PresetTest, UnknownPreset) {
  auto r = PresetConfig(Arch::kQwen3, "huge");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("unknown preset \"huge\""));
}

class WriteModelTest : public ::testing::TestWithParam<std::tuple<Arch, DType>> {};

TEST_P(WriteModelTest, WritesAModelThatLoads) {
  auto [arch, dtype] = GetParam();
  ScratchDir dir;
  ASSERT_TRUE(WriteSyntheticModel(Options(arch, dtype, dir.path())).ok());
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json", "generation_config.json"}) {
    EXPECT_TRUE(std::filesystem::exists(dir / f)) << f;
  }
  auto w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->dtype, dtype);
  ModelConfig expected = *PresetConfig(arch, "tiny");
  EXPECT_EQ(w->config.arch, arch);
  EXPECT_EQ(w->config.hidden_size, expected.hidden_size);
  EXPECT_EQ(w->config.head_dim, expected.head_dim);
  EXPECT_EQ(w->config.bos_token_id, expected.bos_token_id);
  EXPECT_EQ(w->config.eos_token_id, expected.eos_token_id);
  EXPECT_EQ(w->layers.size(), 2u);
  auto config = nlohmann::json::parse(*ReadFileToString(dir / "config.json"));
  EXPECT_EQ(config["torch_dtype"], dtype == DType::kF32    ? "float32"
                                   : dtype == DType::kBF16 ? "bfloat16"
                                                           : "float16");
  // The tokenizer agrees with the config on the vocabulary and the special tokens.
  auto tok = Tokenizer::Load(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), w->config.vocab_size);
  EXPECT_EQ((*tok)->eos_token_id(), w->config.eos_token_id);
  EXPECT_TRUE((*tok)->IsSpecial(w->config.eos_token_id));
  // Every value is finite and norms are near 1.
  for (int64_t i = 0; i < w->final_norm.numel(); ++i) {
    EXPECT_NEAR(w->final_norm.At(i), 1.0f, 0.5f);
  }
  for (int64_t i = 0; i < w->embed_tokens.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(w->embed_tokens.At(i)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    ArchDType, WriteModelTest,
    ::testing::Combine(::testing::Values(Arch::kLlama, Arch::kQwen2, Arch::kQwen3),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16)),
    [](const auto& info) {
      return std::string(ArchName(std::get<0>(info.param))) + "_" +
             std::string(DTypeName(std::get<1>(info.param)));
    });

TEST(WriteModelTest, DeterministicPerSeed) {
  ScratchDir a, b, c;
  ASSERT_TRUE(WriteSyntheticModel(Options(Arch::kQwen2, DType::kBF16, a.path(), 7)).ok());
  ASSERT_TRUE(WriteSyntheticModel(Options(Arch::kQwen2, DType::kBF16, b.path(), 7)).ok());
  ASSERT_TRUE(WriteSyntheticModel(Options(Arch::kQwen2, DType::kBF16, c.path(), 8)).ok());
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json"}) {
    EXPECT_EQ(*ReadFileToString(a / f), *ReadFileToString(b / f)) << f;
  }
  EXPECT_NE(*ReadFileToString(a / "model.safetensors"), *ReadFileToString(c / "model.safetensors"));
}

TEST(WriteModelTest, ShardedHoldsTheSameTensors) {
  ScratchDir single, sharded;
  auto o = Options(Arch::kLlama, DType::kF16, single.path(), 3);
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  o.out_dir = sharded.path();
  o.max_shard_bytes = 100 * 1024;
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  EXPECT_TRUE(std::filesystem::exists(sharded / "model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(sharded / "model.safetensors"));
  auto a = LoadModelWeights(single.path());
  auto b = LoadModelWeights(sharded.path());
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  std::set<std::string> files;
  for (const std::string& name : a->checkpoint->Names()) {
    TensorView x = *a->checkpoint->Get(name);
    auto y = b->checkpoint->Get(name);
    ASSERT_TRUE(y.ok()) << name;
    ASSERT_EQ(x.size_bytes(), y->size_bytes());
    EXPECT_EQ(std::memcmp(x.data, y->data, x.size_bytes()), 0) << name;
    files.insert(b->checkpoint->FileOf(name));
  }
  EXPECT_GE(files.size(), 3u);
}

TEST(WriteModelTest, Overrides) {
  ScratchDir dir;
  auto o = Options(Arch::kQwen3, DType::kF32, dir.path());
  o.num_kv_heads = 1;
  o.num_layers = 3;
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  auto w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->config.num_kv_heads, 1);
  EXPECT_EQ(w->layers.size(), 3u);
  EXPECT_EQ(w->layers[2].k_proj.shape, (std::vector<int64_t>{32, 64}));

  o.num_kv_heads = 3;
  Status s = WriteSyntheticModel(o);
  EXPECT_THAT(s.message(), HasSubstr("num_kv_heads 3 must be positive and divide"));
  o.num_kv_heads.reset();
  o.num_layers = 0;
  EXPECT_THAT(WriteSyntheticModel(o).message(), HasSubstr("num_layers must be positive"));
  o.num_layers.reset();
  o.preset = "nope";
  EXPECT_THAT(WriteSyntheticModel(o).message(), HasSubstr("unknown preset"));
  o.preset = "tiny";
  o.out_dir = "";
  EXPECT_FALSE(WriteSyntheticModel(o).ok());
}

// ---- Logits are far from uniform: a plain f32 forward pass of the first position (where
// attention over one token returns v itself, and RoPE is the identity).

// x (n,) -> x / rms(x) * w
std::vector<float> RmsNorm(const std::vector<float>& x, const TensorView& w, double eps) {
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  float inv = static_cast<float>(1.0 / std::sqrt(ss / x.size() + eps));
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * w.At(i);
  return out;
}

// W (d, n) @ x (n,) [+ b (d,)] -> (d,)
std::vector<float> MatVec(const TensorView& w, const std::vector<float>& x,
                          const std::optional<TensorView>& b = std::nullopt) {
  int64_t d = w.shape[0], n = w.shape[1];
  std::vector<float> out(d);
  for (int64_t i = 0; i < d; ++i) {
    double acc = b ? b->At(i) : 0.0;
    for (int64_t j = 0; j < n; ++j) acc += double(w.At(i * n + j)) * x[j];
    out[i] = static_cast<float>(acc);
  }
  return out;
}

// Attention output (hidden,) at position 0, where each head returns its v: GQA reads v_proj,
// MLA expands the normalised latent through kv_b_proj.
std::vector<float> FirstPositionAttention(const ModelConfig& c, const LayerWeights& l,
                                          const std::vector<float>& xn) {
  if (l.mla) {
    const MlaConfig& a = c.mla;
    std::vector<float> kv_a = MatVec(l.mla->kv_a_proj, xn);  // (kv_lora + rope,)
    kv_a.resize(a.kv_lora_rank);
    std::vector<float> kv =
        MatVec(l.mla->kv_b_proj, RmsNorm(kv_a, l.mla->kv_a_norm, c.rms_norm_eps));
    std::vector<float> attn;  // (heads * v,) from kv (heads, nope + v)
    for (int h = 0; h < c.num_heads; ++h) {
      auto v = kv.begin() + h * (a.qk_nope_head_dim + a.v_head_dim) + a.qk_nope_head_dim;
      attn.insert(attn.end(), v, v + a.v_head_dim);
    }
    return MatVec(l.mla->o_proj, attn);
  }
  std::vector<float> v = MatVec(l.v_proj, xn, l.v_bias);
  std::vector<float> attn(c.q_size());  // each query head reads its KV head's v
  int group = c.num_heads / c.num_kv_heads;
  for (int h = 0; h < c.num_heads; ++h) {
    for (int d = 0; d < c.head_dim; ++d) attn[h * c.head_dim + d] = v[(h / group) * c.head_dim + d];
  }
  return MatVec(l.o_proj, attn);
}

std::vector<float> SwiGlu(const TensorView& gate, const TensorView& up, const TensorView& down,
                          const std::vector<float>& h) {
  std::vector<float> g = MatVec(gate, h), u = MatVec(up, h);
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  return MatVec(down, g);
}

// The experts a MoE block picks for h, with their weights, as transformers routes:
// qwen3_moe softmax top-k; deepseek_v3 sigmoid, groups ranked by their two best biased scores,
// top-k of the biased scores in the best topk_group groups, weights from the unbiased scores.
std::vector<std::pair<int, double>> Route(const ModelConfig& c, const MoeWeights& m,
                                          const std::vector<float>& h) {
  const MoeConfig& moe = c.moe;
  std::vector<float> logits = MatVec(m.router, h);
  std::vector<double> score(moe.num_experts), choice(moe.num_experts);
  if (moe.scoring == MoeConfig::Scoring::kSoftmax) {
    double z = 0, top = *std::max_element(logits.begin(), logits.end());
    for (float l : logits) z += std::exp(l - top);
    for (int e = 0; e < moe.num_experts; ++e) score[e] = choice[e] = std::exp(logits[e] - top) / z;
  } else {
    const int per_group = moe.num_experts / moe.n_group;
    std::vector<std::pair<double, int>> groups;
    for (int e = 0; e < moe.num_experts; ++e) {
      score[e] = 1.0 / (1.0 + std::exp(-double(logits[e])));
      choice[e] = score[e] + m.router_bias->At(e);
    }
    for (int g = 0; g < moe.n_group; ++g) {
      std::vector<double> s(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
      std::sort(s.rbegin(), s.rend());
      groups.push_back({s[0] + s[1], g});
    }
    std::sort(groups.rbegin(), groups.rend());
    for (int i = moe.topk_group; i < moe.n_group; ++i) {
      for (int e = 0; e < per_group; ++e) choice[groups[i].second * per_group + e] = 0.0;
    }
  }
  std::vector<int> order(moe.num_experts);
  for (int e = 0; e < moe.num_experts; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return choice[a] > choice[b]; });
  std::vector<std::pair<int, double>> picked;
  double sum = 0;
  for (int i = 0; i < moe.num_experts_per_tok; ++i) {
    picked.push_back({order[i], score[order[i]]});
    sum += score[order[i]];
  }
  const bool deepseek = moe.scoring == MoeConfig::Scoring::kSigmoid;
  for (auto& [e, weight] : picked) {
    if (moe.norm_topk_prob) weight /= sum + (deepseek ? 1e-20 : 0.0);
    if (deepseek) weight *= moe.routed_scaling_factor;
  }
  return picked;
}

std::vector<float> FirstPositionMlp(const ModelConfig& c, const LayerWeights& l,
                                    const std::vector<float>& h) {
  if (!l.moe) return SwiGlu(l.gate_proj, l.up_proj, l.down_proj, h);
  std::vector<float> out(c.hidden_size, 0.0f);
  for (auto [e, weight] : Route(c, *l.moe, h)) {
    const MlpWeights& x = l.moe->experts[e];
    std::vector<float> y = SwiGlu(x.gate_proj, x.up_proj, x.down_proj, h);
    for (int j = 0; j < c.hidden_size; ++j) out[j] += static_cast<float>(weight * y[j]);
  }
  if (l.moe->shared_expert) {
    const MlpWeights& x = *l.moe->shared_expert;
    std::vector<float> y = SwiGlu(x.gate_proj, x.up_proj, x.down_proj, h);
    for (int j = 0; j < c.hidden_size; ++j) out[j] += y[j];
  }
  return out;
}

// Logits (vocab,) of token `token` at position 0; *final_rms gets the residual stream's rms.
std::vector<float> FirstPositionLogits(const ModelWeights& w, int token, double* final_rms) {
  const ModelConfig& c = w.config;
  std::vector<float> x(c.hidden_size);
  for (int j = 0; j < c.hidden_size; ++j)
    x[j] = w.embed_tokens.At(int64_t(token) * c.hidden_size + j);
  for (const LayerWeights& l : w.layers) {
    std::vector<float> o = FirstPositionAttention(c, l, RmsNorm(x, l.input_norm, c.rms_norm_eps));
    for (int j = 0; j < c.hidden_size; ++j) x[j] += o[j];
    std::vector<float> down = FirstPositionMlp(c, l, RmsNorm(x, l.post_norm, c.rms_norm_eps));
    for (int j = 0; j < c.hidden_size; ++j) x[j] += down[j];
  }
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  *final_rms = std::sqrt(ss / x.size());
  return MatVec(w.lm_head, RmsNorm(x, w.final_norm, c.rms_norm_eps));
}

struct LogitStats {
  double mean_max_prob = 0;
  double self_argmax_share = 0;  // how often the argmax is the input token itself
  int distinct_argmax = 0;
  double max_final_rms = 0, min_final_rms = 1e30;
  bool all_finite = true;
};

LogitStats Stats(const ModelWeights& w, int num_tokens) {
  LogitStats s;
  std::set<int> argmaxes;
  for (int t = 0; t < num_tokens; ++t) {
    double rms;
    std::vector<float> logits = FirstPositionLogits(w, t * 7 % w.config.vocab_size, &rms);
    s.max_final_rms = std::max(s.max_final_rms, rms);
    s.min_final_rms = std::min(s.min_final_rms, rms);
    int best = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      s.all_finite &= std::isfinite(logits[i]);
      if (logits[i] > logits[best]) best = int(i);
    }
    double z = 0;
    for (float l : logits) z += std::exp(double(l) - logits[best]);
    s.mean_max_prob += 1.0 / z / num_tokens;
    s.self_argmax_share += (best == t * 7 % w.config.vocab_size) ? 1.0 / num_tokens : 0.0;
    argmaxes.insert(best);
  }
  s.distinct_argmax = int(argmaxes.size());
  return s;
}

class LogitsTest : public ::testing::TestWithParam<Arch> {};

TEST_P(LogitsTest, FarFromUniformAndNotDegenerate) {
  ScratchDir dir;
  ASSERT_TRUE(WriteSyntheticModel(Options(GetParam(), DType::kBF16, dir.path())).ok());
  auto w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok());
  LogitStats s = Stats(*w, 64);
  EXPECT_TRUE(s.all_finite);
  // Uniform would be 1/512 = 0.002: demand a hundred times that.
  EXPECT_GT(s.mean_max_prob, 0.2);
  // ...without collapsing onto "repeat the input" or onto one favourite token.
  EXPECT_LT(s.self_argmax_share, 0.5);
  EXPECT_GT(s.distinct_argmax, 32);
}

TEST_P(LogitsTest, DeepModelStaysBounded) {
  ScratchDir dir;
  auto o = Options(GetParam(), DType::kF16, dir.path());
  o.num_layers = 28;
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  auto w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok());
  LogitStats s = Stats(*w, 16);
  EXPECT_TRUE(s.all_finite);
  EXPECT_LT(s.max_final_rms, 10.0);
  EXPECT_GT(s.min_final_rms, 0.1);
  EXPECT_GT(s.mean_max_prob, 0.2);
}

INSTANTIATE_TEST_SUITE_P(AllArchs, LogitsTest,
                         ::testing::Values(Arch::kLlama, Arch::kQwen2, Arch::kQwen3,
                                           Arch::kQwen3Moe, Arch::kDeepseekV3),
                         [](const auto& info) { return std::string(ArchName(info.param)); });

}  // namespace
}  // namespace pd::model
