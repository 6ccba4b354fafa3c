// Element types of checkpoint tensors and KV caches, and scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/status.h"

namespace pd::model {

// kF8E4M3: float8_e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities,
// S.1111.111 is NaN, largest finite 448), the weights of block-quantised FP8 checkpoints.
enum class DType { kF32, kBF16, kF16, kF8E4M3 };

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : (t == DType::kF8E4M3 ? 1 : 2); }
// "F32", "BF16", "F16", "F8_E4M3": the names safetensors headers use.
std::string_view DTypeName(DType t);
Result<DType> ParseSafetensorsDType(std::string_view name);
// "f32" | "bf16" | "f16" | "fp8" (CLI spelling; also accepts "float32", "bfloat16", "float16",
// "f8_e4m3").
Result<DType> ParseDTypeFlag(std::string_view name);

// FP8 checkpoints (HF's quantization_config quant_method "fp8", DeepSeek-V3 and Qwen3-FP8): a
// weight W (n, k) is stored as e4m3 codes q plus `<name>_scale_inv`, f32 of shape
// (ceil(n/128), ceil(k/128)), one per 128x128 block (edge blocks partial); W = q * scale_inv.
constexpr int64_t kFp8BlockSize = 128;
constexpr float kFp8E4m3Max = 448.0f;

// The exact value of an e4m3fn code (NaN for S.1111.111).
float Fp8E4m3ToF32(uint8_t v);
// Round to nearest even, saturating to +-448 (as the quantisers clamp before casting); NaN gives
// the NaN code.
uint8_t F32ToFp8E4m3(float f);

inline float Bf16ToF32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as PyTorch does; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

}  // namespace pd::model
