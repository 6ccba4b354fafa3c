#include "engine/moe_block.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cpu_features.h"
#include "engine/kernels.h"
#include "engine/kernels_ref.h"
#include "engine/matmul_precision.h"
#include "engine/moe_test_util.h"
#include "engine/thread_pool.h"

namespace pd::engine {
namespace {

constexpr int kHidden = 40, kInter = 24, kExperts = 7, kTopK = 3, kTokens = 5;
constexpr int kUnused = 6;  // the expert no token chooses: its weights are NaN

// One MoE layer of odd shapes: softmax routing (qwen3_moe), or sigmoid with 7 groups of one
// expert, top-4 groups, a shared expert twice as wide, scaling 1.5 (deepseek_v3's router).
struct Layer {
  std::unique_ptr<testing::TinyModel> model;
  std::unique_ptr<RunnerWeights> weights;
  const RunnerMoeWeights& moe() const { return weights->layers[0].moe; }
  const model::MoeConfig& config() const { return weights->config.moe; }
};

Layer MakeLayer(model::DType dtype, bool sigmoid, bool pack) {
  testing::TinyModelOptions o;
  o.arch = model::Arch::kQwen3Moe;
  o.dtype = dtype;
  o.hidden = kHidden;
  o.layers = 1;
  model::MoeConfig moe;
  moe.num_experts = kExperts;
  moe.num_experts_per_tok = kTopK;
  moe.moe_intermediate_size = kInter;
  if (sigmoid) {
    moe.scoring = model::MoeConfig::Scoring::kSigmoid;
    moe.n_group = 7;
    moe.topk_group = 4;
    moe.norm_topk_prob = true;
    moe.routed_scaling_factor = 1.5;
    moe.n_shared_experts = 2;
  }
  Layer l;
  l.model = testing::MakeTinyModel(o);
  testing::AddMoeLayers(l.model.get(), moe, 13);
  model::MoeWeights& mw = *l.model->weights.layers[0].moe;
  // Expert kUnused: a router row far below the others, weights all NaN.
  const size_t esize = model::DTypeSize(dtype);
  uint8_t* router = const_cast<uint8_t*>(static_cast<const uint8_t*>(mw.router.data));
  for (int i = 0; i < kHidden; ++i) {
    const float v = 100.0f * (i % 2 == 0 ? 1 : -1);  // against h's alternating signs
    if (dtype == model::DType::kF32) {
      std::memcpy(router + (kUnused * kHidden + i) * esize, &v, 4);
    } else {
      const uint16_t b = model::F32ToBf16(v);
      std::memcpy(router + (kUnused * kHidden + i) * esize, &b, 2);
    }
  }
  for (const model::TensorView* t : {&mw.experts[kUnused].gate_proj, &mw.experts[kUnused].up_proj,
                                     &mw.experts[kUnused].down_proj}) {
    uint8_t* p = const_cast<uint8_t*>(static_cast<const uint8_t*>(t->data));
    std::memset(p, 0xff, t->numel() * esize);  // NaN in f32 and bf16
  }
  auto w = PrepareRunnerWeights(l.model->weights);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  l.weights = std::move(*w);
  if (pack) {
    ThreadPool pool(2);
    EXPECT_TRUE(PackRunnerWeights(pool, l.weights.get()).ok());
  }
  return l;
}

// (kTokens, kHidden) inputs; odd columns positive-leaning, even negative, so the unused
// expert's router logit is far below every other.
std::vector<float> Inputs(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.3f);
  std::vector<float> h(kTokens * kHidden);
  for (int r = 0; r < kTokens; ++r)
    for (int i = 0; i < kHidden; ++i) h[r * kHidden + i] = d(rng) + (i % 2 == 0 ? -1.0f : 1.0f);
  // Tokens 1 and 3 equal: they choose the same experts.
  for (int i = 0; i < kHidden; ++i) h[3 * kHidden + i] = h[1 * kHidden + i];
  return h;
}

kernels::IsaKernels Fast(bool bf16_dot) {
  kernels::IsaKernels k = kernels::KernelsFor(BestIsaLevel());
  if (bf16_dot) k.matmul_panel = k.matmul_panel_bf16_dot;
  return k;
}

using Param = std::tuple<model::DType, bool /*sigmoid*/, bool /*bf16_dot*/>;
class MoeBlockTest : public ::testing::TestWithParam<Param> {};

TEST_P(MoeBlockTest, FastMatchesReferenceAndSkipsUnchosenExperts) {
  const auto [dtype, sigmoid, bf16_dot] = GetParam();
  if (bf16_dot && !MatmulBf16DotUsed(KernelKind::kFast, MatmulPrecision::kBf16))
    GTEST_SKIP() << "this CPU has no bf16-dot panel kernel";
  if (kernels::KernelsFor(BestIsaLevel()).matmul_panel == nullptr)
    GTEST_SKIP() << "this CPU has no panel kernel (weights stay row-major)";
  Layer ref_layer = MakeLayer(dtype, sigmoid, /*pack=*/false);
  Layer fast_layer = MakeLayer(dtype, sigmoid, /*pack=*/true);
  const std::vector<float> h = Inputs(3);
  ThreadPool pool(3);
  MoeExec ref;
  ref.pool = &pool;
  ref.bf16_dot = bf16_dot;
  const kernels::IsaKernels isa = Fast(bf16_dot);
  MoeExec fast = ref;
  fast.isa = &isa;
  fast.router_isa = &kernels::KernelsFor(BestIsaLevel());
  std::vector<float> want(kTokens * kHidden), got(kTokens * kHidden);
  MoeScratch rs, fs;
  MoeForward(ref, ref_layer.config(), ref_layer.moe(), h.data(), kTokens, kHidden, want.data(),
             &rs);
  MoeForward(fast, fast_layer.config(), fast_layer.moe(), h.data(), kTokens, kHidden, got.data(),
             &fs);
  // Routing: equal on both paths; tokens share experts; expert kUnused chosen by none.
  ASSERT_EQ(std::vector<int32_t>(rs.experts.begin(), rs.experts.begin() + kTokens * kTopK),
            std::vector<int32_t>(fs.experts.begin(), fs.experts.begin() + kTokens * kTopK));
  EXPECT_EQ(rs.offset[kUnused + 1] - rs.offset[kUnused], 0);
  for (int j = 0; j < kTopK; ++j) EXPECT_EQ(rs.experts[1 * kTopK + j], rs.experts[3 * kTopK + j]);
  const double tol = 1e-5;  // the same weights and products (bf16-dot: bit for bit), f32 sums
  double max_abs = 0;
  for (float v : want) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
  ASSERT_GT(max_abs, 0.05);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;  // the NaN expert was neither computed nor added
    EXPECT_NEAR(got[i], want[i], tol * max_abs) << "element " << i;
  }
  // A token's output does not depend on the tokens beside it: each alone, bit for bit.
  for (int r = 0; r < kTokens; ++r) {
    std::vector<float> one(kHidden);
    MoeForward(fast, fast_layer.config(), fast_layer.moe(), h.data() + r * kHidden, 1, kHidden,
               one.data(), &fs);
    for (int i = 0; i < kHidden; ++i) ASSERT_EQ(one[i], got[r * kHidden + i]) << r << "," << i;
  }
}

// A direct per-token evaluation of the definition (reference kernels, no grouping) against the
// grouped reference path: the grouping and the weighted sum, not just two equal kernels.
TEST(MoeBlockTest, GroupedReferenceEqualsPerTokenDefinition) {
  for (bool sigmoid : {false, true}) {
    Layer l = MakeLayer(model::DType::kF32, sigmoid, /*pack=*/false);
    const std::vector<float> h = Inputs(5);
    ThreadPool pool(1);
    MoeExec ref;
    ref.pool = &pool;
    std::vector<float> out(kTokens * kHidden);
    MoeScratch s;
    MoeForward(ref, l.config(), l.moe(), h.data(), kTokens, kHidden, out.data(), &s);
    for (int t = 0; t < kTokens; ++t) {
      std::vector<double> want(kHidden, 0.0);
      auto add_expert = [&](const RunnerExpert& ex, double weight) {
        const int64_t n = ex.inter();
        std::vector<float> g(n), u(n), a(n), y(kHidden);
        ref::Matmul(h.data() + t * kHidden, 1, kHidden, ex.gate.w, g.data(), n);
        ref::Matmul(h.data() + t * kHidden, 1, kHidden, ex.up.w, u.data(), n);
        for (int64_t i = 0; i < n; ++i) a[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
        ref::Matmul(a.data(), 1, n, ex.down.w, y.data(), kHidden);
        for (int i = 0; i < kHidden; ++i) want[i] += weight * y[i];
      };
      for (int j = 0; j < kTopK; ++j)
        add_expert(l.moe().experts[s.experts[t * kTopK + j]], s.weights[t * kTopK + j]);
      if (sigmoid) add_expert(l.moe().shared[0], 1.0);
      for (int i = 0; i < kHidden; ++i)
        EXPECT_NEAR(out[t * kHidden + i], want[i], 1e-5 * (1 + std::fabs(want[i])));
    }
  }
}

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  const auto [dtype, sigmoid, dot] = info.param;
  return std::string(dtype == model::DType::kF32 ? "F32" : "Bf16") +
         (sigmoid ? "Sigmoid" : "Softmax") + (dot ? "Bf16Dot" : "");
}

INSTANTIATE_TEST_SUITE_P(DTypeRouterPrecision, MoeBlockTest,
                         ::testing::Combine(::testing::Values(model::DType::kF32,
                                                              model::DType::kBF16),
                                            ::testing::Bool(), ::testing::Bool()),
                         Name);

}  // namespace
}  // namespace pd::engine
