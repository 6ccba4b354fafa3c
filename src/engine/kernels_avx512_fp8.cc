// The AVX-512 matmul over fp8 (e4m3fn) weights in the kPanel32 layout (kernels.h), converted in
// registers: no dequantised copy of the matrix exists. Compiled with -mavx512*; only intrinsics
// and kernels.h here.
//
// Conversion: the 32 codes of one group at one k (32 bytes) are sign-extended to 16 bits and
// shifted left by 7 with bit 14 cleared, which puts e4m3's sign, 4 exponent bits and 3 mantissa
// bits where binary16 has them: the binary16 value is the e4m3 value times 2^-8 exactly
// (subnormals included, as both formats' subnormals sit 8 binades apart), and vcvtph2ps makes two
// f32 vectors of it. The 2^8 is folded into the block scale.
//
// Per row and 128-wide k block, the products are summed in one FMA chain (the partial sum), and
// the total is fma(partial, scale, total) in block order: the same operations as ScalarFp8Matmul
// (with code * 2^-8 and scale * 2^8, which changes no rounding), so the results are bit-identical
// to it and to ref::MatmulSlice, whatever the batch size.
//
// Decode (up to kStreamRows rows) streams whole groups, several at a time (1-2 rows: 4 and 2
// groups; 3-4 rows: one), each prefetched ahead into L1, the block partials in registers. More
// rows convert one group's k block at a time into an f32 block in L1 (16 KiB), then run tiles of
// up to kTileRows rows over it, the totals kept in `out` between blocks.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "engine/kernels.h"

namespace pd::engine::kernels {
namespace {

constexpr int64_t kStreamRows = 4;
constexpr int kTileRows = 6;             // 24 accumulators + 2 weight vectors + a broadcast
constexpr int64_t kPrefetchBytes = 768;  // decode: each group's stream this far ahead

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Clamp16(int64_t v) { return v < 0 ? 0 : (v > 16 ? 16 : v); }

// The 32 codes at p as f32 times 2^-8: rows 0..15 in lo, 16..31 in hi.
inline void Convert32(const uint8_t* p, __m512& lo, __m512& hi) {
  const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  __m512i h = _mm512_slli_epi16(_mm512_cvtepi8_epi16(codes), 7);
  h = _mm512_and_si512(h, _mm512_set1_epi16(static_cast<int16_t>(0xBFFF)));
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

// The scales of one group's k block times 2^8: rows 0..15 in lo, 16..31 in hi.
inline void LoadScales(const float* s, __m512& lo, __m512& hi) {
  const __m512 k256 = _mm512_set1_ps(256.0f);
  lo = _mm512_mul_ps(_mm512_loadu_ps(s), k256);
  hi = _mm512_mul_ps(_mm512_loadu_ps(s + 16), k256);
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

// out[0..MR) x [0..cols) = x . W^T over k blocks [b0, b1) of NG groups. kConverted: codes is an
// f32 block of one group (block b0 only, b1 == b0 + 1), 32 floats per k.
template <int MR, int NG, bool kConverted>
void Tile(const TileArgs& a) {
  __mmask16 mask[NG][2];
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g)
    for (int h = 0; h < 2; ++h)
      mask[g][h] = static_cast<__mmask16>((1u << Clamp16(a.cols - g * 32 - h * 16)) - 1u);
  __m512 total[MR][NG][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g)
      for (int h = 0; h < 2; ++h)
        total[i][g][h] =
            a.b0 == 0 ? _mm512_setzero_ps()
                      : _mm512_maskz_loadu_ps(mask[g][h], a.out + i * a.ldo + g * 32 + h * 16);
  for (int64_t b = a.b0; b < a.b1; ++b) {
    __m512 part[MR][NG][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int g = 0; g < NG; ++g) part[i][g][0] = part[i][g][1] = _mm512_setzero_ps();
    const int64_t k0 = b * kFp8Block, k1 = Min(a.k, k0 + kFp8Block);
    for (int64_t k = k0; k < k1; ++k) {
      __m512 wv[NG][2];
#pragma GCC unroll 4
      for (int g = 0; g < NG; ++g) {
        if constexpr (kConverted) {
          const float* wf = reinterpret_cast<const float*>(a.codes) + (k - k0) * 32;
          wv[g][0] = _mm512_load_ps(wf);
          wv[g][1] = _mm512_load_ps(wf + 16);
        } else {
          const uint8_t* wg = a.codes + g * a.group_bytes + k * 32;
          if ((k & 1) == 0)
            _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetchBytes), _MM_HINT_T0);
          Convert32(wg, wv[g][0], wv[g][1]);
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 xb = _mm512_set1_ps(a.x[i * a.ldx + k]);
#pragma GCC unroll 4
        for (int g = 0; g < NG; ++g) {
          part[i][g][0] = _mm512_fmadd_ps(xb, wv[g][0], part[i][g][0]);
          part[i][g][1] = _mm512_fmadd_ps(xb, wv[g][1], part[i][g][1]);
        }
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) {
      __m512 s[2];
      LoadScales(a.scales + g * a.group_scales + b * kPanelRows, s[0], s[1]);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i)
        for (int h = 0; h < 2; ++h)
          total[i][g][h] = _mm512_fmadd_ps(part[i][g][h], s[h], total[i][g][h]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g)
      for (int h = 0; h < 2; ++h)
        _mm512_mask_storeu_ps(a.out + i * a.ldo + g * 32 + h * 16, mask[g][h], total[i][g][h]);
}

using TileFn = void (*)(const TileArgs&);
// Decode: rows 1..4, groups per call (and the one-group form for the tail).
constexpr TileFn kStream[] = {nullptr, Tile<1, 4, false>, Tile<2, 2, false>, Tile<3, 1, false>,
                              Tile<4, 1, false>};
constexpr int kStreamGroups[] = {0, 4, 2, 1, 1};
constexpr TileFn kStreamOne[] = {nullptr, Tile<1, 1, false>, Tile<2, 1, false>, Tile<3, 1, false>,
                                 Tile<4, 1, false>};
constexpr TileFn kConvertedTile[] = {nullptr,          Tile<1, 1, true>, Tile<2, 1, true>,
                                     Tile<3, 1, true>, Tile<4, 1, true>, Tile<5, 1, true>,
                                     Tile<6, 1, true>};

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
    Convert32(group + k * kPanelRows, lo, hi);
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
