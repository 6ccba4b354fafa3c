// The AMX matmul over bf16 weights in the kPanel32 layout (see kernels.h) for many rows of x
// (prefill): x rounded to bf16 (nearest even) and multiplied in 16x16 f32 tiles with TDPBF16PS.
// Compiled with -mamx-tile -mamx-bf16 -mavx512*; only intrinsics and kernels.h here. Only called
// once DetectAmx() (cpu_features.h) has the process's permission for the tile data state.
//
// Tiles (palette 1, all 16 rows of 64 bytes): C 0..3 (two row tiles x the two 16-column halves of
// one 32-row weight group), A 4..5 (16 rows of x, 32 k as bf16), B 6..7 (16 pairs (k, k + 1) of
// 16 columns, each pair one 32-bit word with k in the low half: the order vdpbf16ps reads).
//
// Per call: first every row of x rounded to bf16 into A tiles, one contiguous 1 KiB tile per 16
// rows and 32 k, k blocks of kKc one after the other, rows and k past the ends zero. Then the
// thread's groups kGroupBlock at a time, and for each k block of kKc:
//   - B: the block's groups converted from the panel (a line per k, rows j and 16 + j in word j)
//     to pair tiles, two lines recombined with two shifts and two blends (as the AVX-512 dot
//     kernel does in registers), once for all rows; the next block's lines are prefetched into
//     L2 in equal parts before each tile multiply below;
//   - each pair of row tiles (in L1) against each group of the block (in L2): 4 TDPBF16PS per 32
//     k, the C tiles resumed from and stored to an f32 accumulator block in L2 between k blocks.
// The accumulator block is then copied to out (rows < num_rows, columns < n_end). Measured on
// 512-row llama-1b shapes (one thread, CPU time): converting x once per call instead of per run
// of groups, and the prefetch, gave 1.35-1.45x; k blocks of 512 or runs of 16 groups did not pay.
//
// fp8 weights (F8_E4M3 codes with a scale per row and 128-wide k block) take the same tiles: B is
// the codes converted exactly to bf16 (times 2^-8, as the AVX-512 fp8 kernel converts them: e4m3
// has 4 significant bits), the k blocks are the scale blocks, and each block's tile sums are
// stored to a 4 KiB block and added to the accumulator times the rows' scales (times 2^8), an FMA
// per 16 elements, instead of resumed in the tiles. No dequantised copy of W exists.
//
// A row's output depends only on that row of x and W: the k blocking is fixed, the padding adds
// exact zeros, and each tile row is its own chain. It is not bit for bit the AVX-512 dot kernel's
// (TDPBF16PS sums in its own order and precision), so which kernel ran shows in the last bits.
// GCC 12 warns inside its own _mm512_setzero_si512 (as in the AVX-512 files).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "engine/fp8_avx512.h"
#include "engine/kernels.h"

namespace pd::engine::kernels {
namespace {

constexpr int64_t kTileK = 32;        // k per tile step: 16 pairs, 64 bytes a row
constexpr int64_t kTileBytes = 1024;  // 16 rows x 64 bytes
constexpr int64_t kKc = 256;          // k block: a row-tile pair's A block is 16 KiB (L1)
constexpr int64_t kGroupBlock = 8;    // groups per block: B block kGroupBlock x kKc x 64 bytes
// Rows per AmxMatmul call: bounds a thread's A tiles (kRowBlock x k bf16: 8 MiB at k 8192) and
// accumulator (0.55 MiB, in L2); longer prefill chunks read the weights once per block.
constexpr int64_t kRowBlock = 512;
constexpr int64_t kAccCols = kGroupBlock * kPanelRows + 16;  // accumulator row stride (floats),
                                                             // off 4 KiB multiples (L1 sets)

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Clamp16(int64_t v) { return v < 0 ? 0 : (v > 16 ? 16 : v); }

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The tiles this file uses, configured on the calling thread; released when it goes out of scope.
class TileScope {
 public:
  TileScope() {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.colsb[t] = 64;
      cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// A thread's growable scratch, 64-byte aligned (never shrinks; freed when the thread ends).
struct ThreadBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  ~ThreadBuffer() { std::free(data); }
  template <typename T>
  T* Get(size_t n) {
    const size_t want = (n * sizeof(T) + 63) / 64 * 64;
    if (want > bytes) {
      std::free(data);
      data = std::aligned_alloc(64, want);
      bytes = data ? want : 0;
    }
    return static_cast<T*>(data);
  }
};

// 32 x of one row from x[k] as 16 bf16 pairs (k in the low half), nearest even; k past nk: 0.
inline __m512i PairsOf(const float* x, int64_t nk) {
  const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << Clamp16(nk)) - 1u), x);
  const __m512 hi =
      _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << Clamp16(nk - 16)) - 1u), x + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// A tiles of x rows [0, row_tiles*16), k in [k0, k1): tile (t, s) at dst + (t*steps + s)*1 KiB,
// row r of it x[16t + r, k0 + 32s ..) as bf16; rows past num_rows and k past k1 zero.
void PackA(const float* x, int64_t num_rows, int64_t ldx, int64_t row_tiles, int64_t k0, int64_t k1,
           uint8_t* dst) {
  const int64_t steps = (k1 - k0 + kTileK - 1) / kTileK;
  for (int64_t m = 0; m < row_tiles * 16; ++m) {
    uint8_t* row = dst + (m / 16) * steps * kTileBytes + (m % 16) * 64;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t k = k0 + s * kTileK;
      const __m512i v = m < num_rows ? PairsOf(x + m * ldx + k, k1 - k) : _mm512_setzero_si512();
      _mm512_store_si512(row + s * kTileBytes, v);
    }
  }
}

// B tiles of groups [g0, g1) of the panel, k in [k0, k1) (k0 even, k1 even or the end): tile
// (g - g0, s, half) at dst + ((g - g0)*steps + s)*2 KiB + half*1 KiB, its row p the pairs
// (k, k + 1), k = k0 + 32s + 2p, of rows 16*half + 0..15 of the group; pairs past k1 zero.
void PackB(const uint8_t* base, int64_t group_bytes, int64_t g0, int64_t g1, int64_t k0, int64_t k1,
           uint8_t* dst) {
  const int64_t steps = (k1 - k0 + kTileK - 1) / kTileK;
  constexpr __mmask32 kHigh = 0xAAAAAAAAu;  // the high 16 bits of each word
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* src = base + g * group_bytes;
    uint8_t* out = dst + (g - g0) * steps * 2 * kTileBytes;
    for (int64_t s = 0; s < steps; ++s, out += 2 * kTileBytes)
      for (int64_t p = 0; p < 16; ++p) {
        const int64_t k = k0 + s * kTileK + 2 * p;
        __m512i lo = _mm512_setzero_si512(), hi = lo;
        if (k < k1) {  // line k: word j = (row j, row 16 + j); line k + 1 likewise
          const __m512i a = _mm512_loadu_si512(src + k * 64);
          const __m512i b = _mm512_loadu_si512(src + (k + 1) * 64);
          lo = _mm512_mask_blend_epi16(kHigh, a, _mm512_slli_epi32(b, 16));
          hi = _mm512_mask_blend_epi16(kHigh, _mm512_srli_epi32(a, 16), b);
        }
        _mm512_store_si512(out + p * 64, lo);
        _mm512_store_si512(out + kTileBytes + p * 64, hi);
      }
  }
}

// The 32 codes at p (an fp8 panel's line at one k) as bf16 times 2^-8 in the high half of each
// 32-bit word: rows 0..15 in lo, 16..31 in hi. Exact: the f32 of code * 2^-8 (Fp8x32) keeps at
// most 4 significant bits.
inline void Fp8Line(const uint8_t* p, __m512i& lo, __m512i& hi) {
  __m512 l, h;
  Fp8x32(p, l, h);
  lo = _mm512_castps_si512(l);
  hi = _mm512_castps_si512(h);
}

// PackB for an fp8 panel (32 bytes a k): the same tiles, of the codes as bf16 times 2^-8.
void PackBFp8(const uint8_t* base, int64_t group_bytes, int64_t g0, int64_t g1, int64_t k0,
              int64_t k1, uint8_t* dst) {
  const int64_t steps = (k1 - k0 + kTileK - 1) / kTileK;
  constexpr __mmask32 kHigh = 0xAAAAAAAAu;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* src = base + g * group_bytes;
    uint8_t* out = dst + (g - g0) * steps * 2 * kTileBytes;
    for (int64_t s = 0; s < steps; ++s, out += 2 * kTileBytes)
      for (int64_t p = 0; p < 16; ++p) {
        const int64_t k = k0 + s * kTileK + 2 * p;
        __m512i lo = _mm512_setzero_si512(), hi = lo;
        if (k < k1) {  // word j: (k, k + 1) of row j (lo) and of row 16 + j (hi)
          __m512i a[2], b[2] = {lo, lo};
          Fp8Line(src + k * kPanelRows, a[0], a[1]);
          if (k + 1 < k1) Fp8Line(src + (k + 1) * kPanelRows, b[0], b[1]);
          lo = _mm512_mask_blend_epi16(kHigh, _mm512_srli_epi32(a[0], 16), b[0]);
          hi = _mm512_mask_blend_epi16(kHigh, _mm512_srli_epi32(a[1], 16), b[1]);
        }
        _mm512_store_si512(out + p * 64, lo);
        _mm512_store_si512(out + kTileBytes + p * 64, hi);
      }
  }
}

// C (kMt*16 rows x 32 columns at c, row stride ldc floats) (+)= A tiles (kMt row tiles, each
// `steps` tiles apart) . B tiles of one group over `steps` k steps; starts at zero unless resume.
template <int kMt>
void TileBlock(const uint8_t* a, const uint8_t* b, int64_t steps, float* c, int64_t ldc,
               bool resume) {
  const int64_t stride = ldc * 4;
  float* c1 = c + 16 * ldc;
  if (resume) {
    _tile_loadd(0, c, stride);
    _tile_loadd(1, c + 16, stride);
    if constexpr (kMt == 2) {
      _tile_loadd(2, c1, stride);
      _tile_loadd(3, c1 + 16, stride);
    }
  } else {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (kMt == 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  const uint8_t* a1 = a + steps * kTileBytes;
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, a + s * kTileBytes, 64);
    _tile_loadd(6, b + s * 2 * kTileBytes, 64);
    _tile_loadd(7, b + s * 2 * kTileBytes + kTileBytes, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kMt == 2) {
      _tile_loadd(5, a1 + s * kTileBytes, 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, stride);
  _tile_stored(1, c + 16, stride);
  if constexpr (kMt == 2) {
    _tile_stored(2, c1, stride);
    _tile_stored(3, c1 + 16, stride);
  }
}

// Accumulator rows [0, num_rows), columns [0, cols) into out (row stride ldo).
void StoreAcc(const float* acc, int64_t num_rows, int64_t cols, float* out, int64_t ldo) {
  for (int64_t m = 0; m < num_rows; ++m)
    for (int64_t c = 0; c < cols; c += 16)
      _mm512_mask_storeu_ps(out + m * ldo + c,
                            static_cast<__mmask16>((1u << Clamp16(cols - c)) - 1u),
                            _mm512_load_ps(acc + m * kAccCols + c));
}

// The panel lines of groups [g0, g1), k in [k0, k1) (k_bytes a k: 64 bf16, 32 fp8), to be
// prefetched into L2 in `calls` equal parts while the block before them is multiplied.
struct NextBlock {
  const uint8_t* base = nullptr;
  int64_t group_bytes = 0, k_bytes = 0, g0 = 0, g1 = 0, k0 = 0, k1 = 0, calls = 1;
  void Prefetch(int64_t call) const {
    const int64_t nl = ((k1 - k0) * k_bytes + 63) / 64, lines = (g1 - g0) * nl;
    for (int64_t l = lines * call / calls; l < lines * (call + 1) / calls; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(base + (g0 + l / nl) * group_bytes + k0 * k_bytes +
                                                 (l % nl) * 64),
                   _MM_HINT_T1);
  }
};

// fp8: c (rows x 32 columns, row stride kAccCols) (+)= part (rows x 32, row stride kPanelRows)
// times the group's scales of the k block (times 2^8, the codes' 2^-8); set unless resume.
void ScaleInto(const float* part, int64_t rows, const float* scales, float* c, bool resume) {
  const __m512 k256 = _mm512_set1_ps(256.0f);
  const __m512 s[2] = {_mm512_mul_ps(_mm512_loadu_ps(scales), k256),
                       _mm512_mul_ps(_mm512_loadu_ps(scales + 16), k256)};
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < 2; ++h) {
      const __m512 p = _mm512_load_ps(part + r * kPanelRows + h * 16);
      float* cr = c + r * kAccCols + h * 16;
      _mm512_store_ps(
          cr, resume ? _mm512_fmadd_ps(p, s[h], _mm512_load_ps(cr)) : _mm512_mul_ps(p, s[h]));
    }
}

// out[0..num_rows) x [32*g_begin, n_end) = x . W^T over groups [g_begin, g_end), with tiles.
// kFp8: W's codes converted to bf16 tiles (PackBFp8), k blocks of one scale block each, and each
// block's tile sums scaled into the accumulator (ScaleInto) instead of resumed in the tiles.
template <bool kFp8>
void AmxMatmul(const float* x, int64_t num_rows, int64_t ldx, const WeightMatrix& w,
               int64_t g_begin, int64_t g_end, int64_t n_end, float* out, int64_t ldo) {
  constexpr int64_t kc = kFp8 ? kFp8Block : kKc, k_bytes = kFp8 ? kPanelRows : 2 * kPanelRows;
  thread_local ThreadBuffer a_buf, b_buf, acc_buf, part_buf;
  const int64_t row_tiles = (num_rows + 15) / 16, pairs = (row_tiles + 1) / 2;
  const int64_t max_steps = kc / kTileK, k_blocks = (w.k + kc - 1) / kc;
  const int64_t a_block = row_tiles * max_steps * kTileBytes;  // bytes of one k block of A
  uint8_t* a = a_buf.Get<uint8_t>(k_blocks * a_block);
  uint8_t* b = b_buf.Get<uint8_t>(kGroupBlock * max_steps * 2 * kTileBytes);
  float* acc = acc_buf.Get<float>(row_tiles * 16 * kAccCols);
  float* part = part_buf.Get<float>(32 * kPanelRows);  // fp8: one tile pair's block sums (4 KiB)
  if (a == nullptr || b == nullptr || acc == nullptr || part == nullptr) __builtin_trap();  // OOM
  for (int64_t kb = 0; kb < k_blocks; ++kb)  // x once for every group block
    PackA(x, num_rows, ldx, row_tiles, kb * kc, Min(w.k, (kb + 1) * kc), a + kb * a_block);
  NextBlock next{static_cast<const uint8_t*>(w.data), w.k * k_bytes, k_bytes};
  const TileScope tiles;
  for (int64_t gb = g_begin; gb < g_end; gb += kGroupBlock) {
    const int64_t ge = Min(g_end, gb + kGroupBlock);
    for (int64_t k0 = 0; k0 < w.k; k0 += kc) {
      const int64_t k1 = Min(w.k, k0 + kc), steps = (k1 - k0 + kTileK - 1) / kTileK;
      (kFp8 ? PackBFp8 : PackB)(next.base, next.group_bytes, gb, ge, k0, k1, b);
      // The next block's weights come into L2 meanwhile: the same groups' next k block, or the
      // next run of groups' first.
      next.g0 = k1 < w.k ? gb : ge;
      next.g1 = k1 < w.k ? ge : Min(g_end, ge + kGroupBlock);
      next.k0 = k1 < w.k ? k1 : 0;
      next.k1 = k1 < w.k ? Min(w.k, k1 + kc) : Min(w.k, kc);
      next.calls = pairs * (ge - gb);
      const uint8_t* ak = a + (k0 / kc) * a_block;
      int64_t call = 0;
      for (int64_t t = 0; t < row_tiles; t += 2) {
        const uint8_t* at = ak + t * steps * kTileBytes;
        const bool two = t + 1 < row_tiles;
        for (int64_t g = gb; g < ge; ++g, ++call) {
          next.Prefetch(call);
          const uint8_t* bg = b + (g - gb) * steps * 2 * kTileBytes;
          float* c = acc + t * 16 * kAccCols + (g - gb) * kPanelRows;
          if constexpr (kFp8) {
            (two ? TileBlock<2> : TileBlock<1>)(at, bg, steps, part, kPanelRows, false);
            const float* scales = w.scales + (g * k_blocks + k0 / kc) * kPanelRows;
            ScaleInto(part, two ? 32 : 16, scales, c, k0 > 0);
          } else {
            (two ? TileBlock<2> : TileBlock<1>)(at, bg, steps, c, kAccCols, k0 > 0);
          }
        }
      }
    }
    StoreAcc(acc, num_rows, Min(n_end, ge * kPanelRows) - gb * kPanelRows, out + gb * kPanelRows,
             ldo);
  }
}

// AMX from kAmxMinRows rows of bf16 weights with even k or of fp8 weights; otherwise the AVX-512
// dot kernel (which itself takes f32 weights and odd k to its f32 path, fp8 to the fp8 kernel).
template <PanelStream kS>
void MatmulPanelAmx(const float* x, int64_t num_rows, int64_t ldx, const WeightMatrix& w,
                    int64_t n_begin, int64_t n_end, float* out, int64_t ldo) {
  if (num_rows < kAmxMinRows || !(w.fp8 || (w.bf16 && w.k % 2 == 0)))
    return Avx512PanelDotMatmul(kS)(x, num_rows, ldx, w, n_begin, n_end, out, ldo);
  if (n_begin >= n_end) return;
  for (int64_t r = 0; r < num_rows; r += kRowBlock)
    (w.fp8 ? AmxMatmul<true> : AmxMatmul<false>)(x + r * ldx, Min(kRowBlock, num_rows - r), ldx, w,
                                                 n_begin / kPanelRows,
                                                 (n_end + kPanelRows - 1) / kPanelRows, n_end,
                                                 out + r * ldo, ldo);
}

}  // namespace

MatmulFn AmxPanelDotMatmul(PanelStream stream) {
  return stream == PanelStream::kMulti ? &MatmulPanelAmx<PanelStream::kMulti>
                                       : &MatmulPanelAmx<PanelStream::kSingle>;
}

}  // namespace pd::engine::kernels
