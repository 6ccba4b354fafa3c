// Element types of checkpoint tensors and KV caches, and scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/status.h"

namespace pd::model {

enum class DType { kF32, kBF16, kF16 };

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
// "F32", "BF16", "F16": the names safetensors headers use.
std::string_view DTypeName(DType t);
Result<DType> ParseSafetensorsDType(std::string_view name);
// "f32" | "bf16" | "f16" (CLI spelling; also accepts "float32", "bfloat16", "float16").
Result<DType> ParseDTypeFlag(std::string_view name);

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
