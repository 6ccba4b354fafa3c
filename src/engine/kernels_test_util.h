// Test helpers (header-only) shared by the matmul kernel tests: random weights in both layouts
// the panel kernels read, and the reference over weights stacked from parts.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kernels.h"
#include "engine/kernels_ref.h"
#include "engine/model_runner_test_util.h"
#include "engine/thread_pool.h"
#include "model/dtype.h"
#include "model/fp8_quant.h"

namespace pd::engine::testing {

// W (n, k) row-major bf16 (or f32) and packed in the kPanel32 layout.
struct Panel32Weights {
  std::vector<float> f32;  // the values the kernel multiplies (bf16 rounded when bf16)
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> packed;
  kernels::WeightMatrix rows, panel;
  Panel32Weights(int64_t n, int64_t k, bool use_bf16, uint64_t seed, ThreadPool& pool) {
    f32 = Random(n * k, seed);
    for (float& v : f32) {
      bf16.push_back(model::F32ToBf16(v));
      if (use_bf16) v = model::Bf16ToF32(bf16.back());
    }
    rows.data = use_bf16 ? static_cast<const void*>(bf16.data()) : f32.data();
    rows.bf16 = use_bf16;
    rows.n = n;
    rows.k = k;
    packed.assign(kernels::Panel32Bytes(n, k, use_bf16), 0xAB);
    panel = kernels::PackPanel32(pool, &rows, 1, packed.data());
  }
};

// W (n, k) quantised to fp8 from random values (rows of different magnitudes, so blocks get
// their own scales): row-major codes with checkpoint-layout scales, the dequantised values, and
// the kPanel32 packing.
struct Fp8PanelWeights {
  std::vector<uint8_t> codes;
  std::vector<float> scales, f32;  // f32: code * block scale, row-major (n, k)
  std::vector<uint8_t> packed;
  kernels::WeightMatrix rows, panel;
  Fp8PanelWeights(int64_t n, int64_t k, uint64_t seed, ThreadPool& pool) {
    f32 = Random(n * k, seed);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < k; ++i) f32[r * k + i] *= static_cast<float>(1 << (r % 7)) / 8;
    const int64_t kb = (k + 127) / 128;
    codes.resize(n * k);
    scales.resize((n + 127) / 128 * kb);
    model::QuantizeFp8Blocks(f32.data(), n, k, codes.data(), scales.data());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < k; ++i)
        f32[r * k + i] = model::Fp8E4m3ToF32(codes[r * k + i]) * scales[r / 128 * kb + i / 128];
    rows.data = codes.data();
    rows.fp8 = true;
    rows.scales = scales.data();
    rows.n = n;
    rows.k = k;
    packed.assign(kernels::Panel32BytesLike(n, rows), 0xAB);
    panel = kernels::PackPanel32(pool, &rows, 1, packed.data());
  }
};

// Reference: out (m, ldo) = x (m, ldx) @ W^T, W the parts' `w` stacked along n.
template <typename Part>
void StackedReference(const std::vector<Part>& parts, const float* x, int64_t m, int64_t ldx,
                      float* out, int64_t ldo) {
  int64_t col = 0;
  for (const Part& p : parts) {
    ref::Matmul(x, m, ldx, p.w, out + col, ldo);
    col += p.w.n;
  }
}

}  // namespace pd::engine::testing
