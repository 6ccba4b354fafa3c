// FP8 (e4m3fn) codes to f32 in AVX-512 registers: KV elements for the attention kernels
// (kernels_avx512.cc, mla_kernels_avx512.cc), weight codes for the fp8 matmuls
// (kernels_avx512_fp8.cc, kernels_amx.cc). Include only from files compiled with
// -mavx512f/bw/vl and -mf16c; everything here has internal linkage, so no inline function is
// shared with code built for another instruction set.
//
// Conversion: each code is sign-extended to 16 bits
// and shifted left by 7 with bit 14 cleared, which puts e4m3's sign, exponent and mantissa where
// binary16 has them; the binary16 value is the e4m3 value times 2^-8 exactly (subnormals too), and
// vcvtph2ps widens it. Multiplying by scale * 2^8 then rounds once, to the same f32 as
// Fp8E4m3ToF32(code) * scale. The NaN codes (S.1111.111, which binary16 would read as 480) are
// set to NaN, as the reference kernels read them.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace pd::engine::kernels {
namespace {

// 16 codes at p (lanes outside m read as 0) times scale256 (= scale * 256).
inline __m512 Fp8x16(const uint8_t* p, __mmask16 m, __m512 scale256) {
  const __m128i codes = _mm_maskz_loadu_epi8(m, p);
  __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7);
  h = _mm256_and_si256(h, _mm256_set1_epi16(static_cast<int16_t>(0xBFFF)));
  const __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), scale256);
  const __m128i low7 = _mm_set1_epi8(0x7f);
  const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(codes, low7), low7);
  return _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(__builtin_nanf("")));
}

// The 32 weight codes at p as f32 times 2^-8: codes 0..15 in lo, 16..31 in hi (weights hold no
// NaN codes, so none is singled out).
inline void Fp8x32(const uint8_t* p, __m512& lo, __m512& hi) {
  const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  __m512i h = _mm512_slli_epi16(_mm512_cvtepi8_epi16(codes), 7);
  h = _mm512_and_si512(h, _mm512_set1_epi16(static_cast<int16_t>(0xBFFF)));
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

}  // namespace
}  // namespace pd::engine::kernels
