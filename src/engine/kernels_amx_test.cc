// The AMX bf16 matmul (kernels_amx.cc) against ref::MatmulBf16Dot and the float64 sum of the same
// bf16 products, on odd shapes (fp8 weights against the float64 sum of their dequantised values); a
// row's result independent of the rows computed with it; the AVX-512 dot kernel below kAmxMinRows
// rows, for f32 weights and odd k; and which path a runner's matmuls take (ChosenMatmulPath) with
// AMX allowed or not. Skipped where the CPU lacks AMX or Linux refuses the tile state (the reason
// is printed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/cpu_features.h"
#include "engine/kernels.h"
#include "engine/kernels_ref.h"
#include "engine/kernels_test_util.h"
#include "engine/matmul_precision.h"
#include "engine/model_runner_test_util.h"
#include "engine/thread_pool.h"
#include "model/dtype.h"

namespace pd::engine::kernels {
namespace {

using pd::engine::testing::Fp8PanelWeights;
using pd::engine::testing::Panel32Weights;
using pd::engine::testing::Random;

class AmxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!DetectAmx().usable) GTEST_SKIP() << "AMX not usable: " << DetectAmx().reason;
    amx_ = AmxPanelDotMatmul(ChosenPanelStream());
  }
  MatmulFn amx_ = nullptr;
};

// x rounded to bf16 as the kernels round it (nearest even, denormals to zero).
double XBf16(float v) {
  const float r = model::Bf16ToF32(model::F32ToBf16(v));
  return std::fabs(r) < 1.1754944e-38f ? 0.0 : r;
}

struct Shape {
  int64_t m, n, k, ldx, ldo, n_begin;
};

// got (m, ldo), columns [n_begin, n), against the float64 sum of x (rounded to bf16) times the
// rows of w (n, k): within rel times the sum of |products|, and within twice that of `dot` when
// given; the columns outside the slice untouched (-7).
void CheckSums(const std::vector<float>& got, const std::vector<float>* dot,
               const std::vector<float>& x, const std::vector<float>& w, const Shape& s,
               double rel) {
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.ldo; ++j) {
      const float g = got[i * s.ldo + j];
      if (j < s.n_begin || j >= s.n) {
        ASSERT_EQ(g, -7.0f) << "m=" << s.m << " n=" << s.n << " k=" << s.k << " column " << j;
        continue;
      }
      double exact = 0, magnitude = 0;
      for (int64_t c = 0; c < s.k; ++c) {
        const double p = XBf16(x[i * s.ldx + c]) * w[j * s.k + c];
        exact += p;
        magnitude += std::fabs(p);
      }
      const double bound = rel * magnitude + 1e-30;
      ASSERT_NEAR(g, exact, bound)
          << "m=" << s.m << " n=" << s.n << " k=" << s.k << " at " << i << "," << j;
      if (dot != nullptr) {
        ASSERT_NEAR(g, (*dot)[i * s.ldo + j], 2 * bound)
            << "m=" << s.m << " n=" << s.n << " k=" << s.k << " at " << i << "," << j;
      }
    }
}

// Rows past 16 and 32 (one and two row tiles), k within one k block, over several and not a
// multiple of 32, columns a partial group and several group blocks, a slice not starting at group
// 0: every element within 2e-6 of the sum of |products| of the float64 sum, and of
// ref::MatmulBf16Dot (which rounds each step); columns outside the slice untouched.
TEST_F(AmxTest, MatchesTheReferenceOnOddShapes) {
  ThreadPool pool(1);
  for (int64_t k : {2, 18, 64, 258, 600})
    for (int64_t n : {5, 32 * 3 + 7, 32 * 19 + 5})
      for (int64_t m : {16, 17, 33, 50}) {
        Panel32Weights w(n, k, true, m * 7 + k + n, pool);
        const int64_t ldx = k + 3, ldo = n + 2, n_begin = n > 64 ? 64 : 0;
        std::vector<float> x = Random(m * ldx, m + 3 * k);
        x[0] = 1e-39f;  // a denormal: zero in bf16
        x[ldx + 1] = -3e-38f;
        std::vector<float> got(m * ldo, -7.0f), dot(m * ldo, -7.0f);
        amx_(x.data(), m, ldx, w.panel, n_begin, n, got.data(), ldo);
        ref::MatmulBf16Dot(x.data(), m, ldx, w.rows, dot.data(), ldo);
        ASSERT_NO_FATAL_FAILURE(CheckSums(got, &dot, x, w.f32, {m, n, k, ldx, ldo, n_begin}, 2e-6));
      }
}

// A row's outputs have the same bits whether it is computed among 16 rows or 600 (two row blocks
// of the kernel), at any place.
TEST_F(AmxTest, ARowsResultDoesNotDependOnItsBatch) {
  ThreadPool pool(1);
  const int64_t n = 32 * 9 + 3, k = 700;
  Panel32Weights w(n, k, true, 5, pool);
  const std::vector<float> few = Random(16 * k, 6);
  std::vector<float> many = Random(600 * k, 7);
  for (int64_t r = 0; r < 16; ++r)  // row r of `few` is row 583 - 37r of `many`
    std::copy(few.begin() + r * k, few.begin() + (r + 1) * k, many.begin() + (583 - 37 * r) * k);
  std::vector<float> a(16 * n), b(600 * n);
  amx_(few.data(), 16, k, w.panel, 0, n, a.data(), n);
  amx_(many.data(), 600, k, w.panel, 0, n, b.data(), n);
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(a[r * n + j], b[(583 - 37 * r) * n + j]) << "row " << r << " column " << j;
}

// Below kAmxMinRows rows, f32 weights and odd k: the AVX-512 dot kernel's bits.
TEST_F(AmxTest, KeepsTheAvx512DotKernelWhereTilesDoNotApply) {
  ThreadPool pool(1);
  const MatmulFn dot = Avx512PanelDotMatmul(ChosenPanelStream());
  struct Case {
    int64_t m, k;
    bool bf16;
  };
  for (const Case& c : {Case{1, 64, true}, Case{kAmxMinRows - 1, 130, true}, Case{40, 64, false},
                        Case{40, 33, true}}) {
    const int64_t n = 70;
    Panel32Weights w(n, c.k, c.bf16, 11, pool);
    const std::vector<float> x = Random(c.m * c.k, 12);
    std::vector<float> want(c.m * n, 1.0f), got(c.m * n, 2.0f);
    dot(x.data(), c.m, c.k, w.panel, 0, n, want.data(), n);
    amx_(x.data(), c.m, c.k, w.panel, 0, n, got.data(), n);
    EXPECT_EQ(got, want) << "m=" << c.m << " k=" << c.k << " bf16=" << c.bf16;
  }
}

// Split across threads by ParallelMatmul (whole groups per call): the same bits as one call.
TEST_F(AmxTest, ParallelMatmulEqualsOneCall) {
  ThreadPool pool(3);
  const int64_t n = 32 * 41 + 7, k = 96, rows = 100;
  Panel32Weights w(n, k, true, 21, pool);
  IsaKernels isa = KernelsFor(BestIsaLevel());
  isa.matmul_panel = amx_;
  const std::vector<float> x = Random(rows * k, 22);
  std::vector<float> want(rows * n), got(rows * n, NAN);
  amx_(x.data(), rows, k, w.panel, 0, n, want.data(), n);
  ParallelMatmul(pool, isa, x.data(), rows, k, w.panel, got.data(), n);
  EXPECT_EQ(got, want);
}

// fp8 weights (tiles of the codes as bf16, each 128-wide k block's sums scaled into the total):
// within 4e-6 of the sum of |products| of the float64 sum over x rounded to bf16 and the
// dequantised weights, on odd k (partial scale blocks) and rows; columns outside untouched.
TEST_F(AmxTest, Fp8MatchesTheFloat64SumOnOddShapes) {
  ThreadPool pool(1);
  for (int64_t k : {1, 7, 128, 129, 300})
    for (int64_t n : {5, 32 * 3 + 7, 32 * 9 + 5})
      for (int64_t m : {16, 17, 33, 50}) {
        Fp8PanelWeights w(n, k, m * 5 + k + n, pool);
        const int64_t ldx = k + 3, ldo = n + 2, n_begin = n > 64 ? 64 : 0;
        const std::vector<float> x = Random(m * ldx, m + 7 * k);
        std::vector<float> got(m * ldo, -7.0f);
        amx_(x.data(), m, ldx, w.panel, n_begin, n, got.data(), ldo);
        ASSERT_NO_FATAL_FAILURE(
            CheckSums(got, nullptr, x, w.f32, {m, n, k, ldx, ldo, n_begin}, 4e-6));
      }
}

// fp8: a row's result does not depend on its batch; below kAmxMinRows the fp8 kernel's bits.
TEST_F(AmxTest, Fp8RowsIndependentOfTheirBatchAndTheFp8KernelBelowTiles) {
  ThreadPool pool(1);
  const int64_t n = 32 * 9 + 3, k = 700;
  Fp8PanelWeights w(n, k, 5, pool);
  const std::vector<float> few = Random(16 * k, 6);
  std::vector<float> many = Random(600 * k, 7);
  for (int64_t r = 0; r < 16; ++r)  // row r of `few` is row 583 - 37r of `many`
    std::copy(few.begin() + r * k, few.begin() + (r + 1) * k, many.begin() + (583 - 37 * r) * k);
  std::vector<float> a(16 * n), b(600 * n);
  amx_(few.data(), 16, k, w.panel, 0, n, a.data(), n);
  amx_(many.data(), 600, k, w.panel, 0, n, b.data(), n);
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(a[r * n + j], b[(583 - 37 * r) * n + j]) << "row " << r << " column " << j;
  const int64_t m = kAmxMinRows - 1;
  std::vector<float> want(m * n, 1.0f), got(m * n, 2.0f);
  Avx512Fp8PanelMatmul(few.data(), m, k, w.panel, 0, n, want.data(), n);
  amx_(few.data(), m, k, w.panel, 0, n, got.data(), n);
  EXPECT_EQ(got, want);
}

TEST(MatmulPathTest, AmxWhereUsableAndAllowedElseTheAvx512DotPath) {
  const testing::ScopedAmxAllowed restore(true);
  EXPECT_EQ(ChosenMatmulPath(KernelKind::kFast, MatmulPrecision::kF32), MatmulPath::kF32);
  EXPECT_EQ(ChosenMatmulPath(KernelKind::kReference, MatmulPrecision::kBf16), MatmulPath::kBf16Dot);
  EXPECT_EQ(MatmulPathName(MatmulPath::kF32), "f32");
  EXPECT_EQ(MatmulPathName(MatmulPath::kBf16Dot), "avx512-bf16-dot");
  EXPECT_EQ(MatmulPathName(MatmulPath::kAmxBf16), "amx-bf16");
  if (!MatmulBf16DotUsed(KernelKind::kFast, MatmulPrecision::kBf16)) {
    EXPECT_EQ(ChosenMatmulPath(KernelKind::kFast, MatmulPrecision::kBf16), MatmulPath::kF32);
    GTEST_SKIP() << "this CPU lacks AVX512_BF16";
  }
  EXPECT_EQ(ChosenMatmulPath(KernelKind::kFast, MatmulPrecision::kBf16),
            DetectAmx().usable ? MatmulPath::kAmxBf16 : MatmulPath::kBf16Dot)
      << DetectAmx().reason;
  SetAmxAllowed(false);
  EXPECT_EQ(ChosenMatmulPath(KernelKind::kFast, MatmulPrecision::kBf16), MatmulPath::kBf16Dot);
  EXPECT_EQ(ChosenMatmulPath(KernelKind::kReference, MatmulPrecision::kBf16), MatmulPath::kBf16Dot);
}

}  // namespace
}  // namespace pd::engine::kernels
