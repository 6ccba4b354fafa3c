#include "model/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "model/tensor.h"

namespace pd::model {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint16_t HalfBits(_Float16 h) {
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
_Float16 Half(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return h;
}

TEST(DTypeTest, NamesAndParsing) {
  EXPECT_EQ(DTypeName(DType::kF32), "F32");
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeName(DType::kF16), "F16");
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3}) {
    auto parsed = ParseSafetensorsDType(DTypeName(t));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, t);
  }
  auto bad = ParseSafetensorsDType("I64");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("I64"), std::string::npos);
  EXPECT_EQ(*ParseDTypeFlag("bf16"), DType::kBF16);
  EXPECT_EQ(*ParseDTypeFlag("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseDTypeFlag("f32"), DType::kF32);
  EXPECT_EQ(*ParseDTypeFlag("float32"), DType::kF32);
  EXPECT_EQ(*ParseDTypeFlag("f16"), DType::kF16);
  EXPECT_EQ(*ParseDTypeFlag("float16"), DType::kF16);
  EXPECT_EQ(*ParseDTypeFlag("fp8"), DType::kF8E4M3);
  auto bad_flag = ParseDTypeFlag("int8");
  ASSERT_FALSE(bad_flag.ok());
  EXPECT_NE(bad_flag.status().message().find("int8"), std::string::npos);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
}

// Every half value against the compiler's own IEEE conversion, and back.
TEST(DTypeTest, F16ToF32IsExactForAllHalves) {
  for (uint32_t b = 0; b < 65536; ++b) {
    uint16_t h = static_cast<uint16_t>(b);
    float expected = static_cast<float>(Half(h));
    float got = F16ToF32(h);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << b;
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(got)))) << std::hex << b;
    } else {
      ASSERT_EQ(Bits(got), Bits(expected)) << std::hex << b;
      ASSERT_EQ(F32ToF16(got), h) << std::hex << b;  // exact round trip, -0 and subnormals too
    }
  }
}

TEST(DTypeTest, F32ToF16RoundsToNearestEvenLikeTheCompiler) {
  std::mt19937 rng(42);
  // Random bit patterns cover all exponents; a band around the half range covers subnormals,
  // overflow and ties.
  for (int i = 0; i < 2000000; ++i) {
    uint32_t b = rng();
    if (i % 2) b = (b & 0x807fffffu) | ((static_cast<uint32_t>(rng() % 48) + 97u) << 23);
    if (i % 7 == 0) b &= ~0xfffu;  // make exact ties frequent
    float f = FromBits(b);
    uint16_t expected = HalfBits(static_cast<_Float16>(f));
    uint16_t got = F32ToF16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(got)));
    } else {
      ASSERT_EQ(got, expected) << std::hex << b << " " << f;
    }
  }
}

TEST(DTypeTest, F16EdgeCases) {
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // ties to even: overflows to inf
  EXPECT_EQ(F32ToF16(1e9f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e9f), 0xfc00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 ulp: tie to even -> 2
  EXPECT_EQ(F32ToF16(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isinf(F16ToF32(0xfc00)) && F16ToF32(0xfc00) < 0);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(std::nanf("")))));
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(F32ToBf16(FromBits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(F32ToBf16(FromBits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(F32ToBf16(FromBits(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::nanf("")))));
}

TEST(TensorTest, AtReadsEveryDType) {
  float f32[3] = {1.5f, -2.0f, 0.25f};
  uint16_t bf16[3] = {F32ToBf16(1.5f), F32ToBf16(-2.0f), F32ToBf16(0.25f)};
  uint16_t f16[3] = {F32ToF16(1.5f), F32ToF16(-2.0f), F32ToF16(0.25f)};
  TensorView a{DType::kF32, {3}, f32};
  TensorView b{DType::kBF16, {3}, bf16};
  TensorView c{DType::kF16, {1, 3}, f16};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.At(i), f32[i]);
    EXPECT_EQ(b.At(i), f32[i]);
    EXPECT_EQ(c.At(i), f32[i]);
  }
  EXPECT_EQ(c.numel(), 3);
  EXPECT_EQ(c.size_bytes(), 6u);
  EXPECT_EQ(a.size_bytes(), 12u);
}

TEST(TensorTest, ShapeToString) {
  EXPECT_EQ(ShapeToString({}), "[]");
  EXPECT_EQ(ShapeToString({7}), "[7]");
  EXPECT_EQ(ShapeToString({2048, 512}), "[2048, 512]");
}

}  // namespace
}  // namespace pd::model
