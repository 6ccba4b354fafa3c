// The fp8 (e4m3 with 128-wide k block scales) matmuls: the reference against a float64 sum of the
// dequantised weights, and every fast kernel (row-major and kPanel32, every ISA this CPU has)
// against the reference bit for bit, on odd shapes and partial blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/cpu_features.h"
#include "engine/kernels.h"
#include "engine/kernels_ref.h"
#include "engine/kernels_test_util.h"
#include "engine/model_runner_test_util.h"
#include "engine/thread_pool.h"
#include "model/dtype.h"
#include "model/fp8_quant.h"

namespace pd::engine::kernels {
namespace {

using pd::engine::testing::Random;

// W (n, k) quantised from random values: codes and checkpoint-layout scales.
struct Fp8Weights {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  WeightMatrix w;
  Fp8Weights(int64_t n, int64_t k, uint64_t seed) {
    std::vector<float> f = Random(n * k, seed);
    for (int64_t r = 0; r < n; ++r)  // rows of different magnitudes: blocks get their own scales
      for (int64_t i = 0; i < k; ++i) f[r * k + i] *= std::ldexp(1.0f, static_cast<int>(r % 7) - 3);
    codes.resize(n * k);
    scales.resize(((n + 127) / 128) * ((k + 127) / 128));
    model::QuantizeFp8Blocks(f.data(), n, k, codes.data(), scales.data());
    w.data = codes.data();
    w.fp8 = true;
    w.scales = scales.data();
    w.n = n;
    w.k = k;
  }
  double At(int64_t r, int64_t i) const {
    return static_cast<double>(model::Fp8E4m3ToF32(codes[r * w.k + i])) *
           scales[(r / 128) * ((w.k + 127) / 128) + i / 128];
  }
};

constexpr int64_t kNs[] = {1, 31, 33, 130};
constexpr int64_t kKs[] = {1, 7, 128, 129, 300};
constexpr int64_t kRows[] = {1, 2, 3, 4, 5, 7, 13};

TEST(Fp8RefTest, MatmulIsTheDequantisedProductToF32Rounding) {
  for (int64_t n : kNs)
    for (int64_t k : kKs) {
      const Fp8Weights fw(n, k, n * 1000 + k);
      const int64_t m = 3;
      const std::vector<float> x = Random(m * k, k);
      std::vector<float> out(m * n);
      ref::Matmul(x.data(), m, k, fw.w, out.data(), n);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t r = 0; r < n; ++r) {
          double want = 0, mag = 0;
          for (int64_t c = 0; c < k; ++c) {
            want += x[i * k + c] * fw.At(r, c);
            mag += std::fabs(x[i * k + c] * fw.At(r, c));
          }
          ASSERT_NEAR(out[i * n + r], want, 1e-6 * mag + 1e-30) << n << "x" << k;
        }
    }
}

class Fp8IsaTest : public ::testing::TestWithParam<IsaLevel> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) GTEST_SKIP() << "this CPU lacks " << IsaLevelName(GetParam());
    isa_ = &KernelsFor(GetParam());
  }
  const IsaKernels* isa_ = nullptr;
};

TEST_P(Fp8IsaTest, RowMajorMatmulEqualsTheReferenceBitForBit) {
  for (int64_t n : kNs)
    for (int64_t k : kKs)
      for (int64_t m : {1, 5}) {
        const Fp8Weights fw(n, k, n + k);
        const std::vector<float> x = Random(m * (k + 3), m + k);
        std::vector<float> want(m * n), got(m * n, -1.0f);
        ref::Matmul(x.data(), m, k + 3, fw.w, want.data(), n);
        isa_->matmul(x.data(), m, k + 3, fw.w, 0, n, got.data(), n);
        ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << n << "x" << k;
      }
}

// Stacked parts packed into kPanel32: each row keeps its own part's block scales.
struct PackedFp8 {
  std::vector<Fp8Weights> parts;
  std::vector<uint8_t> packed;
  WeightMatrix w;
  PackedFp8(const std::vector<int64_t>& ns, int64_t k, ThreadPool& pool) {
    std::vector<WeightMatrix> srcs;
    int64_t n = 0;
    for (int64_t p : ns) {
      parts.emplace_back(p, k, 50 + p + k);
      n += p;
    }
    for (const Fp8Weights& p : parts) srcs.push_back(p.w);
    packed.assign(Panel32BytesLike(n, srcs[0]), 0xAB);
    w = PackPanel32(pool, srcs.data(), static_cast<int>(srcs.size()), packed.data());
  }
  void Reference(const float* x, int64_t m, int64_t ldx, float* out, int64_t ldo) const {
    testing::StackedReference(parts, x, m, ldx, out, ldo);
  }
};

TEST_P(Fp8IsaTest, PanelMatmulEqualsTheReferenceBitForBitAtEveryBatchSize) {
  if (isa_->matmul_panel == nullptr) GTEST_SKIP() << isa_->name << " keeps row-major weights";
  ThreadPool pool(1);
  for (const std::vector<int64_t>& ns :
       std::vector<std::vector<int64_t>>{{1}, {33}, {130, 5}, {64, 31, 97}})
    for (int64_t k : kKs) {
      const PackedFp8 pw(ns, k, pool);
      ASSERT_TRUE(pw.w.fp8);
      ASSERT_EQ(pw.w.layout, WeightLayout::kPanel32);
      for (int64_t m : kRows) {
        const int64_t n = pw.w.n, ldo = n + 5;
        const std::vector<float> x = Random(m * k, 7 * m + k);
        std::vector<float> want(m * ldo, -2.0f), got(m * ldo, -2.0f);
        pw.Reference(x.data(), m, k, want.data(), ldo);
        isa_->matmul_panel(x.data(), m, k, pw.w, 0, n, got.data(), ldo);
        ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0)
            << isa_->name << " n " << n << " k " << k << " rows " << m;
        // A slice from a later group writes its columns only, the same bits.
        if (n > 32) {
          std::vector<float> slice(m * ldo, -3.0f);
          isa_->matmul_panel(x.data(), m, k, pw.w, 32, n, slice.data(), ldo);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t c = 0; c < ldo; ++c)
              ASSERT_EQ(slice[i * ldo + c], c >= 32 && c < n ? want[i * ldo + c] : -3.0f);
        }
      }
    }
}

TEST_P(Fp8IsaTest, ParallelMatmulOverPackedWeightsEqualsTheReference) {
  if (isa_->matmul_panel == nullptr) GTEST_SKIP() << isa_->name << " keeps row-major weights";
  ThreadPool pool(3);
  const PackedFp8 pw({200, 77}, 300, pool);
  for (int64_t m : {1, 2, 4, 9}) {
    const std::vector<float> x = Random(m * 300, m);
    std::vector<float> want(m * pw.w.n), got(m * pw.w.n);
    pw.Reference(x.data(), m, 300, want.data(), pw.w.n);
    ParallelMatmul(pool, *isa_, x.data(), m, 300, pw.w, got.data(), pw.w.n);
    ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << m;
  }
}

// Every finite code, subnormals and negative zero included, converts exactly (scale 1, x a unit
// vector), at every k of 1, 2 and 3 (decode reads two k at a time, and an odd k's last alone).
TEST_P(Fp8IsaTest, EveryCodeConvertsExactly) {
  std::vector<uint8_t> finite;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) finite.push_back(static_cast<uint8_t>(c));
  const int64_t n = static_cast<int64_t>(finite.size());
  ThreadPool pool(1);
  for (int64_t k = 1; k <= 3; ++k) {
    // W[r, c] = finite[(r + 37 c) % n]: each column holds every code, in a different order.
    std::vector<uint8_t> codes(n * k);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) codes[r * k + c] = finite[(r + 37 * c) % n];
    std::vector<float> scales((n + 127) / 128, 1.0f);
    WeightMatrix w;
    w.data = codes.data();
    w.fp8 = true;
    w.scales = scales.data();
    w.n = n;
    w.k = k;
    std::vector<uint8_t> packed(Panel32BytesLike(n, w));
    const WeightMatrix pw = PackPanel32(pool, &w, 1, packed.data());
    for (int64_t m : {1, 2, 6})
      for (int64_t c = 0; c < k; ++c) {
        std::vector<float> x(m * k, 0.0f);
        x[(m - 1) * k + c] = 1.0f;  // the last row picks column c
        std::vector<float> got(m * n);
        isa_->matmul(x.data(), m, k, w, 0, n, got.data(), n);
        for (int64_t r = 0; r < n; ++r)
          ASSERT_EQ(got[(m - 1) * n + r], model::Fp8E4m3ToF32(codes[r * k + c]))
              << "code " << int{codes[r * k + c]} << " k " << k << " column " << c;
        if (isa_->matmul_panel == nullptr) continue;
        isa_->matmul_panel(x.data(), m, k, pw, 0, n, got.data(), n);
        for (int64_t r = 0; r < n; ++r)
          ASSERT_EQ(got[(m - 1) * n + r], model::Fp8E4m3ToF32(codes[r * k + c]))
              << "panel, code " << int{codes[r * k + c]} << " k " << k << " column " << c
              << " rows " << m;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Fp8IsaTest,
                         ::testing::Values(IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512),
                         [](const auto& info) { return std::string(IsaLevelName(info.param)); });

}  // namespace
}  // namespace pd::engine::kernels
