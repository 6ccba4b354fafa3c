// The AVX-512 MLA chunk kernel (compiled with -mavx512f/bw/vl/dq; includes only mla_kernels.h and
// intrinsics). The same algorithm as the scalar chunk kernel in mla_kernels.cc: positions in
// blocks of kMlaBlock rows, each row converted to f32 once for all heads.
// GCC 12's AVX-512 intrinsics (reduce_add, cvtepu16) start from _mm512_undefined_*, which
// -Wmaybe-uninitialized flags inside the system header (as in kernels_avx512.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "engine/exp_avx512.h"
#include "engine/fp8_avx512.h"
#include "engine/mla_kernels.h"

namespace pd::engine::kernels {
namespace {

inline __mmask16 TailMask(int n) {
  return n >= 16 ? 0xFFFF : (n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1));
}

// Lane i = the sum of v[i]'s lanes, for 16 vectors: pairs added through unpacks, then 128-bit lane
// shuffles (45 operations, against 16 horizontal reductions of 8 each).
inline __m512 Sum16(const __m512 v[16]) {
  __m512 t[8], u[4], x[2];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; ++i)
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x88),
                       _mm512_shuffle_f32x4(x[0], x[1], 0xDD));
}

// s[hb * kMlaBlock + jb] = scale * (the sum of acc[hb][jb]'s lanes).
template <int HB, int JB>
inline void StoreScores(const __m512 (&acc)[HB][JB], float scale, float* s) {
  if constexpr (HB == 4 && JB == 4) {
    const __m512 sums = _mm512_mul_ps(Sum16(&acc[0][0]), _mm512_set1_ps(scale));
    // The lane index is an immediate (clang requires a constant even where gcc unrolls).
    _mm_storeu_ps(s, _mm512_castps512_ps128(sums));
    _mm_storeu_ps(s + kMlaBlock, _mm512_extractf32x4_ps(sums, 1));
    _mm_storeu_ps(s + 2 * kMlaBlock, _mm512_extractf32x4_ps(sums, 2));
    _mm_storeu_ps(s + 3 * kMlaBlock, _mm512_extractf32x4_ps(sums, 3));
  } else {
    for (int hb = 0; hb < HB; ++hb)
      for (int jb = 0; jb < JB; ++jb)
        s[hb * kMlaBlock + jb] = _mm512_reduce_add_ps(acc[hb][jb]) * scale;
  }
}

// Row (L) of the latent cache as f32 into dst (Lp, zero padded past L).
inline void LoadRow(const PagedLatent& kv, const uint8_t* row, int L, int Lp, float* dst) {
  for (int i = 0; i < Lp; i += 16) {
    const __mmask16 m = TailMask(L - i);
    __m512 v;
    if (kv.fp8) {
      v = Fp8x16(row + i, m, _mm512_set1_ps(kv.scale * 256.0f));
    } else if (kv.bf16) {
      const __m256i b = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + i);
      v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    } else {
      v = _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
    }
    _mm512_storeu_ps(dst + i, v);
  }
}

// scores[hb][jb] = scale * q[hb] . rows[jb] for a tile of HB heads x JB rows: HB*JB independent
// FMA chains over the padded length Lp (q and rows zero past L), each row and q vector loaded once
// per tile.
template <int HB, int JB>
void ScoreTile(const float* q, const float* rows, int Lp, float scale, float* s) {
  __m512 acc[HB][JB];
  for (int hb = 0; hb < HB; ++hb)
    for (int jb = 0; jb < JB; ++jb) acc[hb][jb] = _mm512_setzero_ps();
  for (int i = 0; i < Lp; i += 16) {
    __m512 r[JB];
    for (int jb = 0; jb < JB; ++jb) r[jb] = _mm512_loadu_ps(rows + jb * Lp + i);
    for (int hb = 0; hb < HB; ++hb) {
      const __m512 qv = _mm512_loadu_ps(q + hb * Lp + i);
      for (int jb = 0; jb < JB; ++jb) acc[hb][jb] = _mm512_fmadd_ps(qv, r[jb], acc[hb][jb]);
    }
  }
  StoreScores<HB, JB>(acc, scale, s);
}

// acc[hb][i0 + c*16 ..] = acc * corr[hb] + sum_j p[hb][j] * rows[j][i0 + c*16 ..] for HB heads and
// CB 16-wide chunks of R (the last one masked to R): HB*CB independent chains over the block.
template <int HB, int CB>
void PvTile(const float* p, int nb, const float* rows, int Lp, const float* corr, int R, int i0,
            float* acc) {
  __m512 a[HB][CB];
  __mmask16 mask[CB];
  for (int c = 0; c < CB; ++c) mask[c] = TailMask(R - i0 - 16 * c);
  for (int hb = 0; hb < HB; ++hb)
    for (int c = 0; c < CB; ++c)
      a[hb][c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[c], acc + hb * R + i0 + 16 * c),
                               _mm512_set1_ps(corr[hb]));
  for (int j = 0; j < nb; ++j) {
    __m512 r[CB];
    for (int c = 0; c < CB; ++c) r[c] = _mm512_loadu_ps(rows + j * Lp + i0 + 16 * c);
    for (int hb = 0; hb < HB; ++hb) {
      const __m512 pv = _mm512_set1_ps(p[hb * kMlaBlock + j]);
      for (int c = 0; c < CB; ++c) a[hb][c] = _mm512_fmadd_ps(pv, r[c], a[hb][c]);
    }
  }
  for (int hb = 0; hb < HB; ++hb)
    for (int c = 0; c < CB; ++c)
      _mm512_mask_storeu_ps(acc + hb * R + i0 + 16 * c, mask[c], a[hb][c]);
}

// Online-softmax update of head h over one block's nb <= kMlaBlock scores s (exponentiated in
// place): the running max and sum of `out`, and the correction of its accumulator into corr[h].
inline void SoftmaxBlock(float* s, int nb, const MlaPartial& out, int h, float* corr) {
  static_assert(kMlaBlock == 32, "two vectors of scores per block");
  const __mmask16 m0 = TailMask(nb), m1 = TailMask(nb - 16);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  const __m512 s0 = _mm512_mask_loadu_ps(neg_inf, m0, s),
               s1 = _mm512_mask_loadu_ps(neg_inf, m1, s + 16);
  const float block_max = std::max(out.m[h], _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
  corr[h] = std::exp(out.m[h] - block_max);
  out.m[h] = block_max;
  const __m512 bm = _mm512_set1_ps(block_max);
  const __m512 e0 = _mm512_maskz_mov_ps(m0, Exp(_mm512_sub_ps(s0, bm)));
  const __m512 e1 = _mm512_maskz_mov_ps(m1, Exp(_mm512_sub_ps(s1, bm)));
  _mm512_storeu_ps(s, e0);
  _mm512_storeu_ps(s + 16, e1);
  out.l[h] = out.l[h] * corr[h] + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
}

constexpr int kTile = 4;  // heads (and rows, and 16-wide chunks) per register tile
using ScoreFn = void (*)(const float*, const float*, int, float, float*);
using PvFn = void (*)(const float*, int, const float*, int, const float*, int, int, float*);
template <int HB>
constexpr ScoreFn kScoreRow[kTile] = {&ScoreTile<HB, 1>, &ScoreTile<HB, 2>, &ScoreTile<HB, 3>,
                                      &ScoreTile<HB, 4>};
constexpr const ScoreFn* kScore[kTile] = {kScoreRow<1>, kScoreRow<2>, kScoreRow<3>, kScoreRow<4>};
template <int HB>
constexpr PvFn kPvRow[kTile] = {&PvTile<HB, 1>, &PvTile<HB, 2>, &PvTile<HB, 3>, &PvTile<HB, 4>};
constexpr const PvFn* kPv[kTile] = {kPvRow<1>, kPvRow<2>, kPvRow<3>, kPvRow<4>};

// bf16 latents are read in place, 32 elements (64 bytes) at a time: the even elements are the low
// halves of the 32-bit words (f32 by a shift left), the odd ones the high halves (f32 by a mask).
// The query and the accumulator are kept in that order, chunk c of 32 elements as its 16 even then
// its 16 odd elements ("split" order), so no row is converted into memory or read twice per head
// tile. The last chunk's load is masked to the row.
inline void SplitBf16(const uint16_t* p, __mmask32 m, __m512& even, __m512& odd) {
  const __m512i v = _mm512_maskz_loadu_epi16(m, p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

inline __mmask32 ChunkMask(int n) {
  return n >= 32 ? ~__mmask32{0} : (n <= 0 ? 0 : static_cast<__mmask32>((1u << n) - 1u));
}

// scores[hb][jb] = scale * q[hb] . row[jb] over `chunks` chunks of 32 (q split, zero past L).
template <int HB, int JB>
void ScoreTileBf16(const float* q, int lq, const uint16_t* const* rows, int chunks, __mmask32 last,
                   float scale, float* s) {
  __m512 acc[HB][JB];
  for (int hb = 0; hb < HB; ++hb)
    for (int jb = 0; jb < JB; ++jb) acc[hb][jb] = _mm512_setzero_ps();
  for (int c = 0; c < chunks; ++c) {
    const __mmask32 m = c + 1 == chunks ? last : ~__mmask32{0};
    __m512 e[JB], o[JB];
    for (int jb = 0; jb < JB; ++jb) SplitBf16(rows[jb] + 32 * c, m, e[jb], o[jb]);
    for (int hb = 0; hb < HB; ++hb) {
      const __m512 qe = _mm512_loadu_ps(q + hb * lq + 32 * c);
      const __m512 qo = _mm512_loadu_ps(q + hb * lq + 32 * c + 16);
      for (int jb = 0; jb < JB; ++jb) {
        acc[hb][jb] = _mm512_fmadd_ps(qe, e[jb], acc[hb][jb]);
        acc[hb][jb] = _mm512_fmadd_ps(qo, o[jb], acc[hb][jb]);
      }
    }
  }
  StoreScores<HB, JB>(acc, scale, s);
}

// acc[hb] chunks c0..c0+CB (split order, row stride lr) = acc * corr[hb] + sum_j p[hb][j] *
// row[j] over the block's nb rows.
template <int HB, int CB>
void PvTileBf16(const float* p, int nb, const uint16_t* const* rows, const float* corr, int c0,
                const __mmask32* masks, int lr, float* acc) {
  __m512 a[HB][CB][2];
  for (int hb = 0; hb < HB; ++hb)
    for (int c = 0; c < CB; ++c)
      for (int t = 0; t < 2; ++t)
        a[hb][c][t] = _mm512_mul_ps(_mm512_loadu_ps(acc + hb * lr + 32 * (c0 + c) + 16 * t),
                                    _mm512_set1_ps(corr[hb]));
  for (int j = 0; j < nb; ++j) {
    __m512 r[CB][2];
    for (int c = 0; c < CB; ++c) SplitBf16(rows[j] + 32 * (c0 + c), masks[c], r[c][0], r[c][1]);
    for (int hb = 0; hb < HB; ++hb) {
      const __m512 pv = _mm512_set1_ps(p[hb * kMlaBlock + j]);
      for (int c = 0; c < CB; ++c)
        for (int t = 0; t < 2; ++t) a[hb][c][t] = _mm512_fmadd_ps(pv, r[c][t], a[hb][c][t]);
    }
  }
  for (int hb = 0; hb < HB; ++hb)
    for (int c = 0; c < CB; ++c)
      for (int t = 0; t < 2; ++t)
        _mm512_storeu_ps(acc + hb * lr + 32 * (c0 + c) + 16 * t, a[hb][c][t]);
}

constexpr int kPvChunks = 2;  // 32-element chunks per PV register tile (4 heads: 16 accumulators)
using ScoreBf16Fn = void (*)(const float*, int, const uint16_t* const*, int, __mmask32, float,
                             float*);
using PvBf16Fn = void (*)(const float*, int, const uint16_t* const*, const float*, int,
                          const __mmask32*, int, float*);
template <int HB>
constexpr ScoreBf16Fn kScoreBf16Row[kTile] = {&ScoreTileBf16<HB, 1>, &ScoreTileBf16<HB, 2>,
                                              &ScoreTileBf16<HB, 3>, &ScoreTileBf16<HB, 4>};
constexpr const ScoreBf16Fn* kScoreBf16[kTile] = {kScoreBf16Row<1>, kScoreBf16Row<2>,
                                                  kScoreBf16Row<3>, kScoreBf16Row<4>};
template <int HB>
constexpr PvBf16Fn kPvBf16Row[kPvChunks] = {&PvTileBf16<HB, 1>, &PvTileBf16<HB, 2>};
constexpr const PvBf16Fn* kPvBf16[kTile] = {kPvBf16Row<1>, kPvBf16Row<2>, kPvBf16Row<3>,
                                            kPvBf16Row<4>};

// The bf16 chunk kernel. Scratch: scores (H, kMlaBlock), q split (H, lq), corrections (H), the
// accumulator split (H, lr), with lq and lr L and R rounded up to 32.
void Bf16Chunk(const MlaAttentionArgs& a, int token, int p_begin, int p_end, const MlaPartial& out,
               float* scratch) {
  const PagedLatent& kv = a.kv;
  const int L = kv.latent_dim, R = kv.kv_lora_rank, H = a.num_heads;
  const int lq = (L + 31) / 32 * 32, lr = (R + 31) / 32 * 32;
  const AttnSeq& seq = a.seqs[a.token_seq[token]];
  float* scores = scratch;                                     // (H, kMlaBlock)
  float* qs = scores + H * kMlaBlock;                          // (H, lq)
  float* corr = qs + static_cast<int64_t>(H) * lq;             // (H)
  float* accs = corr + H;                                      // (H, lr)
  const float* q = a.q + static_cast<int64_t>(token) * a.ldq;  // (H, L)
  const __m512i even_idx =
      _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd_idx = _mm512_add_epi32(even_idx, _mm512_set1_epi32(1));
  for (int h = 0; h < H; ++h) {
    out.m[h] = -INFINITY;
    out.l[h] = 0.0f;
    for (int i = 0; i < lq; i += 32) {
      const __m512 lo = _mm512_maskz_loadu_ps(TailMask(L - i), q + h * L + i);
      const __m512 hi = _mm512_maskz_loadu_ps(TailMask(L - i - 16), q + h * L + i + 16);
      _mm512_storeu_ps(qs + h * lq + i, _mm512_permutex2var_ps(lo, even_idx, hi));
      _mm512_storeu_ps(qs + h * lq + i + 16, _mm512_permutex2var_ps(lo, odd_idx, hi));
    }
    for (int i = 0; i < lr; ++i) accs[h * lr + i] = 0.0f;
  }
  const int q_chunks = lq / 32, r_chunks = lr / 32;
  const __mmask32 q_last = ChunkMask(L - 32 * (q_chunks - 1));
  const uint16_t* rows[kMlaBlock];
  for (int b0 = p_begin; b0 < p_end; b0 += kMlaBlock) {
    const int nb = p_end - b0 < kMlaBlock ? p_end - b0 : kMlaBlock;
    for (int j = 0; j < nb; ++j) {
      const int p = b0 + j;
      rows[j] = reinterpret_cast<const uint16_t*>(
          kv.base + static_cast<size_t>(seq.page_table[p / kv.page_size]) * kv.page_bytes +
          static_cast<size_t>(p % kv.page_size) * L * 2);
    }
    for (int j0 = 0; j0 < nb; j0 += kTile) {  // each row tile read once, the queries stay in L1
      const int jb = nb - j0 < kTile ? nb - j0 : kTile;
      for (int h0 = 0; h0 < H; h0 += kTile) {
        const int hb = H - h0 < kTile ? H - h0 : kTile;
        kScoreBf16[hb - 1][jb - 1](qs + h0 * lq, lq, rows + j0, q_chunks, q_last, a.scale,
                                   scores + h0 * kMlaBlock + j0);
      }
    }
    for (int h = 0; h < H; ++h) SoftmaxBlock(scores + h * kMlaBlock, nb, out, h, corr);
    for (int c0 = 0; c0 < r_chunks; c0 += kPvChunks) {  // the rows' slice stays in L1
      const int cb = r_chunks - c0 < kPvChunks ? r_chunks - c0 : kPvChunks;
      const __mmask32 masks[kPvChunks] = {ChunkMask(R - 32 * c0), ChunkMask(R - 32 * (c0 + 1))};
      for (int h0 = 0; h0 < H; h0 += kTile) {
        const int hb = H - h0 < kTile ? H - h0 : kTile;
        kPvBf16[hb - 1][cb - 1](scores + h0 * kMlaBlock, nb, rows, corr + h0, c0, masks, lr,
                                accs + static_cast<int64_t>(h0) * lr);
      }
    }
  }
  // The accumulator back into element order (MergeParity's interleave), R elements a head.
  const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi_idx = _mm512_add_epi32(lo_idx, _mm512_set1_epi32(8));
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < lr; i += 32) {
      const __m512 e = _mm512_loadu_ps(accs + h * lr + i),
                   o = _mm512_loadu_ps(accs + h * lr + i + 16);
      float* dst = out.acc + static_cast<int64_t>(h) * R + i;
      _mm512_mask_storeu_ps(dst, TailMask(R - i), _mm512_permutex2var_ps(e, lo_idx, o));
      _mm512_mask_storeu_ps(dst + 16, TailMask(R - i - 16), _mm512_permutex2var_ps(e, hi_idx, o));
    }
}

// Scratch: rows (kMlaBlock, Lp), then scores (H, kMlaBlock), then q padded (H, Lp) and the
// per-head corrections (H) (MlaChunkScratchFloats counts them).
void Avx512Chunk(const MlaAttentionArgs& a, int token, int p_begin, int p_end,
                 const MlaPartial& out, float* scratch) {
  const PagedLatent& kv = a.kv;
  if (kv.bf16) return Bf16Chunk(a, token, p_begin, p_end, out, scratch);
  const int L = kv.latent_dim, R = kv.kv_lora_rank, H = a.num_heads;
  const int Lp = (L + 15) / 16 * 16;
  const AttnSeq& seq = a.seqs[a.token_seq[token]];
  float* rows = scratch;                                       // (kMlaBlock, Lp)
  float* scores = rows + kMlaBlock * (L + 16);                 // (H, kMlaBlock)
  float* qp = scores + H * kMlaBlock;                          // (H, Lp)
  float* corr = qp + static_cast<int64_t>(H) * Lp;             // (H)
  const float* q = a.q + static_cast<int64_t>(token) * a.ldq;  // (H, L)
  for (int h = 0; h < H; ++h) {
    out.m[h] = -INFINITY;
    out.l[h] = 0.0f;
    for (int i = 0; i < Lp; i += 16)
      _mm512_storeu_ps(qp + h * Lp + i, _mm512_maskz_loadu_ps(TailMask(L - i), q + h * L + i));
  }
  for (int64_t i = 0; i < static_cast<int64_t>(H) * R; ++i) out.acc[i] = 0.0f;
  const size_t elem = static_cast<size_t>(kv.elem_bytes());
  for (int b0 = p_begin; b0 < p_end; b0 += kMlaBlock) {
    const int nb = p_end - b0 < kMlaBlock ? p_end - b0 : kMlaBlock;
    for (int j = 0; j < nb; ++j) {
      const int p = b0 + j;
      const uint8_t* row = kv.base +
                           static_cast<size_t>(seq.page_table[p / kv.page_size]) * kv.page_bytes +
                           static_cast<size_t>(p % kv.page_size) * L * elem;
      LoadRow(kv, row, L, Lp, rows + j * Lp);
    }
    for (int h0 = 0; h0 < H; h0 += kTile) {
      const int hb = H - h0 < kTile ? H - h0 : kTile;
      for (int j0 = 0; j0 < nb; j0 += kTile) {
        const int jb = nb - j0 < kTile ? nb - j0 : kTile;
        kScore[hb - 1][jb - 1](qp + h0 * Lp, rows + j0 * Lp, Lp, a.scale,
                               scores + h0 * kMlaBlock + j0);
      }
    }
    for (int h = 0; h < H; ++h) SoftmaxBlock(scores + h * kMlaBlock, nb, out, h, corr);
    for (int h0 = 0; h0 < H; h0 += kTile) {
      const int hb = H - h0 < kTile ? H - h0 : kTile;
      for (int i0 = 0; i0 < R; i0 += 16 * kTile) {
        const int cb = (R - i0 + 15) / 16 < kTile ? (R - i0 + 15) / 16 : kTile;
        kPv[hb - 1][cb - 1](scores + h0 * kMlaBlock, nb, rows, Lp, corr + h0, R, i0,
                            out.acc + static_cast<int64_t>(h0) * R);
      }
    }
  }
}

const MlaIsaKernels kMlaAvx512 = {"avx512", &Avx512Chunk};

}  // namespace

const MlaIsaKernels& MlaAvx512Kernels() { return kMlaAvx512; }

}  // namespace pd::engine::kernels
