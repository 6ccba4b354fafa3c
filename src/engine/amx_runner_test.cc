// The runner with MatmulPrecision::kBf16 where AMX is usable: a prefill's logits (its matmuls of
// kAmxMinRows rows or more on tiles) and the decode steps after it within the bf16 tolerance of
// the AVX-512 dot path and of the emulating reference; and a sequence's logits independent of the
// sequences sharing its steps while every step's matmuls take the same path.
#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <vector>

#include "engine/cpu_features.h"
#include "engine/kernels.h"
#include "engine/matmul_precision.h"
#include "engine/model_runner.h"
#include "engine/model_runner_test_util.h"

namespace pd::engine {
namespace {

using testing::RelError;
using testing::ScopedAmxAllowed;
using testing::Tokens;

std::unique_ptr<testing::TinyModel> Model() {
  testing::TinyModelOptions o;
  o.dtype = model::DType::kBF16;
  o.hidden = 64;
  o.intermediate = 96;
  o.vocab = 97;
  o.head_dim = 16;
  return testing::MakeTinyModel(o);
}

// A runner created with AMX allowed or not (ChosenMatmulPath reads it then).
std::unique_ptr<ModelRunner> MakeRunner(const model::ModelWeights& w, KernelKind kind, bool amx) {
  const ScopedAmxAllowed allow(amx);
  ModelRunnerOptions o;
  o.num_pages = 64;
  o.num_threads = 2;
  o.kernels = kind;
  o.matmul = MatmulPrecision::kBf16;
  auto r = ModelRunner::Create(w, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::vector<int32_t> Pages(int first, int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = first + i;
  return p;
}

// Logits of seq 1 (prompt `a`, then two decode steps), with seq 2 (prompt `b`, then its decode
// steps) in the same steps unless b is empty.
std::vector<std::vector<float>> RunSteps(ModelRunner& r, const std::vector<int32_t>& a,
                                         const std::vector<int32_t>& b) {
  const std::vector<int32_t> pa = Pages(0, 8), pb = Pages(20, 8);
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> next_a = {3}, next_b = {5};
  for (int step = 0; step < 3; ++step) {
    ForwardBatch batch;
    const int pos_a = step == 0 ? 0 : static_cast<int>(a.size()) + step - 1;
    const int pos_b = step == 0 ? 0 : static_cast<int>(b.size()) + step - 1;
    if (!b.empty())
      batch.seqs.push_back(
          SeqStep{2, pos_b, step == 0 ? std::span(b) : std::span(next_b), pb, true});
    batch.seqs.push_back(SeqStep{1, pos_a, step == 0 ? std::span(a) : std::span(next_a), pa, true});
    ForwardOutput out;
    const Status st = r.Forward(batch, &out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return logits;
    logits.push_back(out.logits.back());
  }
  return logits;
}

class AmxRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!MatmulBf16DotUsed(KernelKind::kFast, MatmulPrecision::kBf16))
      GTEST_SKIP() << "this CPU lacks AVX512_BF16";
    if (!DetectAmx().usable) GTEST_SKIP() << "AMX not usable: " << DetectAmx().reason;
    model_ = Model();
  }
  std::unique_ptr<testing::TinyModel> model_;
};

TEST_F(AmxRunnerTest, PrefillLogitsWithinTheBf16ToleranceOfTheAvx512DotPath) {
  {
    const ScopedAmxAllowed allow(true);
    ASSERT_EQ(ChosenMatmulPath(KernelKind::kFast, MatmulPrecision::kBf16), MatmulPath::kAmxBf16);
  }
  const std::vector<int32_t> a = Tokens(45, 3, 97);  // 45 rows: tiles (three row tiles)
  auto amx = MakeRunner(model_->weights, KernelKind::kFast, true);
  auto avx = MakeRunner(model_->weights, KernelKind::kFast, false);
  auto ref = MakeRunner(model_->weights, KernelKind::kReference, false);
  ASSERT_TRUE(amx && avx && ref);
  const auto got = RunSteps(*amx, a, {}), dot = RunSteps(*avx, a, {}), want = RunSteps(*ref, a, {});
  ASSERT_EQ(got.size(), 3u);
  ASSERT_EQ(dot.size(), 3u);
  ASSERT_EQ(want.size(), 3u);
  for (size_t s = 0; s < got.size(); ++s) {
    // The two kernels' sums differ in the last bits only; bf16 rounding of x bounds both
    // against f32 at ~1e-2 (matmul_precision.h), far above this.
    EXPECT_LT(RelError(got[s], dot[s]), 1e-3) << "step " << s;
    EXPECT_LT(RelError(got[s], want[s]), 1e-2) << "step " << s;
  }
}

TEST_F(AmxRunnerTest, LogitsDoNotDependOnTheBatchWhileThePathIsTheSame) {
  // Prefill steps of 20 and 20 + 30 rows both take tiles; the decode steps (1 and 2 rows) and the
  // lm_head (the rows that want logits) both take vdpbf16ps.
  const std::vector<int32_t> a = Tokens(20, 4, 97), b = Tokens(30, 5, 97);
  auto alone = MakeRunner(model_->weights, KernelKind::kFast, true);
  auto together = MakeRunner(model_->weights, KernelKind::kFast, true);
  ASSERT_TRUE(alone && together);
  EXPECT_EQ(RunSteps(*together, a, b), RunSteps(*alone, a, {}));
}

}  // namespace
}  // namespace pd::engine
