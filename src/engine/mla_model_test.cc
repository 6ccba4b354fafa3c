// The MLA forward pass of deepseek_v3 (tiny in-memory models with odd sizes): fast kernels against
// the reference ones on mixed prefill/decode batches, chunked prefill against whole prefill, what
// the latent cache holds and how much of it, and TP 1/2/4 greedy tokens against TP 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "engine/engine.h"
#include "engine/kernels_ref.h"
#include "engine/mla_kernels_ref.h"
#include "engine/mla_test_util.h"
#include "engine/model_runner.h"
#include "engine/moe_test_util.h"

namespace pd::engine {
namespace {

using testing::MakeTinyMlaModel;
using testing::RelError;
using testing::TinyMlaOptions;
using testing::TinyModel;
using testing::Tokens;

struct Case {
  int q_lora_rank;
  KvDType kv_dtype;
  int page_size;
  bool interleave;
  bool yarn;
  model::DType dtype;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "q" + std::to_string(c.q_lora_rank) + "_kv" + std::string(KvDTypeName(c.kv_dtype)) + "_p" +
         std::to_string(c.page_size) + (c.interleave ? "_inter" : "_half") +
         (c.yarn ? "_yarn" : "") + "_" + std::string(model::DTypeName(c.dtype));
}

class MlaRunnerTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    TinyMlaOptions o;
    o.q_lora_rank = GetParam().q_lora_rank;
    o.interleave = GetParam().interleave;
    o.yarn = GetParam().yarn;
    o.dtype = GetParam().dtype;
    model_ = MakeTinyMlaModel(o);
  }
  std::unique_ptr<ModelRunner> Make(KernelKind kind, int threads = 2) {
    ModelRunnerOptions opt;
    opt.kv.page_size = GetParam().page_size;
    opt.kv.dtype = GetParam().kv_dtype;
    opt.num_pages = 200;
    opt.num_threads = threads;
    opt.kernels = kind;
    auto r = ModelRunner::Create(model_->weights, opt);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::vector<int32_t> Pages(int first, int tokens) const {
    const int n = (tokens + GetParam().page_size - 1) / GetParam().page_size;
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = first + n - 1 - i;  // not in order: exercise the table
    return p;
  }
  std::unique_ptr<TinyModel> model_;
};

TEST_P(MlaRunnerTest, FastMatchesReferenceOnMixedBatches) {
  auto ref = Make(KernelKind::kReference);
  auto fast = Make(KernelKind::kFast, 3);
  ASSERT_TRUE(ref && fast);
  const int vocab = model_->weights.config.vocab_size;
  const std::vector<int32_t> a = Tokens(40, 1, vocab), b = Tokens(13, 2, vocab);
  const std::vector<int32_t> pa = Pages(0, 40), pb = Pages(100, 13);
  const double tol = GetParam().kv_dtype == KvDType::kF32 ? 1e-4 : 2e-3;
  // step 0: a prefills 37, b prefills 7; step 1: a decodes, b prefills 5; steps 2-3: both decode.
  const int plan[4][4] = {{0, 37, 0, 7}, {37, 38, 7, 12}, {38, 39, 12, 13}, {39, 40, 13, 13}};
  for (int step = 0; step < 4; ++step) {
    ForwardBatch batch;
    const int* p = plan[step];
    batch.seqs.push_back(
        SeqStep{1, p[0], std::span<const int32_t>(a).subspan(p[0], p[1] - p[0]), pa, true});
    if (p[3] > p[2])
      batch.seqs.push_back(
          SeqStep{2, p[2], std::span<const int32_t>(b).subspan(p[2], p[3] - p[2]), pb, true});
    ForwardOutput out_ref, out_fast;
    ASSERT_TRUE(ref->Forward(batch, &out_ref).ok());
    ASSERT_TRUE(fast->Forward(batch, &out_fast).ok());
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      EXPECT_LT(RelError(out_fast.logits[s], out_ref.logits[s]), tol) << "step " << step;
      const auto argmax = [](const std::vector<float>& v) {
        return std::max_element(v.begin(), v.end()) - v.begin();
      };
      EXPECT_EQ(argmax(out_fast.logits[s]), argmax(out_ref.logits[s])) << "step " << step;
    }
  }
  EXPECT_EQ(fast->progress().Value(), 4u * model_->weights.config.num_layers);
}

TEST_P(MlaRunnerTest, ChunkedPrefillMatchesWholePrefill) {
  auto whole = Make(KernelKind::kFast);
  auto chunked = Make(KernelKind::kFast);
  ASSERT_TRUE(whole && chunked);
  const std::vector<int32_t> t = Tokens(23, 3, model_->weights.config.vocab_size);
  const std::vector<int32_t> pages = Pages(10, 24);
  auto run = [&](ModelRunner& r, int begin, int end) {
    ForwardBatch b;
    b.seqs.push_back(
        SeqStep{1, begin, std::span<const int32_t>(t).subspan(begin, end - begin), pages, true});
    ForwardOutput out;
    EXPECT_TRUE(r.Forward(b, &out).ok());
    return out.logits[0];
  };
  const std::vector<float> want = run(*whole, 0, 23);
  run(*chunked, 0, 5);
  run(*chunked, 5, 6);
  const std::vector<float> got = run(*chunked, 6, 23);
  EXPECT_LT(RelError(got, want), GetParam().kv_dtype == KvDType::kF32 ? 1e-5 : 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MlaRunnerTest,
    ::testing::Values(Case{0, KvDType::kF32, 3, true, false, model::DType::kF32},
                      Case{16, KvDType::kF32, 1, true, true, model::DType::kF32},
                      Case{0, KvDType::kBF16, 3, false, true, model::DType::kBF16},
                      Case{16, KvDType::kBF16, 16, false, false, model::DType::kBF16},
                      Case{0, KvDType::kF32, 16, true, true, model::DType::kF16}),
    CaseName);

// The cache of layer 0 holds, per token, RMSNorm(c) * kv_a_layernorm then the rotated k_rope of
// kv_a_proj(input_layernorm(embedding)); position 0 (no rotation) and position 1.
TEST(MlaCacheTest, HoldsTheNormalisedLatentThenTheRotatedRopeKey) {
  TinyMlaOptions o;
  auto m = MakeTinyMlaModel(o);
  const model::ModelConfig& c = m->weights.config;
  ModelRunnerOptions opt;
  opt.kv.page_size = 3;
  opt.num_pages = 8;
  opt.kernels = KernelKind::kReference;
  auto runner = ModelRunner::Create(m->weights, opt);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  const std::vector<int32_t> tokens = {5, 9}, pages = {6};
  ForwardBatch b;
  b.seqs.push_back(SeqStep{1, 0, tokens, pages, false});
  ForwardOutput out;
  ASSERT_TRUE((*runner)->Forward(b, &out).ok());
  const int64_t hd = c.hidden_size, R = c.mla.kv_lora_rank, L = c.mla.latent_dim();
  const model::LayerWeights& lw = m->weights.layers[0];
  auto vec = [](const model::TensorView& t) {
    std::vector<float> v(t.shape[0]);
    for (size_t i = 0; i < v.size(); ++i) v[i] = t.At(i);
    return v;
  };
  const std::vector<float> in_norm = vec(lw.input_norm), kv_norm = vec(lw.mla->kv_a_norm);
  const KvRegion& region = (*runner)->region();
  kernels::PagedLatent kv;
  kv.base = const_cast<uint8_t*>((*runner)->region().base());
  kv.page_bytes = static_cast<int64_t>(region.spec().page_bytes());
  kv.page_size = 3;
  kv.latent_dim = static_cast<int>(L);
  kv.kv_lora_rank = static_cast<int>(R);
  for (int pos = 0; pos < 2; ++pos) {
    std::vector<float> x(hd), h(hd), a(L);
    for (int64_t i = 0; i < hd; ++i) x[i] = m->weights.embed_tokens.At(tokens[pos] * hd + i);
    ref::RmsNorm(x.data(), 1, hd, hd, in_norm.data(), 1e-6f, h.data(), hd);
    kernels::WeightMatrix w{lw.mla->kv_a_proj.data, false, L, hd};
    ref::Matmul(h.data(), 1, hd, w, a.data(), L);
    ref::RmsNorm(a.data(), 1, R, L, kv_norm.data(), 1e-6f, a.data(), L);
    const int32_t p = pos;
    std::vector<float> cs(3), sn(3);
    ref::RopeTable(&p, 1, 6, c.rope_theta, cs.data(), sn.data());
    ref::ApplyRopeStrided(a.data() + R, 1, L, 1, 0, 6, cs.data(), sn.data(), true);
    const uint8_t* row = ref::LatentRowPtr(kv, 6, pos);
    for (int64_t i = 0; i < L; ++i)
      EXPECT_NEAR(ref::LoadLatent(kv, row, static_cast<int>(i)), a[i], 1e-5) << pos << " " << i;
  }
}

// The ranges a decode step over pages {1, 3} reads: the packed weights, and those pages' latent
// blocks (page_size * latent_dim elements) in every layer.
TEST(MlaCacheTest, WarmRangesCoverTheLatentPagesOfEveryLayer) {
  TinyMlaOptions o;
  auto m = MakeTinyMlaModel(o);
  ModelRunnerOptions opt;
  opt.kv.page_size = 3;
  opt.kv.dtype = KvDType::kBF16;
  opt.num_pages = 8;
  auto r = ModelRunner::Create(m->weights, opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  KvRegion& region = (*r)->region();
  std::vector<MemRange> ranges;
  const std::vector<int32_t> pages = {1, 3};
  (*r)->AppendWarmRanges(pages, &ranges);
  const size_t page_bytes = 3 * (o.kv_lora_rank + o.rope) * 2;
  ASSERT_EQ(region.spec().page_bytes(), page_bytes);
  std::vector<const uint8_t*> kv;
  size_t weight_bytes = 0;
  for (const MemRange& m : ranges) {
    if (m.data >= region.base() && m.data < region.base() + region.size_bytes()) {
      EXPECT_EQ(m.bytes, page_bytes);
      kv.push_back(m.data);
    } else {
      weight_bytes += m.bytes;
    }
  }
  std::vector<const uint8_t*> want;
  for (int l = 0; l < o.layers; ++l)
    for (int32_t p : pages) want.push_back(region.Block(l, p));
  EXPECT_EQ(kv, want);
  EXPECT_GT(weight_bytes, 0u);
}

// KV bytes per token: region / pages / layers / page_size / elem is kv_lora_rank + rope values,
// beside qwen3 with the same hidden size and heads (K and V of every KV head).
TEST(MlaCacheTest, HoldsLatentDimValuesPerTokenPerLayer) {
  TinyMlaOptions o;
  o.heads = 8;
  auto mla = MakeTinyMlaModel(o);
  testing::TinyModelOptions q;
  q.arch = model::Arch::kQwen3;
  q.hidden = o.hidden;
  q.heads = o.heads;
  q.kv_heads = o.heads;  // multi-head: DeepSeek-V3's 128 query heads have no KV grouping either
  q.head_dim = o.nope + o.rope;
  auto qwen = testing::MakeTinyModel(q);
  for (KvDType dtype : {KvDType::kF32, KvDType::kBF16}) {
    ModelRunnerOptions opt;
    opt.kv.page_size = 16;
    opt.kv.dtype = dtype;
    opt.num_pages = 256;  // whole OS pages of region: size_bytes() is exactly the pages' bytes
    auto r_mla = ModelRunner::Create(mla->weights, opt);
    auto r_qwen = ModelRunner::Create(qwen->weights, opt);
    ASSERT_TRUE(r_mla.ok() && r_qwen.ok());
    const KvRegion& region = (*r_mla)->region();
    const size_t elem = dtype == KvDType::kF32 ? 4 : 2;
    const size_t values = region.size_bytes() / 256 / o.layers / 16 / elem;
    EXPECT_EQ(values, static_cast<size_t>(o.kv_lora_rank + o.rope));
    EXPECT_EQ(region.spec().latent_dim, o.kv_lora_rank + o.rope);
    const size_t mla_bytes = region.size_bytes() / 256 / 16;
    const size_t qwen_bytes = (*r_qwen)->region().size_bytes() / 256 / 16;
    EXPECT_EQ(qwen_bytes, static_cast<size_t>(2 * o.heads * q.head_dim) * elem * o.layers);
    std::printf(
        "KV bytes per token (%s, %d layers, hidden %d, %d heads): deepseek_v3 MLA %zu, "
        "qwen3 MHA %zu (%.1fx)\n",
        std::string(KvDTypeName(dtype)).c_str(), o.layers, o.hidden, o.heads, mla_bytes, qwen_bytes,
        static_cast<double>(qwen_bytes) / mla_bytes);
    EXPECT_LT(mla_bytes * 4, qwen_bytes);
  }
}

// Greedy tokens of three batched requests through the engine at TP `tp`.
std::map<int64_t, std::vector<int32_t>> Generate(const model::ModelWeights& w, int tp, int budget,
                                                 int num_pages = 64,
                                                 int64_t* num_preemptions = nullptr) {
  EngineOptions o;
  o.runner.kv.page_size = 4;
  o.runner.num_pages = num_pages;
  o.runner.num_threads = 1;
  o.runner.tensor_parallel_size = tp;
  o.scheduler.max_num_batched_tokens = budget;
  o.scheduler.max_num_seqs = 4;
  o.scheduler.max_model_len = 128;
  auto engine = Engine::Create(w, o);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return {};
  const int lengths[3] = {13, 5, 21}, max_tokens[3] = {8, 10, 6};
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.id = i;
    r.prompt_ids = Tokens(lengths[i], i + 4, w.config.vocab_size);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens[i];
    r.sampling.ignore_eos = true;
    EXPECT_TRUE((*engine)->AddRequest(std::move(r)).ok());
  }
  std::map<int64_t, std::vector<int32_t>> tokens;
  while ((*engine)->HasWork()) {
    auto outputs = (*engine)->Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status().ToString();
    if (!outputs.ok()) break;
    for (const RequestOutput& out : *outputs) {
      auto& t = tokens[out.request_id];
      t.insert(t.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    }
  }
  EXPECT_EQ((*engine)->stats().num_free_pages, (*engine)->stats().num_total_pages);
  if (num_preemptions != nullptr) *num_preemptions = (*engine)->stats().num_preemptions;
  return tokens;
}

TEST(MlaTpTest, GreedyTokensEqualTp1) {
  for (int q_lora : {0, 16})
    for (bool moe : {false, true}) {
      TinyMlaOptions o;
      o.heads = 8;
      o.q_lora_rank = q_lora;
      o.dtype = model::DType::kBF16;
      o.yarn = true;
      auto m = MakeTinyMlaModel(o);
      if (moe) {  // deepseek_v3's MoE after the first layer (moe_test_util.h)
        model::MoeConfig c;
        c.scoring = model::MoeConfig::Scoring::kSigmoid;
        c.num_experts = 8, c.num_experts_per_tok = 2, c.moe_intermediate_size = 12;
        c.n_group = 4, c.topk_group = 2, c.n_shared_experts = 1, c.first_k_dense_replace = 1;
        c.norm_topk_prob = true, c.routed_scaling_factor = 2.5;
        testing::AddMoeLayers(m.get(), c, 5);
      }
      const auto want = Generate(m->weights, 1, 512);
      ASSERT_EQ(want.size(), 3u);
      EXPECT_NE(want.at(0), want.at(1)) << "tokens should depend on the prompt";
      for (int tp : {2, 4})
        for (int budget : {6, 512})
          EXPECT_EQ(Generate(m->weights, tp, budget), want)
              << "q_lora " << q_lora << " moe " << moe << " tp " << tp << " budget " << budget;
    }
}

// Too few pages for the three requests at once: sequences are preempted and recomputed over the
// latent cache, and the tokens stay those of a roomy run.
TEST(MlaEngineTest, PreemptionKeepsTheGreedyTokens) {
  TinyMlaOptions o;
  o.dtype = model::DType::kBF16;
  auto m = MakeTinyMlaModel(o);
  const auto want = Generate(m->weights, 1, 512);
  int64_t preemptions = 0;  // 7 pages of 4 tokens: just the longest request's 27 tokens
  EXPECT_EQ(Generate(m->weights, 1, 512, /*num_pages=*/7, &preemptions), want);
  EXPECT_GT(preemptions, 0) << "the small pool should have forced a preemption";
}

TEST(MlaTpTest, HeadsNotDividedByTpAreRefused) {
  TinyMlaOptions o;
  o.heads = 6;
  auto m = MakeTinyMlaModel(o);
  ModelRunnerOptions opt;
  opt.num_pages = 8;
  opt.tensor_parallel_size = 4;
  auto r = ModelRunner::Create(m->weights, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_attention_heads 6"), std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace pd::engine
