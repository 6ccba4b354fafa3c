// The AVX-512 matmul over weights in the kPanel32 layout (see kernels.h), for every batch size:
// decode (a few rows, bound by memory bandwidth) and prefill (hundreds of rows, bound by the FMA
// rate). Compiled with -mavx512*; only intrinsics and kernels.h here.
//
// One micro-kernel serves both: MR rows of x against NG groups of 32 weight rows, 2*MR*NG f32
// accumulators; per k it loads each group's 32 weights (64 bytes of bf16, split into two f32
// vectors exactly with a shift and a mask), broadcasts x[i, k] and issues 2*NG FMAs per row.
// Every output element is a single FMA chain over k in order, whatever MR, NG or the blocking, so
// results are bit-identical across batch sizes (a blocked pass resumes its chain from `out`).
//
// Decode (rows <= kStreamRows) walks each group's whole k in one pass, several groups at once,
// x read in place. More rows block k (kKc) and groups (kGroupsPerBlock, in L2), pack each block
// of x rows k-major (in L1) and pass every row block over the groups. Every path prefetches ahead
// of each weight stream.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "engine/kernels.h"

namespace pd::engine::kernels {
namespace {

constexpr int64_t kStreamRows = 4;      // up to this many rows: one pass over k per group
constexpr int64_t kConvertRows = 64;    // from this many rows, bf16 blocks are converted first
constexpr int64_t kKc = 384;            // k block of the blocked path
constexpr int64_t kGroupsPerBlock = 8;  // groups per W block of the blocked path (L2)
constexpr int kMaxMr = 14;              // 28 accumulators + 2 weight vectors + 1 broadcast
constexpr int64_t kPrefetchK = 24;      // decode: prefetch this many k steps ahead (1.5 KiB bf16)

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Clamp16(int64_t v) { return v < 0 ? 0 : (v > 16 ? 16 : v); }

// The 32 weights of one group at k as f32: rows 0..15 in lo, 16..31 in hi.
template <bool kBf16>
inline void LoadK(const uint8_t* group, int64_t k, __m512& lo, __m512& hi) {
  if constexpr (kBf16) {
    const __m512i v = _mm512_loadu_si512(group + k * 64);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  } else {
    const float* p = reinterpret_cast<const float*>(group + k * 128);
    lo = _mm512_loadu_ps(p);
    hi = _mm512_loadu_ps(p + 16);
  }
}

struct MicroArgs {
  const float* x;  // kPacked: x[(k - k0)*MR + i]; else x[i*ldx + k]
  int64_t ldx;
  const uint8_t* w;  // first group's weights at k0
  int64_t group_bytes;
  int64_t k0, k1;
  float* out;  // row m0, column of the first group
  int64_t ldo;
  int64_t cols;  // valid columns from the first group's first, up to NG*32
};

// out[0..MR) x [0..cols) (+)= x[0..MR, k0..k1) . W[groups, k0..k1)^T; starts the chains at zero
// when k0 == 0, else from out.
template <int MR, int NG, bool kBf16, bool kPacked>
void Micro(const MicroArgs& a) {
  __mmask16 mask[NG][2];
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g)
    for (int h = 0; h < 2; ++h)
      mask[g][h] = static_cast<__mmask16>((1u << Clamp16(a.cols - g * 32 - h * 16)) - 1u);
  __m512 acc[MR][NG][2];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g)
      for (int h = 0; h < 2; ++h)
        acc[i][g][h] = a.k0 == 0
                           ? _mm512_setzero_ps()
                           : _mm512_maskz_loadu_ps(mask[g][h], a.out + i * a.ldo + g * 32 + h * 16);
  const uint8_t* w = a.w;
  const int64_t step = kBf16 ? 64 : 128;
  const float* xk = a.x;
  const int64_t kn = a.k1 - a.k0;
  for (int64_t k = 0; k < kn; ++k, xk += kPacked ? MR : 1) {
    __m512 wv[NG][2];
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) {
      _mm_prefetch(reinterpret_cast<const char*>(w + g * a.group_bytes + (k + kPrefetchK) * step),
                   _MM_HINT_T0);
      LoadK<kBf16>(w + g * a.group_bytes, k, wv[g][0], wv[g][1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 xb = _mm512_set1_ps(kPacked ? xk[i] : xk[i * a.ldx + a.k0]);
#pragma GCC unroll 4
      for (int g = 0; g < NG; ++g) {
        acc[i][g][0] = _mm512_fmadd_ps(xb, wv[g][0], acc[i][g][0]);
        acc[i][g][1] = _mm512_fmadd_ps(xb, wv[g][1], acc[i][g][1]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g)
      for (int h = 0; h < 2; ++h)
        _mm512_mask_storeu_ps(a.out + i * a.ldo + g * 32 + h * 16, mask[g][h], acc[i][g][h]);
}

using MicroFn = void (*)(const MicroArgs&);

template <bool kBf16, int... MR>
constexpr MicroFn kPackedMicro[] = {nullptr, Micro<MR, 1, kBf16, true>...};
template <bool kBf16>
constexpr const MicroFn* PackedTable() {
  return kPackedMicro<kBf16, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14>;
}

// Streaming (decode) kernels by rows: NG groups per pass, enough chains to hide FMA latency.
template <bool kBf16>
constexpr MicroFn kStream[] = {nullptr, Micro<1, 4, kBf16, false>, Micro<2, 4, kBf16, false>,
                               Micro<3, 3, kBf16, false>, Micro<4, 2, kBf16, false>};
constexpr int kStreamGroups[] = {0, 4, 4, 3, 2};
template <bool kBf16>
constexpr MicroFn kStream1[] = {nullptr, Micro<1, 1, kBf16, false>, Micro<2, 1, kBf16, false>,
                                Micro<3, 1, kBf16, false>, Micro<4, 1, kBf16, false>};

template <bool kBf16>
void Stream(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w, int64_t g_begin,
            int64_t g_end, int64_t n_end, float* out, int64_t ldo) {
  const int64_t group_bytes = w.k * kPanelRows * (kBf16 ? 2 : 4);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int ng = kStreamGroups[rows];
  for (int64_t g = g_begin; g < g_end; g += ng) {
    MicroArgs a{x,
                ldx,
                base + g * group_bytes,
                group_bytes,
                0,
                w.k,
                out + g * kPanelRows,
                ldo,
                n_end - g * kPanelRows};
    if (g + ng <= g_end) {
      kStream<kBf16>[rows](a);
    } else {
      for (int64_t r = g; r < g_end;
           ++r, a.w += group_bytes, a.out += kPanelRows, a.cols -= kPanelRows)
        kStream1<kBf16>[rows](a);
    }
  }
}

// x[m0..m1, k0..k1) k-major into dst: dst[(k - k0)*(m1 - m0) + i], so the micro-kernel's
// broadcasts read one sequential stream (rows of x lie a multiple of 4 KiB apart and would
// otherwise fight over the same L1 sets).
void PackX(const float* x, int64_t ldx, int64_t m0, int64_t m1, int64_t k0, int64_t k1,
           float* dst) {
  const int64_t mr = m1 - m0;
  for (int64_t i = 0; i < mr; ++i) {
    const float* row = x + (m0 + i) * ldx;
    for (int64_t k = k0; k < k1; ++k) dst[(k - k0) * mr + i] = row[k];
  }
}

// Row blocks balanced in size (14, 14, 4 would waste a pass: 11, 11, 10 do not).
inline int64_t RowBlockBegin(int64_t rows, int64_t b, int64_t blocks) { return rows * b / blocks; }

// A thread's growable scratch (never shrinks; freed when the thread ends).
struct ThreadScratch {
  float* data = nullptr;
  size_t floats = 0;
  ~ThreadScratch() { std::free(data); }
  float* Get(size_t n) {
    if (n > floats) {
      std::free(data);
      data = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
      floats = data ? n : 0;
    }
    return data;
  }
};

// Groups [g0, g1) of a bf16 panel, k in [k0, k1), as f32 panels (exact) into dst.
void ConvertGroups(const uint8_t* base, int64_t group_bytes, int64_t g0, int64_t g1, int64_t k0,
                   int64_t k1, float* dst) {
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* src = base + g * group_bytes + k0 * 64;
    for (int64_t k = 0; k < k1 - k0; ++k, dst += kPanelRows) {
      __m512 lo, hi;
      LoadK<true>(src, k, lo, hi);
      _mm512_store_ps(dst, lo);
      _mm512_store_ps(dst + 16, hi);
    }
  }
}

// k in blocks of kKc; for each block: x packed once (k-major per row block, each in L1 when
// used), then each run of kGroupsPerBlock groups (in L2) against every row block. With many rows
// the run's bf16 weights are first converted to f32 (exact, once for all row blocks), which
// leaves the micro-kernel nothing but loads and FMAs.
template <bool kBf16>
void Blocked(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w, int64_t g_begin,
             int64_t g_end, int64_t n_end, float* out, int64_t ldo) {
  thread_local ThreadScratch x_scratch, w_scratch;
  const int64_t group_bytes = w.k * kPanelRows * (kBf16 ? 2 : 4);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const bool convert = kBf16 && rows >= kConvertRows;
  const MicroFn* table = convert ? PackedTable<false>() : PackedTable<kBf16>();
  const int64_t blocks = (rows + kMaxMr - 1) / kMaxMr;
  float* xp = x_scratch.Get(rows * kKc);
  float* wf = convert ? w_scratch.Get(kGroupsPerBlock * kKc * kPanelRows) : nullptr;
  if (xp == nullptr || (convert && wf == nullptr)) __builtin_trap();  // out of memory
  for (int64_t k0 = 0; k0 < w.k; k0 += kKc) {
    const int64_t k1 = Min(w.k, k0 + kKc), kc = k1 - k0;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t m0 = RowBlockBegin(rows, b, blocks), m1 = RowBlockBegin(rows, b + 1, blocks);
      PackX(x, ldx, m0, m1, k0, k1, xp + m0 * kc);
    }
    for (int64_t gb = g_begin; gb < g_end; gb += kGroupsPerBlock) {
      const int64_t ge = Min(g_end, gb + kGroupsPerBlock);
      if (convert) ConvertGroups(base, group_bytes, gb, ge, k0, k1, wf);
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t m0 = RowBlockBegin(rows, b, blocks), m1 = RowBlockBegin(rows, b + 1, blocks);
        for (int64_t g = gb; g < ge; ++g) {
          const uint8_t* wg =
              convert ? reinterpret_cast<const uint8_t*>(wf + (g - gb) * kc * kPanelRows)
                      : base + g * group_bytes + k0 * (kBf16 ? 64 : 128);
          MicroArgs a{xp + m0 * kc,          0, wg, 0, k0, k1, out + m0 * ldo + g * kPanelRows, ldo,
                      n_end - g * kPanelRows};
          table[m1 - m0](a);
        }
      }
    }
  }
}

void MatmulPanel(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w, int64_t n_begin,
                 int64_t n_end, float* out, int64_t ldo) {
  if (rows <= 0 || n_begin >= n_end) return;
  const int64_t g_begin = n_begin / kPanelRows;
  const int64_t g_end = (n_end + kPanelRows - 1) / kPanelRows;
  if (rows <= kStreamRows) {
    if (w.bf16) {
      Stream<true>(x, rows, ldx, w, g_begin, g_end, n_end, out, ldo);
    } else {
      Stream<false>(x, rows, ldx, w, g_begin, g_end, n_end, out, ldo);
    }
  } else if (w.bf16) {
    Blocked<true>(x, rows, ldx, w, g_begin, g_end, n_end, out, ldo);
  } else {
    Blocked<false>(x, rows, ldx, w, g_begin, g_end, n_end, out, ldo);
  }
}

}  // namespace

MatmulFn Avx512PanelMatmul() { return &MatmulPanel; }

}  // namespace pd::engine::kernels
