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
// Decode (rows <= kStreamRows) walks each group's whole k in one pass, x read in place, in one of
// two ways chosen per CPU (PanelStream, kernels.h): one group per pass left to the hardware
// prefetcher, or several groups at once, each stream prefetched ahead, the next pass's first
// lines fetched into L2 during this one. More rows block k (kKc) and groups (kGroupsPerBlock, in
// L2), pack each block of x rows k-major (in L1) and pass every row block over the groups,
// prefetching ahead of each weight stream.
//
// The bf16-dot variant (MatmulPanelDot, for bf16 weights with even k on CPUs with AVX512_BF16)
// rounds x to bf16 (nearest even) and multiplies with vdpbf16ps: each step takes a pair of k,
// (k, k+1), of 32 rows — two 64-byte lines of the panel recombined into (k, k+1) pairs per row
// with two shifts and two blends, or read from a block already converted to that order — and
// broadcasts x's pair as one 32-bit word. Each output is again one chain over the pairs in order
// (the instruction adds the k+1 product, then the k product, each rounded, denormals flushed), so
// it too is bit-identical across batch sizes and blockings; it equals ref::MatmulBf16Dot.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "engine/kernels.h"

namespace pd::engine::kernels {
namespace {

constexpr int64_t kStreamRows = 4;    // up to this many rows: one pass over k per group
constexpr int64_t kConvertRows = 64;  // from this many rows, bf16 blocks are converted first
constexpr int64_t kKc = 384;          // k block of the blocked path from kConvertRows rows
// Fewer rows (decode batches) take longer k blocks: fewer passes over the output and a longer
// weight stream per call; measured +6-16% at 32 rows (llama-1b shapes, 2 threads, with the
// spread next-run prefetch below).
constexpr int64_t kKcDecode = 1024;
constexpr int64_t kGroupsPerBlock = 8;  // groups per W block of the blocked path (L2)
constexpr int kMaxMr = 14;              // 28 accumulators + 2 weight vectors + 1 broadcast
// f32 weights (converted or not) take a 6-row x 2-group tile: 24 accumulators, and per k 6
// broadcasts + 4 weight loads for 24 FMAs instead of 14 + 2 for 28 (measured ~10% faster; bf16
// weights converted in the loop keep kMaxMr x 1 group, 2 shift/mask ops per 2*MR FMAs).
constexpr int kWideMr = 6;
constexpr int64_t kPrefetchK = 24;  // decode: prefetch this many k steps ahead (1.5 KiB bf16)
// Decode also prefetches each stream this many k steps ahead into L2 (6 KiB bf16): more lines in
// flight than the L1 fill buffers allow; measured +10% decode bandwidth (0.89 -> 0.96-1.01 of the
// then read probe, which then gained the same way of reading).
constexpr int64_t kPrefetchFarK = 96;

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Clamp16(int64_t v) { return v < 0 ? 0 : (v > 16 ? 16 : v); }

// What the micro-kernel's weight stream holds and how it multiplies.
//   kF32:      f32 panels (converted or f32 weights), one k per step, f32 FMA.
//   kBf16:     the bf16 panel as laid out, one k per step (shift and mask to f32), f32 FMA.
//   kDot:      the bf16 panel as laid out, a pair of k per step (two lines recombined), vdpbf16ps.
//   kDotPairs: a block already in (k, k+1) pair order (ConvertGroupsDot), a pair per step.
enum class WMode { kF32, kBf16, kDot, kDotPairs };
constexpr bool IsDot(WMode m) { return m == WMode::kDot || m == WMode::kDotPairs; }
// Bytes of one group's weights per step, and k per step.
constexpr int64_t StepBytes(WMode m) { return m == WMode::kBf16 ? 64 : 128; }
constexpr int64_t StepK(WMode m) { return IsDot(m) ? 2 : 1; }

// The 32 weights of one group at step s: f32 modes: k = s as f32, rows 0..15 in lo, 16..31 in
// hi; dot modes: k = 2s and 2s+1 as bf16 pairs (k in the low half), rows 0..15 in lo, 16..31 in hi.
template <WMode kMode>
inline void LoadK(const uint8_t* group, int64_t s, __m512& lo, __m512& hi) {
  if constexpr (kMode == WMode::kBf16) {
    const __m512i v = _mm512_loadu_si512(group + s * 64);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  } else if constexpr (kMode == WMode::kDot) {
    // Line k holds (row j, row 16 + j) in word j; line k + 1 likewise.
    const __m512i k0 = _mm512_loadu_si512(group + s * 128);
    const __m512i k1 = _mm512_loadu_si512(group + s * 128 + 64);
    constexpr __mmask32 kHigh = 0xAAAAAAAAu;  // the high 16 bits of each word
    lo = _mm512_castsi512_ps(_mm512_mask_blend_epi16(kHigh, k0, _mm512_slli_epi32(k1, 16)));
    hi = _mm512_castsi512_ps(_mm512_mask_blend_epi16(kHigh, _mm512_srli_epi32(k0, 16), k1));
  } else {
    const float* p = reinterpret_cast<const float*>(group + s * 128);
    lo = _mm512_loadu_ps(p);
    hi = _mm512_loadu_ps(p + 16);
  }
}

struct MicroArgs {
  // kPacked: x[(s - s0)*MR + i]; else x[i*ldx + s], s the step (k, or k/2 in the dot modes,
  // whose x holds bf16 pairs: k in the low half of a 32-bit word, k + 1 in the high half).
  const float* x;
  int64_t ldx;
  const uint8_t* w;  // first group's weights at k0
  int64_t group_bytes;
  int64_t k0, k1;  // even in the dot modes
  float* out;      // row m0, column of the first group
  int64_t ldo;
  int64_t cols;  // valid columns from the first group's first, up to NG*32
  // The output tile of the next call (row stride ldo, MR rows of NG*32 floats), prefetched into
  // L1 during this call's first k steps; null if none or if that call starts its chains at zero.
  const float* next_out = nullptr;
  // Lines of weights the next block reads, prefetched into L2 over this call's k steps.
  const uint8_t* pf = nullptr;  // group i's lines at pf + i*pf_stride
  int64_t pf_lines = 0, pf_stride = 0;
  // Issue those lines evenly over all k steps instead of one or two per step from the start: a
  // burst of far prefetches holds more lines in flight than the fill buffers take and stalls this
  // call's own weight loads (decode batches, whose next-run lines come from memory).
  bool pf_spread = false;
};

// Software prefetch of each group's weights: none (the hardware prefetcher alone reads them), near
// only (into L1), or near and, for streams from memory, far into L2 as well.
enum class Pf { kNone, kNear, kNearFar };

// out[0..MR) x [0..cols) (+)= x[0..MR, k0..k1) . W[groups, k0..k1)^T; starts the chains at zero
// when k0 == 0, else from out. kPf: how each group's weights are prefetched ahead.
template <int MR, int NG, WMode kMode, bool kPacked, Pf kPf = Pf::kNearFar>
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
  constexpr int64_t step = StepBytes(kMode);
  // Prefetch distances in steps: a kDot step reads two bf16 lines, so half as many steps.
  constexpr int64_t near_steps = kMode == WMode::kDot ? kPrefetchK / 2 : kPrefetchK;
  constexpr int64_t far_steps = kMode == WMode::kDot ? kPrefetchFarK / 2 : kPrefetchFarK;
  // Streams read from memory also prefetch far ahead into L2 (decode); converted blocks are in L2.
  constexpr bool far =
      kPf == Pf::kNearFar && (!kPacked || kMode == WMode::kBf16 || kMode == WMode::kDot);
  const float* xk = a.x;
  const int64_t kn = (a.k1 - a.k0) / StepK(kMode);
  const int64_t x0 = a.k0 / StepK(kMode);
  // One step: each group's 32 weights, then 2*NG FMAs (or bf16 dot products) per row.
  auto step_k = [&](int64_t k) __attribute__((always_inline)) {
    __m512 wv[NG][2];
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) {
      const uint8_t* wg = w + g * a.group_bytes;
      if constexpr (kPf != Pf::kNone) {
        const char* ahead = reinterpret_cast<const char*>(wg + (k + near_steps) * step);
        _mm_prefetch(ahead, _MM_HINT_T0);
        if constexpr (step == 128) _mm_prefetch(ahead + 64, _MM_HINT_T0);  // two lines per step
      }
      if constexpr (far) {
        const char* p = reinterpret_cast<const char*>(wg + (k + far_steps) * step);
        _mm_prefetch(p, _MM_HINT_T1);
        if constexpr (step == 128) _mm_prefetch(p + 64, _MM_HINT_T1);
      }
      LoadK<kMode>(w + g * a.group_bytes, k, wv[g][0], wv[g][1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      // In the dot modes a float's bits carry x's bf16 pair: broadcast, never computed with.
      const __m512 xb = _mm512_set1_ps(kPacked ? xk[i] : xk[i * a.ldx + x0]);
#pragma GCC unroll 4
      for (int g = 0; g < NG; ++g) {
        if constexpr (IsDot(kMode)) {
          acc[i][g][0] = _mm512_dpbf16_ps(acc[i][g][0], (__m512bh)xb, (__m512bh)wv[g][0]);
          acc[i][g][1] = _mm512_dpbf16_ps(acc[i][g][1], (__m512bh)xb, (__m512bh)wv[g][1]);
        } else {
          acc[i][g][0] = _mm512_fmadd_ps(xb, wv[g][0], acc[i][g][0]);
          acc[i][g][1] = _mm512_fmadd_ps(xb, wv[g][1], acc[i][g][1]);
        }
      }
    }
    xk += kPacked ? MR : 1;
  };
  // The first k steps also prefetch: a row of the next tile each (its lines are not in L1) and
  // one or two lines of the next block's weights each.
  const int64_t out_steps = a.next_out != nullptr ? Min(kn, MR) : 0;
  const bool spread = kPacked && a.pf_spread;  // never in the streaming kernels (<= 4 rows)
  const int64_t pf_steps = spread ? 0 : Min(kn, a.pf_lines);
  const int64_t head = out_steps > pf_steps ? out_steps : pf_steps;
  int64_t k = 0;
  for (; k < head; ++k) {
    if (k < out_steps) {
      const char* row = reinterpret_cast<const char*>(a.next_out + k * a.ldo);
#pragma GCC unroll 8
      for (int c = 0; c < NG * 2; ++c) _mm_prefetch(row + c * 64, _MM_HINT_T0);
    }
    if (k < pf_steps) {
#pragma GCC unroll 4
      for (int g = 0; g < NG; ++g) {
        const char* p = reinterpret_cast<const char*>(a.pf + g * a.pf_stride);
        _mm_prefetch(p + k * 64, _MM_HINT_T1);
        if (k + kn < a.pf_lines) _mm_prefetch(p + (k + kn) * 64, _MM_HINT_T1);
      }
    }
    step_k(k);
  }
  if (spread) {  // line l at the first step k with l*kn <= k*pf_lines
    for (int64_t line = 0; k < kn; ++k) {
      for (; line < a.pf_lines && line * kn <= k * a.pf_lines; ++line) {
#pragma GCC unroll 4
        for (int g = 0; g < NG; ++g)
          _mm_prefetch(reinterpret_cast<const char*>(a.pf + g * a.pf_stride) + line * 64,
                       _MM_HINT_T1);
      }
      step_k(k);
    }
  }
  for (; k < kn; ++k) step_k(k);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g)
      for (int h = 0; h < 2; ++h)
        _mm512_mask_storeu_ps(a.out + i * a.ldo + g * 32 + h * 16, mask[g][h], acc[i][g][h]);
}

using MicroFn = void (*)(const MicroArgs&);

template <WMode kMode, int... MR>
constexpr MicroFn kPackedMicro[] = {nullptr, Micro<MR, 1, kMode, true>...};
template <WMode kMode>
constexpr const MicroFn* PackedTable() {
  return kPackedMicro<kMode, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14>;
}
// Two groups per call (f32 weights or converted dot pairs), rows up to kWideMr.
template <WMode kMode, int... MR>
constexpr MicroFn kPackedMicro2[] = {nullptr, Micro<MR, 2, kMode, true>...};
template <WMode kMode>
constexpr const MicroFn* PackedTable2() {
  return kPackedMicro2<kMode, 1, 2, 3, 4, 5, 6>;
}

// Streaming (decode) kernels by rows, per PanelStream.
// kSingle: one group per pass and no software prefetch: a thread's share of the matrix is then
// one sequential read, which the hardware prefetcher follows faster than any number of
// prefetched streams on AMD Zen 4 (guest, 2 threads, 2 GiB: one plain stream 53-60 GB/s, 4 or 8
// prefetched streams 41-53; batch-1 decode of llama-1b reads at 0.98-1.05 of the read probe).
// kMulti: four groups per pass at 1-2 rows (two at 3-4 rows of dot products), each prefetched
// near ahead into L1, no far prefetch: on an Intel Xeon guest with AVX512_BF16 and AMX (2
// threads, 2 GiB, the bf16-dot pattern, bytes per CPU-second) one plain stream reads 29 GB/s,
// four prefetched streams 35, two 34, eight 32, the read probe's best way 34.
// In both, f32 FMA at 3-4 rows is bound by the FMA rate instead: 3 or 2 groups per pass share
// each broadcast of x, with software prefetching of the groups.
template <WMode kMode>
constexpr bool kStreamShared = !IsDot(kMode);  // rows 3-4 take several groups per pass
template <WMode kMode, PanelStream kS>
struct StreamKernels;
template <WMode kMode>
struct StreamKernels<kMode, PanelStream::kSingle> {
  static constexpr bool kSh = kStreamShared<kMode>;
  static constexpr Pf kRestPf = kSh ? Pf::kNearFar : Pf::kNone;  // rows 3-4, one group
  static constexpr MicroFn kFn[] = {
      nullptr, Micro<1, 1, kMode, false, Pf::kNone>, Micro<2, 1, kMode, false, Pf::kNone>,
      kSh ? Micro<3, 3, kMode, false> : Micro<3, 1, kMode, false, Pf::kNone>,
      kSh ? Micro<4, 2, kMode, false> : Micro<4, 1, kMode, false, Pf::kNone>};
  static constexpr int kGroups[] = {0, 1, 1, kSh ? 3 : 1, kSh ? 2 : 1};
  static constexpr MicroFn kOne[] = {
      nullptr, Micro<1, 1, kMode, false, Pf::kNone>, Micro<2, 1, kMode, false, Pf::kNone>,
      Micro<3, 1, kMode, false, kRestPf>, Micro<4, 1, kMode, false, kRestPf>};
};
template <WMode kMode>
struct StreamKernels<kMode, PanelStream::kMulti> {
  static constexpr bool kSh = kStreamShared<kMode>;
  static constexpr Pf kRestPf = kSh ? Pf::kNearFar : Pf::kNear;  // rows 3-4
  static constexpr MicroFn kFn[] = {
      nullptr, Micro<1, 4, kMode, false, Pf::kNear>, Micro<2, 4, kMode, false, Pf::kNear>,
      kSh ? Micro<3, 3, kMode, false> : Micro<3, 2, kMode, false, Pf::kNear>,
      kSh ? Micro<4, 2, kMode, false> : Micro<4, 2, kMode, false, Pf::kNear>};
  static constexpr int kGroups[] = {0, 4, 4, kSh ? 3 : 2, 2};
  static constexpr MicroFn kOne[] = {
      nullptr, Micro<1, 1, kMode, false, Pf::kNear>, Micro<2, 1, kMode, false, Pf::kNear>,
      Micro<3, 1, kMode, false, kRestPf>, Micro<4, 1, kMode, false, kRestPf>};
};

// kMode: kF32 (f32 panel), kBf16 or kDot (bf16 panel; kDot's x holds bf16 pairs, ldx in pairs).
template <WMode kMode, PanelStream kS>
void Stream(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w, int64_t g_begin,
            int64_t g_end, int64_t n_end, float* out, int64_t ldo) {
  constexpr bool kF32 = kMode == WMode::kF32;
  const int64_t group_bytes = w.k * kPanelRows * (kF32 ? 4 : 2);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  using K = StreamKernels<kMode, kS>;
  const int ng = K::kGroups[rows];
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
    if (ng > 1 && g + 2 * ng <= g_end) {  // the next pass's first kPrefetchK k into L2 meanwhile
      a.pf = base + (g + ng) * group_bytes;
      a.pf_lines = kPrefetchK * (kF32 ? 2 : 1);
      a.pf_stride = group_bytes;
    }
    if (g + ng <= g_end) {
      K::kFn[rows](a);
    } else {
      for (int64_t r = g; r < g_end;
           ++r, a.w += group_bytes, a.out += kPanelRows, a.cols -= kPanelRows)
        K::kOne[rows](a);
    }
  }
}

// 16 rows r[0..16) of 16 floats transposed in place: r[j] = (row 0's j, row 1's j, ...).
inline void Transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // lanes of 128 bits: 4 rows' elements j
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(u[i], u[4 + i], _MM_SHUFFLE(2, 0, 2, 0));
    t[4 + i] = _mm512_shuffle_f32x4(u[i], u[4 + i], _MM_SHUFFLE(3, 1, 3, 1));
    t[8 + i] = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], _MM_SHUFFLE(2, 0, 2, 0));
    t[12 + i] = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], _MM_SHUFFLE(3, 1, 3, 1));
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], _MM_SHUFFLE(2, 0, 2, 0));
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// 32 x of one row from x[k] as 16 bf16 pairs (k in the low half), nearest even; k past nk: 0.
inline __m512 PairsOf(const float* x, int64_t nk) {
  const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << Clamp16(nk)) - 1u), x);
  const __m512 hi =
      _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << Clamp16(nk - 16)) - 1u), x + 16);
  return (__m512)_mm512_cvtne2ps_pbh(hi, lo);
}

// x[m0..m1, k0..k1) k-major into dst: dst[(k - k0)*(m1 - m0) + i], so the micro-kernel's
// broadcasts read one sequential stream (rows of x lie a multiple of 4 KiB apart and would
// otherwise fight over the same L1 sets). m1 - m0 <= 16; 16 words of each row at a time through a
// transpose. kPairs (the dot modes): as bf16 pairs, pair-major: word (k - k0)/2*(m1 - m0) + i
// holds row m0 + i's (k, k + 1); k0 and k1 even (the transpose moves the pairs' bits unchanged).
template <bool kPairs>
void PackX(const float* x, int64_t ldx, int64_t m0, int64_t m1, int64_t k0, int64_t k1,
           float* dst) {
  constexpr int64_t kPer = kPairs ? 2 : 1;  // k per 32-bit word
  const int64_t mr = m1 - m0;
  const __mmask16 row_mask = static_cast<__mmask16>((1u << mr) - 1u);
  for (int64_t k = k0; k < k1; k += 16 * kPer) {
    const int64_t nk = Min(16 * kPer, k1 - k);
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      const float* row = x + (m0 + i) * ldx + k;
      if (i >= mr) {
        r[i] = _mm512_setzero_ps();
      } else if constexpr (kPairs) {
        r[i] = PairsOf(row, nk);
      } else {
        r[i] = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << nk) - 1u), row);
      }
    }
    Transpose16(r);
    float* d = dst + (k - k0) / kPer * mr;
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j)
      if (j * kPer < nk) _mm512_mask_storeu_ps(d + j * mr, row_mask, r[j]);
  }
}

// x (rows, k) as bf16 pairs row by row into dst (rows, k/2 words); k even.
void XPairs(const float* x, int64_t rows, int64_t ldx, int64_t k, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < k; c += 32) {
      const int64_t nk = Min(32, k - c);
      _mm512_mask_storeu_ps(dst + i * (k / 2) + c / 2,
                            static_cast<__mmask16>((1u << (nk / 2)) - 1u),
                            PairsOf(x + i * ldx + c, nk));
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
      LoadK<WMode::kBf16>(src, k, lo, hi);
      _mm512_store_ps(dst, lo);
      _mm512_store_ps(dst + 16, hi);
    }
  }
}

// Groups [g0, g1) of a bf16 panel, k in [k0, k1) (even), in (k, k + 1) pair order into dst: per
// pair, rows 0..15's pairs then rows 16..31's (what LoadK<kDot> recombines).
void ConvertGroupsDot(const uint8_t* base, int64_t group_bytes, int64_t g0, int64_t g1, int64_t k0,
                      int64_t k1, float* dst) {
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* src = base + g * group_bytes + k0 * 64;
    for (int64_t s = 0; s < (k1 - k0) / 2; ++s, dst += kPanelRows) {
      __m512 lo, hi;
      LoadK<WMode::kDot>(src, s, lo, hi);
      _mm512_store_ps(dst, lo);
      _mm512_store_ps(dst + 16, hi);
    }
  }
}

// The blocked loop's order: k0 (k blocks), gb (runs of kGroupsPerBlock groups), b (row blocks),
// g (ng groups per call). Where the call after (b, g) writes, or null when there is none or it
// starts its chains at zero (it does not read out).
struct BlockedLoop {
  int64_t rows, blocks, ldo, g_begin, g_end, k, kc;
  int ng;
  const float* NextTile(int64_t k0, int64_t gb, int64_t ge, int64_t b, int64_t g,
                        const float* out) const {
    int64_t nb = b, next_g = g + ng;
    bool reads = k0 > 0;
    if (next_g >= ge) {
      next_g = gb;
      if (++nb == blocks) {
        nb = 0;
        next_g = ge;
        if (next_g == g_end) {
          if (k0 + kc >= k) return nullptr;
          next_g = g_begin;
          reads = true;
        }
      }
    }
    return reads ? out + RowBlockBegin(rows, nb, blocks) * ldo + next_g * kPanelRows : nullptr;
  }
};

// k in blocks of kKc (kKcDecode below kConvertRows rows); for each block: x packed once (k-major
// per row block, each in L1 when used), then each run of kGroupsPerBlock groups (in L2) against
// every row block. With many rows the run's bf16 weights are first converted to f32 (exact, once
// for all row blocks; kDot: to pair order), which leaves the micro-kernel nothing but loads and
// FMAs (dot products). Each call also prefetches its share of the next run's weights into L2 and
// the next call's output tile into L1. kMode: kF32, kBf16 or kDot (x is f32 in all three).
template <WMode kMode>
void Blocked(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w, int64_t g_begin,
             int64_t g_end, int64_t n_end, float* out, int64_t ldo) {
  thread_local ThreadScratch x_scratch, w_scratch;
  constexpr bool kBf16 = kMode != WMode::kF32, kDot = kMode == WMode::kDot;
  constexpr int64_t sk = StepK(kMode);    // k per step (x words per k block: kc / sk)
  const int64_t step = kBf16 ? 64 : 128;  // bytes of one k of a group
  const int64_t group_bytes = w.k * step;
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const bool convert = kBf16 && rows >= kConvertRows;
  const bool wide = !kBf16 || convert;  // f32 weights or pairs: kWideMr x 2 groups
  constexpr WMode kConverted = kDot ? WMode::kDotPairs : WMode::kF32;
  const MicroFn* table = wide ? PackedTable<kConverted>() : PackedTable<kMode>();
  const MicroFn* table2 = wide ? PackedTable2<kConverted>() : nullptr;
  const int max_mr = wide ? kWideMr : kMaxMr;
  const int64_t kc_max = rows >= kConvertRows ? kKc : kKcDecode;
  const BlockedLoop loop{
      rows, (rows + max_mr - 1) / max_mr, ldo, g_begin, g_end, w.k, kc_max, wide ? 2 : 1};
  const int64_t blocks = loop.blocks;
  float* xp = x_scratch.Get(rows * kc_max);
  float* wf = convert ? w_scratch.Get(kGroupsPerBlock * kc_max * kPanelRows) : nullptr;
  if (xp == nullptr || (convert && wf == nullptr)) __builtin_trap();  // out of memory
  for (int64_t k0 = 0; k0 < w.k; k0 += kc_max) {
    const int64_t k1 = Min(w.k, k0 + kc_max), kc = k1 - k0;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t m0 = RowBlockBegin(rows, b, blocks), m1 = RowBlockBegin(rows, b + 1, blocks);
      PackX<kDot>(x, ldx, m0, m1, k0, k1, xp + m0 * kc / sk);
    }
    for (int64_t gb = g_begin; gb < g_end; gb += kGroupsPerBlock) {
      const int64_t ge = Min(g_end, gb + kGroupsPerBlock);
      if (convert) {
        if constexpr (kDot) {
          ConvertGroupsDot(base, group_bytes, gb, ge, k0, k1, wf);
        } else {
          ConvertGroups(base, group_bytes, gb, ge, k0, k1, wf);
        }
      }
      // The next run: groups from pg at k in [pk0, pk1) (none if pk0 == w.k).
      int64_t pg = ge, pk0 = k0, pk1 = k1;
      if (ge == g_end) pg = g_begin, pk0 = k1, pk1 = Min(w.k, k1 + kc_max);
      const int64_t pf_group_lines = (pk1 - pk0) * step / 64;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t m0 = RowBlockBegin(rows, b, blocks), m1 = RowBlockBegin(rows, b + 1, blocks);
        for (int64_t g = gb; g < ge; g += loop.ng) {
          // A converted group takes kc*128 bytes as f32, kc*64 as pairs.
          const int64_t cbytes = kc * 128 / sk;
          const uint8_t* wg = convert ? reinterpret_cast<const uint8_t*>(wf) + (g - gb) * cbytes
                                      : base + g * group_bytes + k0 * step;
          MicroArgs a{xp + m0 * kc / sk,
                      0,
                      wg,
                      convert ? cbytes : group_bytes,
                      k0,
                      k1,
                      out + m0 * ldo + g * kPanelRows,
                      ldo,
                      n_end - g * kPanelRows};
          a.next_out = loop.NextTile(k0, gb, ge, b, g, out);
          if (pk0 < w.k && pg + (g - gb) < g_end) {  // part b of this call's groups in the next run
            const int64_t l0 = pf_group_lines * b / blocks;
            a.pf = base + (pg + g - gb) * group_bytes + pk0 * step + l0 * 64;
            a.pf_lines = pf_group_lines * (b + 1) / blocks - l0;
            a.pf_stride = group_bytes;
            a.pf_spread = rows < kConvertRows;
          }
          (g + 2 <= ge && table2 != nullptr ? table2 : table)[m1 - m0](a);
        }
      }
    }
  }
}

template <PanelStream kS>
void MatmulPanel(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w, int64_t n_begin,
                 int64_t n_end, float* out, int64_t ldo) {
  if (w.fp8) return Avx512Fp8PanelMatmul(x, rows, ldx, w, n_begin, n_end, out, ldo);
  if (rows <= 0 || n_begin >= n_end) return;
  const int64_t g_begin = n_begin / kPanelRows;
  const int64_t g_end = (n_end + kPanelRows - 1) / kPanelRows;
  if (rows <= kStreamRows) {
    if (w.bf16) {
      Stream<WMode::kBf16, kS>(x, rows, ldx, w, g_begin, g_end, n_end, out, ldo);
    } else {
      Stream<WMode::kF32, kS>(x, rows, ldx, w, g_begin, g_end, n_end, out, ldo);
    }
  } else if (w.bf16) {
    Blocked<WMode::kBf16>(x, rows, ldx, w, g_begin, g_end, n_end, out, ldo);
  } else {
    Blocked<WMode::kF32>(x, rows, ldx, w, g_begin, g_end, n_end, out, ldo);
  }
}

// x rounded to bf16 and multiplied with vdpbf16ps (bf16 weights, even k); anything else takes
// MatmulPanel.
template <PanelStream kS>
void MatmulPanelDot(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w,
                    int64_t n_begin, int64_t n_end, float* out, int64_t ldo) {
  if (!w.bf16 || w.k % 2 != 0) return MatmulPanel<kS>(x, rows, ldx, w, n_begin, n_end, out, ldo);
  if (rows <= 0 || n_begin >= n_end) return;
  const int64_t g_begin = n_begin / kPanelRows;
  const int64_t g_end = (n_end + kPanelRows - 1) / kPanelRows;
  if (rows <= kStreamRows) {
    thread_local ThreadScratch x_scratch;
    float* pairs = x_scratch.Get(rows * w.k / 2);
    if (pairs == nullptr) __builtin_trap();  // out of memory
    XPairs(x, rows, ldx, w.k, pairs);
    Stream<WMode::kDot, kS>(pairs, rows, w.k / 2, w, g_begin, g_end, n_end, out, ldo);
  } else {
    Blocked<WMode::kDot>(x, rows, ldx, w, g_begin, g_end, n_end, out, ldo);
  }
}

}  // namespace

MatmulFn Avx512PanelMatmul(PanelStream stream) {
  return stream == PanelStream::kMulti ? &MatmulPanel<PanelStream::kMulti>
                                       : &MatmulPanel<PanelStream::kSingle>;
}
MatmulFn Avx512PanelDotMatmul(PanelStream stream) {
  return stream == PanelStream::kMulti ? &MatmulPanelDot<PanelStream::kMulti>
                                       : &MatmulPanelDot<PanelStream::kSingle>;
}

}  // namespace pd::engine::kernels
