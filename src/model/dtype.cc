#include "model/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace pd::model {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

Result<DType> ParseSafetensorsDType(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  return InvalidArgument("unsupported dtype \"" + std::string(name) +
                         "\" (supported: F32, BF16, F16, F8_E4M3)");
}

Result<DType> ParseDTypeFlag(std::string_view name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "float16") return DType::kF16;
  if (name == "fp8" || name == "f8_e4m3") return DType::kF8E4M3;
  return InvalidArgument("unknown dtype \"" + std::string(name) +
                         "\" (expected f32, bf16, f16 or fp8)");
}

// IEEE binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits.
float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, or NaN keeping its payload
  } else if (exp != 0) {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal: value = mant * 2^-24. Normalise the mantissa.
    int e = -14;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    mant &= 0x3ffu;
    bits = sign | (static_cast<uint32_t>(e + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; overflow gives inf; NaN stays (quiet) NaN.
uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  if (exp >= -14) {
    // Normal half. Round the 13 dropped bits to nearest even; a carry bumps the exponent.
    uint32_t half = ((static_cast<uint32_t>(exp + 15)) << 10) | ((abs >> 13) & 0x3ffu);
    uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: rounds to zero
  // Subnormal half: value = m * 2^-24 with m = full_mantissa * 2^(exp - 23 + 24).
  uint32_t full = (abs & 0x7fffffu) | 0x800000u;
  int shift = -exp - 1;  // exp in [-25, -15] -> shift in [14, 24]
  uint32_t m = full >> shift;
  uint32_t rest = full & ((1u << shift) - 1u);
  uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (m & 1u))) ++m;
  return static_cast<uint16_t>(sign | m);
}

float Fp8E4m3ToF32(uint8_t v) {
  const int exp = (v >> 3) & 0xf, mant = v & 0x7;
  float mag;
  if (exp == 0xf && mant == 0x7) {
    mag = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
  } else {
    mag = std::ldexp(static_cast<float>(8 + mant), exp - 10);  // (1 + mant/8) * 2^(exp-7)
  }
  return (v & 0x80) ? -mag : mag;
}

uint8_t F32ToFp8E4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= kFp8E4m3Max) return sign | 0x7e;
  // The grid near a: spacing 2^(e-3) for a in [2^e, 2^(e+1)), e >= -6; below 2^-6 the subnormal
  // spacing 2^-9. a / spacing is exact in f32; nearbyint rounds it to nearest even.
  int e;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const int step_exp = std::max(e - 1, -6) - 3;
  const float units = std::nearbyint(std::ldexp(a, -step_exp));  // multiples of the spacing
  const float r = std::ldexp(units, step_exp);
  if (r >= kFp8E4m3Max) return sign | 0x7e;
  if (r == 0.0f) return sign;
  int re;
  std::frexp(r, &re);
  const int exp = re - 1 + 7;  // biased exponent of the rounded value
  if (exp <= 0) return sign | static_cast<uint8_t>(std::ldexp(r, 9));  // subnormal code
  const int mant = static_cast<int>(std::ldexp(r, -(re - 1) + 3)) - 8;
  return sign | static_cast<uint8_t>(exp << 3) | static_cast<uint8_t>(mant);
}

}  // namespace pd::model
