// The AVX-512 matmul over fp8 (e4m3fn) weights in the kPanel32 layout (kernels.h), converted in
// registers: no dequantised copy of the matrix exists. Compiled with -mavx512*; only intrinsics
// and kernels.h here.
//
// Conversion: an e4m3 code c placed as binary16 bits (sign at bit 15, bit 14 clear, exponent and
// mantissa at bits 13..7) is the e4m3 value times 2^-8 exactly (subnormals included, as both
// formats' subnormals sit 8 binades apart), and vcvtph2ps makes f32 of it. The 2^8 is folded into
// the block scale.
//
// Decode (up to kStreamRows rows) reads each group's codes 64 bytes at a time: the 32 rows at k
// and at k + 1, one 16-bit word per pair of rows (2j, 2j + 1). The odd rows' codes are the high
// bytes: an arithmetic shift right by one and a mask make their binary16 bits in place; the even
// rows' codes take one more shift left by 8 first. So a line of 64 codes costs three shifts and
// two masks instead of two sign extensions, two shifts, two masks and two extracts, and each
// vcvtph2ps half is one k of 16 even or 16 odd rows. The block partials are kept per parity
// (rows 0, 2, .., 30 and 1, 3, .., 31), the scales are split the same way, and the totals are
// interleaved back into row order once, at the store.
//
// Per row and 128-wide k block, the products are summed in one FMA chain in k order (the partial
// sum), and the total is fma(partial, scale, total) in block order: the same operations as
// ScalarFp8Matmul (with code * 2^-8 and scale * 2^8, which changes no rounding), so the results are
// bit-identical to it and to ref::MatmulSlice, whatever the batch size.
//
// Decode streams whole groups, several at a time (1-2 rows: 4 and 2 groups; 3-4 rows: one), each
// prefetched ahead into L1. More rows convert one group's k block at a time into an f32 block in
// L1 (16 KiB), then run tiles of up to kTileRows rows over it, the totals kept in `out` between
// blocks.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "engine/fp8_avx512.h"
#include "engine/kernels.h"

namespace pd::engine::kernels {
namespace {

constexpr int64_t kStreamRows = 4;
constexpr int kTileRows = 6;              // 24 accumulators + 2 weight vectors + a broadcast
constexpr int64_t kPrefetchBytes = 1536;  // decode: each group's stream this far ahead (as bf16)

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Clamp16(int64_t v) { return v < 0 ? 0 : (v > 16 ? 16 : v); }

// The scales of one group's k block times 2^8: rows 0..15 in lo, 16..31 in hi.
inline void LoadScales(const float* s, __m512& lo, __m512& hi) {
  const __m512 k256 = _mm512_set1_ps(256.0f);
  lo = _mm512_mul_ps(_mm512_loadu_ps(s), k256);
  hi = _mm512_mul_ps(_mm512_loadu_ps(s + 16), k256);
}

// The binary16 bits (times 2^-8, as Fp8x32) of the codes of 64 bytes v read as 32 words, one
// per pair of rows: the odd rows' (high bytes) and the even rows' (low bytes). Words 0..15 hold the
// first k's 32 rows, words 16..31 the next k's.
inline void PairHalves(__m512i v, __m512i& even, __m512i& odd) {
  const __m512i mask = _mm512_set1_epi16(static_cast<int16_t>(0xBF80));
  odd = _mm512_and_si512(_mm512_srai_epi16(v, 1), mask);
  even = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 1), mask);
}

// Rows 0..15 in lo and 16..31 in hi, split into even rows (0, 2, .., 30) and odd rows (1, .., 31).
inline void SplitParity(__m512 lo, __m512 hi, __m512& even, __m512& odd) {
  const __m512i even_idx =
      _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  even = _mm512_permutex2var_ps(lo, even_idx, hi);
  odd = _mm512_permutex2var_ps(lo, _mm512_add_epi32(even_idx, _mm512_set1_epi32(1)), hi);
}

// The inverse of SplitParity.
inline void MergeParity(__m512 even, __m512 odd, __m512& lo, __m512& hi) {
  const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  lo = _mm512_permutex2var_ps(even, lo_idx, odd);
  hi = _mm512_permutex2var_ps(even, _mm512_add_epi32(lo_idx, _mm512_set1_epi32(8)), odd);
}

struct TileArgs {
  const float* x;  // row 0 at k = 0, row stride ldx
  int64_t ldx;
  const uint8_t* codes;  // first group's codes at k = 0 (stream), or the f32 block (converted)
  int64_t group_bytes;   // between groups' codes
  const float* scales;   // first group's scales, block 0
  int64_t group_scales;  // floats between groups' scales
  int64_t k;             // columns of W
  int64_t b0, b1;        // k blocks [b0, b1): totals start from `out` unless b0 == 0
  float* out;            // row 0, column of the first group; row stride ldo
  int64_t ldo;
  int64_t cols;  // valid columns from the first group's first, up to NG*32
};

// Prefill: out[0..MR) x [0..cols) (+)= x . W^T over k block b0 of one group whose codes are
// already converted: `codes` is an f32 block, 32 floats per k (b1 == b0 + 1); the totals start
// from `out` unless b0 == 0.
template <int MR>
void ConvertedTile(const TileArgs& a) {
  __mmask16 mask[2];
  for (int h = 0; h < 2; ++h)
    mask[h] = static_cast<__mmask16>((1u << Clamp16(a.cols - h * 16)) - 1u);
  __m512 total[MR][2], part[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    for (int h = 0; h < 2; ++h) {
      total[i][h] = a.b0 == 0 ? _mm512_setzero_ps()
                              : _mm512_maskz_loadu_ps(mask[h], a.out + i * a.ldo + h * 16);
      part[i][h] = _mm512_setzero_ps();
    }
  const int64_t k0 = a.b0 * kFp8Block, k1 = Min(a.k, k0 + kFp8Block);
  const float* wf = reinterpret_cast<const float*>(a.codes);
  for (int64_t k = k0; k < k1; ++k, wf += kPanelRows) {
    const __m512 w0 = _mm512_load_ps(wf), w1 = _mm512_load_ps(wf + 16);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xb = _mm512_set1_ps(a.x[i * a.ldx + k]);
      part[i][0] = _mm512_fmadd_ps(xb, w0, part[i][0]);
      part[i][1] = _mm512_fmadd_ps(xb, w1, part[i][1]);
    }
  }
  __m512 s[2];
  LoadScales(a.scales + a.b0 * kPanelRows, s[0], s[1]);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    for (int h = 0; h < 2; ++h) {
      total[i][h] = _mm512_fmadd_ps(part[i][h], s[h], total[i][h]);
      _mm512_mask_storeu_ps(a.out + i * a.ldo + h * 16, mask[h], total[i][h]);
    }
}

// Decode: out[0..MR) x [0..cols) = x . W^T over all k of NG groups, streamed from memory two k at
// a time (PairHalves), each group's stream prefetched kPrefetchBytes ahead. Per parity p (0 even,
// 1 odd) and group g, part[i][g][p] is the chain of row i's products in k order.
template <int MR, int NG>
void StreamTile(const TileArgs& a) {
  __m512 total[MR][NG][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) total[i][g][0] = total[i][g][1] = _mm512_setzero_ps();
  const int64_t kb = Fp8KBlocks(a.k);
  for (int64_t b = 0; b < kb; ++b) {
    __m512 part[MR][NG][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int g = 0; g < NG; ++g) part[i][g][0] = part[i][g][1] = _mm512_setzero_ps();
    const int64_t k0 = b * kFp8Block, k1 = Min(a.k, k0 + kFp8Block);
    // One step: k and k + 1 (kPair), or k alone (the last of an odd k; the next k's bytes are
    // not read).
    auto step = [&](int64_t k, auto pair) __attribute__((always_inline)) {
      constexpr bool kPair = decltype(pair)::value;
      __m512 wv[NG][2][2];  // [group][parity][k, k + 1]
#pragma GCC unroll 4
      for (int g = 0; g < NG; ++g) {
        const uint8_t* wg = a.codes + g * a.group_bytes + k * kPanelRows;
        _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetchBytes), _MM_HINT_T0);
        const __m512i v = kPair ? _mm512_loadu_si512(wg) : _mm512_maskz_loadu_epi8(~0u, wg);
        __m512i h[2];
        PairHalves(v, h[0], h[1]);
        for (int p = 0; p < 2; ++p) {
          wv[g][p][0] = _mm512_cvtph_ps(_mm512_castsi512_si256(h[p]));
          if constexpr (kPair) wv[g][p][1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h[p], 1));
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 x0 = _mm512_set1_ps(a.x[i * a.ldx + k]);
#pragma GCC unroll 4
        for (int g = 0; g < NG; ++g)
          for (int p = 0; p < 2; ++p)
            part[i][g][p] = _mm512_fmadd_ps(x0, wv[g][p][0], part[i][g][p]);
        if constexpr (kPair) {
          const __m512 x1 = _mm512_set1_ps(a.x[i * a.ldx + k + 1]);
#pragma GCC unroll 4
          for (int g = 0; g < NG; ++g)
            for (int p = 0; p < 2; ++p)
              part[i][g][p] = _mm512_fmadd_ps(x1, wv[g][p][1], part[i][g][p]);
        }
      }
    };
    int64_t k = k0;
    for (; k + 2 <= k1; k += 2) step(k, std::true_type{});
    if (k < k1) step(k, std::false_type{});
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) {
      __m512 s[2], sp[2];
      LoadScales(a.scales + g * a.group_scales + b * kPanelRows, s[0], s[1]);
      SplitParity(s[0], s[1], sp[0], sp[1]);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i)
        for (int p = 0; p < 2; ++p)
          total[i][g][p] = _mm512_fmadd_ps(part[i][g][p], sp[p], total[i][g][p]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g) {
    __mmask16 mask[2];
    for (int h = 0; h < 2; ++h)
      mask[h] = static_cast<__mmask16>((1u << Clamp16(a.cols - g * 32 - h * 16)) - 1u);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512 r[2];
      MergeParity(total[i][g][0], total[i][g][1], r[0], r[1]);
      for (int h = 0; h < 2; ++h)
        _mm512_mask_storeu_ps(a.out + i * a.ldo + g * 32 + h * 16, mask[h], r[h]);
    }
  }
}

using TileFn = void (*)(const TileArgs&);
// Decode: rows 1..4, groups per call (and the one-group form for the tail).
constexpr TileFn kStream[] = {nullptr, StreamTile<1, 4>, StreamTile<2, 2>, StreamTile<3, 1>,
                              StreamTile<4, 1>};
constexpr int kStreamGroups[] = {0, 4, 2, 1, 1};
constexpr TileFn kStreamOne[] = {nullptr, StreamTile<1, 1>, StreamTile<2, 1>, StreamTile<3, 1>,
                                 StreamTile<4, 1>};
constexpr TileFn kConvertedTile[] = {nullptr,          ConvertedTile<1>, ConvertedTile<2>,
                                     ConvertedTile<3>, ConvertedTile<4>, ConvertedTile<5>,
                                     ConvertedTile<6>};

void Stream(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w, int64_t g_begin,
            int64_t g_end, int64_t n_end, float* out, int64_t ldo) {
  const int64_t group_bytes = w.k * kPanelRows, kb = Fp8KBlocks(w.k);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int ng = kStreamGroups[rows];
  for (int64_t g = g_begin; g < g_end;) {
    const bool whole = g + ng <= g_end;
    const int step = whole ? ng : 1;
    TileArgs a{x,
               ldx,
               base + g * group_bytes,
               group_bytes,
               w.scales + g * kb * kPanelRows,
               kb * kPanelRows,
               w.k,
               0,
               kb,
               out + g * kPanelRows,
               ldo,
               n_end - g * kPanelRows};
    (whole ? kStream : kStreamOne)[rows](a);
    g += step;
  }
}

// One group's k block [k0, k1) as f32 times 2^-8 into dst (32 floats per k, 64-byte aligned).
void ConvertBlock(const uint8_t* group, int64_t k0, int64_t k1, float* dst) {
  for (int64_t k = k0; k < k1; ++k, dst += kPanelRows) {
    __m512 lo, hi;
    Fp8x32(group + k * kPanelRows, lo, hi);
    _mm512_store_ps(dst, lo);
    _mm512_store_ps(dst + 16, hi);
  }
}

void Converted(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w, int64_t g_begin,
               int64_t g_end, int64_t n_end, float* out, int64_t ldo) {
  alignas(64) float block[kFp8Block * kPanelRows];  // 16 KiB
  const int64_t group_bytes = w.k * kPanelRows, kb = Fp8KBlocks(w.k);
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t g = g_begin; g < g_end; ++g)
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t k0 = b * kFp8Block;
      ConvertBlock(base + g * group_bytes, k0, Min(w.k, k0 + kFp8Block), block);
      for (int64_t t = 0; t < tiles; ++t) {  // balanced tiles (14 rows: 5 + 5 + 4)
        const int64_t m0 = rows * t / tiles, m1 = rows * (t + 1) / tiles;
        TileArgs a{x + m0 * ldx,
                   ldx,
                   reinterpret_cast<const uint8_t*>(block),
                   0,
                   w.scales + g * kb * kPanelRows,
                   0,
                   w.k,
                   b,
                   b + 1,
                   out + m0 * ldo + g * kPanelRows,
                   ldo,
                   n_end - g * kPanelRows};
        kConvertedTile[m1 - m0](a);
      }
    }
}

}  // namespace

void Avx512Fp8PanelMatmul(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w,
                          int64_t n_begin, int64_t n_end, float* out, int64_t ldo) {
  if (rows <= 0 || n_begin >= n_end) return;
  const int64_t g_begin = n_begin / kPanelRows;
  const int64_t g_end = (n_end + kPanelRows - 1) / kPanelRows;
  if (rows <= kStreamRows) {
    Stream(x, rows, ldx, w, g_begin, g_end, n_end, out, ldo);
  } else {
    Converted(x, rows, ldx, w, g_begin, g_end, n_end, out, ldo);
  }
}

}  // namespace pd::engine::kernels
