// The two ways the AVX-512 panel matmul streams decode batches (PanelStream): the same bits as each
// other at every decode batch size, shape and column slice, the bf16-dot kernel bit for bit
// ref::MatmulBf16Dot in both, and the choice per CPU (and its override) reaching the kernel table.
#include <gtest/gtest.h>

#include <vector>

#include "engine/cpu_features.h"
#include "engine/kernels.h"
#include "engine/kernels_ref.h"
#include "engine/kernels_test_util.h"
#include "engine/thread_pool.h"
#include "model/dtype.h"

namespace pd::engine::kernels {
namespace {

using pd::engine::testing::Panel32Weights;
using pd::engine::testing::Random;

class PanelStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!IsaSupported(IsaLevel::kAvx512)) GTEST_SKIP() << "this CPU lacks avx512";
  }
  void TearDown() override { ClearForcedPanelStream(); }
};

// n: 1 to 9 groups and a partial last one, so passes of 4 (and 2) groups leave every remainder;
// n_begin: the whole matrix and a slice from group 1.
TEST_F(PanelStreamTest, SingleAndMultiGiveTheSameBitsAtEveryDecodeBatch) {
  ThreadPool pool(1);
  for (bool use_bf16 : {false, true})
    for (int64_t n : {5, 64, 100, 32 * 5 + 7, 32 * 9})
      for (int64_t k : {1, 17, 64, 300})
        for (int64_t m : {1, 2, 3, 4}) {
          Panel32Weights sw(n, k, use_bf16, n * 31 + k, pool);
          const int64_t ldx = k + 5, ldo = n + 3;
          const std::vector<float> x = Random(m * ldx, m * 7 + k);
          for (int64_t n_begin : {int64_t{0}, int64_t{32}}) {
            if (n_begin >= n) continue;
            std::vector<float> single(m * ldo, -7.0f), multi(m * ldo, -7.0f);
            Avx512PanelMatmul(PanelStream::kSingle)(x.data(), m, ldx, sw.panel, n_begin, n,
                                                    single.data(), ldo);
            Avx512PanelMatmul(PanelStream::kMulti)(x.data(), m, ldx, sw.panel, n_begin, n,
                                                   multi.data(), ldo);
            ASSERT_EQ(single, multi) << "bf16=" << use_bf16 << " n=" << n << " k=" << k
                                     << " m=" << m << " n_begin=" << n_begin;
          }
        }
}

TEST_F(PanelStreamTest, Bf16DotEqualsTheReferenceBitForBitInBothWays) {
  if (!DetectCpuFeatures().avx512_bf16) GTEST_SKIP() << "this CPU lacks AVX512_BF16";
  ThreadPool pool(1);
  for (PanelStream stream : {PanelStream::kSingle, PanelStream::kMulti})
    for (int64_t n : {5, 100, 32 * 5 + 7, 32 * 9})
      for (int64_t k : {2, 64, 2100})
        for (int64_t m : {1, 2, 3, 4}) {
          Panel32Weights sw(n, k, true, n * 13 + k, pool);
          const int64_t ldx = k + 3, ldo = n + 2, n_begin = n > 64 ? 64 : 0;
          std::vector<float> x = Random(m * ldx, m + 3 * k);
          x[0] = 1e-39f;  // a denormal: zero in bf16
          std::vector<float> all(m * n), want(m * ldo, -7.0f), got(m * ldo, -7.0f);
          ref::MatmulBf16Dot(x.data(), m, ldx, sw.rows, all.data(), n);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = n_begin; j < n; ++j) want[i * ldo + j] = all[i * n + j];
          Avx512PanelDotMatmul(stream)(x.data(), m, ldx, sw.panel, n_begin, n, got.data(), ldo);
          ASSERT_EQ(got, want) << PanelStreamName(stream) << " n=" << n << " k=" << k << " m=" << m;
        }
}

TEST_F(PanelStreamTest, TheCpusChoiceOrTheForcedOneIsWhatTheTableRuns) {
  const PanelStream want =
      DetectCpuFeatures().vendor == CpuVendor::kAmd ? PanelStream::kSingle : PanelStream::kMulti;
  EXPECT_EQ(ChosenPanelStream(), want);
  EXPECT_EQ(KernelsFor(IsaLevel::kAvx512).matmul_panel, Avx512PanelMatmul(want));
  for (PanelStream forced : {PanelStream::kSingle, PanelStream::kMulti}) {
    ForcePanelStream(forced);
    EXPECT_EQ(ChosenPanelStream(), forced);
    const IsaKernels& isa = KernelsFor(IsaLevel::kAvx512);
    EXPECT_EQ(isa.matmul_panel, Avx512PanelMatmul(forced)) << PanelStreamName(forced);
    EXPECT_EQ(isa.matmul_panel_bf16_dot, Avx512PanelDotMatmul(forced));
  }
  EXPECT_NE(Avx512PanelMatmul(PanelStream::kSingle), Avx512PanelMatmul(PanelStream::kMulti));
  ClearForcedPanelStream();
  EXPECT_EQ(ChosenPanelStream(), want);
}

}  // namespace
}  // namespace pd::engine::kernels
