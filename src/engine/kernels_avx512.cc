// Fast kernels for AVX-512 (F/BW/VL/DQ; this file is compiled with -mavx512*). Only intrinsics and
// file-local helpers here: see kernels.h for why no other header's inline code may be compiled
// with these flags.
// GCC 12's AVX-512 intrinsics (reduce_add, cvtepu16) start from _mm512_undefined_*, which
// -Wuninitialized reports falsely once inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "engine/exp_avx512.h"
#include "engine/fp8_avx512.h"
#include "engine/kernels.h"

namespace pd::engine::kernels {
namespace {

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline __mmask16 TailMask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

// 16 bf16 -> 16 f32 (exact: bf16 is the top half of an f32).
inline __m512 Bf16x16(__m256i v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
inline __m512 LoadBf16(const uint16_t* p) {
  return Bf16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 LoadBf16(const uint16_t* p, __mmask16 m) {
  return Bf16x16(_mm256_maskz_loadu_epi16(m, p));
}

template <bool kBf16>
inline __m512 LoadW(const void* row, int64_t k) {
  if constexpr (kBf16) return LoadBf16(static_cast<const uint16_t*>(row) + k);
  return _mm512_loadu_ps(static_cast<const float*>(row) + k);
}
template <bool kBf16>
inline __m512 LoadW(const void* row, int64_t k, __mmask16 m) {
  if constexpr (kBf16) return LoadBf16(static_cast<const uint16_t*>(row) + k, m);
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(row) + k);
}

// out (MR, NR) tile = x (MR rows, K) . W (NR rows from n0, K)^T: MR*NR accumulators in registers,
// each weight vector loaded once per K step and used by MR rows of x.
template <int MR, int NR, bool kBf16>
void Tile(const float* x, int64_t ldx, const WeightMatrix& w, int64_t n0, float* out, int64_t ldo) {
  const int64_t K = w.k;
  const size_t elem = kBf16 ? 2 : 4;
  const uint8_t* wbase = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(n0) * K * elem;
  const void* wrow[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) wrow[j] = wbase + static_cast<size_t>(j) * K * elem;
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = LoadW<kBf16>(wrow[j], k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    const __mmask16 m = TailMask(K - k);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = LoadW<kBf16>(wrow[j], k, m);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) out[i * ldo + n0 + j] = _mm512_reduce_add_ps(acc[i][j]);
}

// Tile widths: MR rows of x against NR weight rows, MR*NR accumulators in registers; MR = 1
// (decode) takes 8 weight rows for more independent FMA chains. (8x3 measured slower than 4x4.)
template <int MR>
constexpr int kNr = MR == 1 ? 8 : 4;
constexpr int kMaxMr = 4;

template <int MR, bool kBf16>
void RowBlock(const float* x, int64_t ldx, const WeightMatrix& w, int64_t n_begin, int64_t n_end,
              float* out, int64_t ldo) {
  constexpr int NR = kNr<MR>;
  int64_t n = n_begin;
  for (; n + NR <= n_end; n += NR) Tile<MR, NR, kBf16>(x, ldx, w, n, out, ldo);
  for (; n < n_end; ++n) Tile<MR, 1, kBf16>(x, ldx, w, n, out, ldo);
}

using RowBlockFn = void (*)(const float*, int64_t, const WeightMatrix&, int64_t, int64_t, float*,
                            int64_t);
template <bool kBf16>
constexpr RowBlockFn kRowBlocks[kMaxMr + 1] = {nullptr, RowBlock<1, kBf16>, RowBlock<2, kBf16>,
                                               RowBlock<3, kBf16>, RowBlock<4, kBf16>};

template <bool kBf16>
void MatmulT(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w, int64_t n_begin,
             int64_t n_end, float* out, int64_t ldo) {
  // Panels of W rows small enough to stay in L2 while every block of x rows passes over them.
  const int64_t panel = kBf16 ? 128 : 64;
  for (int64_t nc = n_begin; nc < n_end; nc += panel) {
    const int64_t nce = Min(nc + panel, n_end);
    for (int64_t m = 0; m < rows; m += kMaxMr) {
      const int64_t mr = Min(kMaxMr, rows - m);
      kRowBlocks<kBf16>[mr](x + m * ldx, ldx, w, nc, nce, out + m * ldo, ldo);
    }
  }
}

void Matmul(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w, int64_t n_begin,
            int64_t n_end, float* out, int64_t ldo) {
  if (w.fp8) return ScalarFp8Matmul(x, rows, ldx, w, n_begin, n_end, out, ldo);
  if (w.bf16) {
    MatmulT<true>(x, rows, ldx, w, n_begin, n_end, out, ldo);
  } else {
    MatmulT<false>(x, rows, ldx, w, n_begin, n_end, out, ldo);
  }
}

inline const uint8_t* KvRow(const PagedKv& kv, const int32_t* table, int pos, int head, int which) {
  const int slot = pos % kv.page_size;
  const int64_t off =
      kv.hnd ? ((static_cast<int64_t>(head) * 2 + which) * kv.page_size + slot) * kv.head_dim
             : ((static_cast<int64_t>(slot) * kv.num_kv_heads + head) * 2 + which) * kv.head_dim;
  return kv.base + static_cast<int64_t>(table[pos / kv.page_size]) * kv.page_bytes +
         off * kv.elem_bytes();
}

// How the K or the V rows of a layer are stored: f32, bf16, or fp8 codes worth code * scale.
struct KvElems {
  bool bf16 = false;
  bool fp8 = false;
  float scale = 1.0f;
};
inline KvElems KElems(const PagedKv& kv) { return {kv.bf16, kv.fp8, kv.k_scale}; }
inline KvElems VElems(const PagedKv& kv) { return {kv.bf16, kv.fp8, kv.v_scale}; }

// Elements i..i+16 of a row as f32 (lanes outside m zero).
inline __m512 LoadKv(const uint8_t* row, KvElems e, int i, __mmask16 m) {
  if (e.fp8) return Fp8x16(row + i, m, _mm512_set1_ps(e.scale * 256.0f));
  if (e.bf16) return LoadBf16(reinterpret_cast<const uint16_t*>(row) + i, m);
  return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
}

// Online softmax over blocks of kAttnBlock positions (see ScalarAttentionItem in kernels.cc).
void AttentionItem(const AttentionArgs& a, int token, int kv_head, float* scratch) {
  const PagedKv& kv = a.kv;
  const AttnSeq& seq = a.seqs[a.token_seq[token]];
  const int pos = seq.start_pos + (token - seq.token_begin);
  const int group = a.num_heads / kv.num_kv_heads;
  const int d = kv.head_dim;
  const int dv = (d + 15) / 16 * 16;         // acc rows padded to whole vectors
  float* scores = scratch;                   // (group, kAttnBlock)
  float* acc = scores + group * kAttnBlock;  // (group, dv)
  float* m = acc + group * dv;               // (group) running max
  float* l = m + group;                      // (group) running sum
  for (int i = 0; i < group * dv; i += 16) _mm512_storeu_ps(acc + i, _mm512_setzero_ps());
  for (int h = 0; h < group; ++h) {
    m[h] = -__builtin_inff();
    l[h] = 0;
  }
  const float* q0 =
      a.q + static_cast<int64_t>(token) * a.ldq + static_cast<int64_t>(kv_head) * group * d;
  for (int b0 = 0; b0 <= pos; b0 += kAttnBlock) {
    const int nb = static_cast<int>(Min(kAttnBlock, pos + 1 - b0));
    for (int j = 0; j < nb; ++j) {
      const uint8_t* k = KvRow(kv, seq.page_table, b0 + j, kv_head, 0);
      for (int h = 0; h < group; ++h) {
        const float* q = q0 + h * d;
        __m512 dot = _mm512_setzero_ps();
        for (int i = 0; i < d; i += 16) {
          const __mmask16 mk = TailMask(Min(16, d - i));
          dot =
              _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, q + i), LoadKv(k, KElems(kv), i, mk), dot);
        }
        scores[h * kAttnBlock + j] = _mm512_reduce_add_ps(dot) * a.scale;
      }
    }
    for (int h = 0; h < group; ++h) {
      float* s = scores + h * kAttnBlock;
      __m512 vmax = _mm512_set1_ps(m[h]);
      for (int j = 0; j < nb; j += 16)
        vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, TailMask(Min(16, nb - j)), s + j));
      const float block_max = _mm512_reduce_max_ps(vmax);
      const float corr = __builtin_expf(m[h] - block_max);
      m[h] = block_max;
      __m512 sum = _mm512_setzero_ps();
      for (int j = 0; j < nb; j += 16) {
        const __mmask16 mk = TailMask(Min(16, nb - j));
        const __m512 e =
            Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), _mm512_set1_ps(block_max)));
        _mm512_mask_storeu_ps(s + j, mk, e);
        sum = _mm512_mask_add_ps(sum, mk, sum, e);
      }
      l[h] = l[h] * corr + _mm512_reduce_add_ps(sum);
      if (corr != 1.0f) {
        const __m512 c = _mm512_set1_ps(corr);
        for (int i = 0; i < dv; i += 16)
          _mm512_storeu_ps(acc + h * dv + i, _mm512_mul_ps(c, _mm512_loadu_ps(acc + h * dv + i)));
      }
    }
    for (int j = 0; j < nb; ++j) {
      const uint8_t* v = KvRow(kv, seq.page_table, b0 + j, kv_head, 1);
      for (int i = 0; i < d; i += 16) {
        const __m512 vv = LoadKv(v, VElems(kv), i, TailMask(Min(16, d - i)));
        for (int h = 0; h < group; ++h) {
          float* ah = acc + h * dv + i;
          _mm512_storeu_ps(ah, _mm512_fmadd_ps(_mm512_set1_ps(scores[h * kAttnBlock + j]), vv,
                                               _mm512_loadu_ps(ah)));
        }
      }
    }
  }
  for (int h = 0; h < group; ++h) {
    float* out = a.out + static_cast<int64_t>(token) * a.ldo +
                 (static_cast<int64_t>(kv_head) * group + h) * d;
    const __m512 inv = _mm512_set1_ps(1.0f / l[h]);
    for (int i = 0; i < d; i += 16)
      _mm512_mask_storeu_ps(out + i, TailMask(Min(16, d - i)),
                            _mm512_mul_ps(inv, _mm512_loadu_ps(acc + h * dv + i)));
  }
}

// r[j] = the sum of the 16 lanes of v[j], j < 16: a transposing tree, 45 shuffles and adds for 16
// dot products instead of 16 horizontal reductions.
inline __m512 ReduceRows16(const float* v) {
  __m512 b[8];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const __m512 x = _mm512_loadu_ps(v + 32 * k), y = _mm512_loadu_ps(v + 32 * k + 16);
    b[k] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
  }
  // Per 128-bit lane L, c[m] = [S_L(v[4m]), S_L(v[4m+1]), S_L(v[4m+2]), S_L(v[4m+3])].
  __m512 c[4];
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m)
    c[m] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 f0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 f1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(f0, f1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(f0, f1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Where one KV head's rows lie: row of position p = page base + head + slot*slot_stride, its V row
// v_offset bytes after its K row.
struct KvGeometry {
  int64_t head_offset, slot_stride, v_offset;
  KvGeometry(const PagedKv& kv, int kv_head) {
    const int64_t elem = kv.elem_bytes(), d = kv.head_dim;
    head_offset =
        (kv.hnd ? int64_t{kv_head} * 2 * kv.page_size * d : int64_t{kv_head} * 2 * d) * elem;
    slot_stride = (kv.hnd ? d : int64_t{kv.num_kv_heads} * 2 * d) * elem;
    v_offset = (kv.hnd ? int64_t{kv.page_size} * d : d) * elem;
  }
};

// K row pointers of positions b0..b0+nb, walking pages instead of dividing per position.
inline void BlockRows(const PagedKv& kv, const int32_t* table, const KvGeometry& geo, int b0,
                      int nb, const uint8_t** rows) {
  int page = b0 / kv.page_size, slot = b0 % kv.page_size;
  const uint8_t* base = kv.base + int64_t{table[page]} * kv.page_bytes + geo.head_offset;
  for (int j = 0; j < nb; ++j) {
    rows[j] = base + slot * geo.slot_stride;
    if (++slot == kv.page_size && j + 1 < nb) {
      slot = 0;
      base = kv.base + int64_t{table[++page]} * kv.page_bytes + geo.head_offset;
    }
  }
}

// scores[h, 0..nb) = scale * q_h . K[row j] for the group's heads; q padded to DV vectors.
template <int DV>
void BlockScores(const float* qpad, int group, const uint8_t* const* rows, int nb, KvElems e,
                 __mmask16 tail, float scale, float* part, float* scores) {
  for (int j0 = 0; j0 < nb; j0 += 16) {
    const int n16 = static_cast<int>(Min(16, nb - j0));
    for (int j = 0; j < 16; ++j) {
      if (j >= n16) {
        for (int h = 0; h < group; ++h)
          _mm512_storeu_ps(part + (h * 16 + j) * 16, _mm512_setzero_ps());
        continue;
      }
      __m512 k[DV];
#pragma GCC unroll 8
      for (int i = 0; i < DV; ++i)
        k[i] = LoadKv(rows[j0 + j], e, i * 16, i + 1 < DV ? 0xFFFF : tail);
      for (int h = 0; h < group; ++h) {
        const float* q = qpad + h * DV * 16;
        __m512 dot = _mm512_mul_ps(_mm512_loadu_ps(q), k[0]);
#pragma GCC unroll 8
        for (int i = 1; i < DV; ++i) dot = _mm512_fmadd_ps(_mm512_loadu_ps(q + i * 16), k[i], dot);
        _mm512_storeu_ps(part + (h * 16 + j) * 16, dot);
      }
    }
    for (int h = 0; h < group; ++h)
      _mm512_mask_storeu_ps(scores + h * kAttnBlock + j0, TailMask(n16),
                            _mm512_mul_ps(ReduceRows16(part + h * 256), _mm512_set1_ps(scale)));
  }
}

// BlockScores for exactly G heads, their q vectors held in registers across the block.
template <int DV, int G>
void BlockScoresG(const float* qpad, const uint8_t* const* rows, int nb, KvElems e, __mmask16 tail,
                  float scale, float* part, float* scores) {
  __m512 q[G][DV];
#pragma GCC unroll 8
  for (int h = 0; h < G; ++h)
#pragma GCC unroll 8
    for (int i = 0; i < DV; ++i) q[h][i] = _mm512_loadu_ps(qpad + (h * DV + i) * 16);
  for (int j0 = 0; j0 < nb; j0 += 16) {
    const int n16 = static_cast<int>(Min(16, nb - j0));
    for (int j = 0; j < 16; ++j) {
      if (j >= n16) {
#pragma GCC unroll 8
        for (int h = 0; h < G; ++h) _mm512_storeu_ps(part + (h * 16 + j) * 16, _mm512_setzero_ps());
        continue;
      }
      __m512 k[DV];
#pragma GCC unroll 8
      for (int i = 0; i < DV; ++i)
        k[i] = LoadKv(rows[j0 + j], e, i * 16, i + 1 < DV ? 0xFFFF : tail);
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) {
        __m512 dot = _mm512_mul_ps(q[h][0], k[0]);
#pragma GCC unroll 8
        for (int i = 1; i < DV; ++i) dot = _mm512_fmadd_ps(q[h][i], k[i], dot);
        _mm512_storeu_ps(part + (h * 16 + j) * 16, dot);
      }
    }
    for (int h = 0; h < G; ++h)
      _mm512_mask_storeu_ps(scores + h * kAttnBlock + j0, TailMask(n16),
                            _mm512_mul_ps(ReduceRows16(part + h * 256), _mm512_set1_ps(scale)));
  }
}

// BlockScores, through BlockScoresG where the group's q fits in registers (same arithmetic).
template <int DV>
void BlockScoresAny(const float* qpad, int group, const uint8_t* const* rows, int nb, KvElems e,
                    __mmask16 tail, float scale, float* part, float* scores) {
  if constexpr (DV <= 4) {
    if (group == 4) return BlockScoresG<DV, 4>(qpad, rows, nb, e, tail, scale, part, scores);
  }
  if constexpr (DV <= 8) {
    if (group == 2) return BlockScoresG<DV, 2>(qpad, rows, nb, e, tail, scale, part, scores);
    if (group == 1) return BlockScoresG<DV, 1>(qpad, rows, nb, e, tail, scale, part, scores);
  }
  BlockScores<DV>(qpad, group, rows, nb, e, tail, scale, part, scores);
}

// Online-softmax update of every head over one block's scores (exponentiated in place).
inline void BlockSoftmax(int group, int nb, int dv, float* scores, float* m, float* l, float* acc) {
  for (int h = 0; h < group; ++h) {
    float* s = scores + h * kAttnBlock;
    __m512 vmax = _mm512_set1_ps(m[h]);
    for (int j = 0; j < nb; j += 16)
      vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, TailMask(Min(16, nb - j)), s + j));
    const float block_max = _mm512_reduce_max_ps(vmax);
    const float corr = __builtin_expf(m[h] - block_max);
    m[h] = block_max;
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nb; j += 16) {
      const __mmask16 mk = TailMask(Min(16, nb - j));
      const __m512 e =
          Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), _mm512_set1_ps(block_max)));
      _mm512_mask_storeu_ps(s + j, mk, e);
      sum = _mm512_mask_add_ps(sum, mk, sum, e);
    }
    l[h] = l[h] * corr + _mm512_reduce_add_ps(sum);
    if (corr != 1.0f) {
      const __m512 c = _mm512_set1_ps(corr);
      for (int i = 0; i < dv; i += 16)
        _mm512_storeu_ps(acc + h * dv + i, _mm512_mul_ps(c, _mm512_loadu_ps(acc + h * dv + i)));
    }
  }
}

// Query heads whose accumulators BlockPv keeps in registers at once (DV vectors each).
template <int DV>
constexpr int kPvHeads = DV <= 4 ? 4 : (DV <= 8 ? 2 : 1);

// acc[h0..h0+H, dv) += sum over the block's positions j (in order) of scores[h, j] * V[row j]:
// each accumulator one FMA chain over j, held in registers for the whole block.
template <int DV, int H>
inline void BlockPv(const uint8_t* const* rows, int nb, int64_t v_offset, KvElems e, __mmask16 tail,
                    const float* scores, int dv, int h0, float* acc) {
  __m512 r[H][DV];
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 8
    for (int i = 0; i < DV; ++i) r[h][i] = _mm512_loadu_ps(acc + (h0 + h) * dv + i * 16);
  for (int j = 0; j < nb; ++j) {
    const uint8_t* v = rows[j] + v_offset;
    __m512 vv[DV];
#pragma GCC unroll 8
    for (int i = 0; i < DV; ++i) vv[i] = LoadKv(v, e, i * 16, i + 1 < DV ? 0xFFFF : tail);
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      const __m512 s = _mm512_set1_ps(scores[(h0 + h) * kAttnBlock + j]);
#pragma GCC unroll 8
      for (int i = 0; i < DV; ++i) r[h][i] = _mm512_fmadd_ps(s, vv[i], r[h][i]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 8
    for (int i = 0; i < DV; ++i) _mm512_storeu_ps(acc + (h0 + h) * dv + i * 16, r[h][i]);
}

// Attention of one token for one KV head's query heads, head_dim <= DV*16: scores of 16
// positions at a time reduced together, K/V rows converted once for all heads.
template <int DV>
void AttentionItemDv(const AttentionArgs& a, int token, int kv_head, float* scratch) {
  const PagedKv& kv = a.kv;
  const AttnSeq& seq = a.seqs[a.token_seq[token]];
  const int pos = seq.start_pos + (token - seq.token_begin);
  const int group = a.num_heads / kv.num_kv_heads;
  const int d = kv.head_dim, dv = DV * 16;
  const __mmask16 tail = TailMask(d - (DV - 1) * 16);
  float* scores = scratch;                   // (group, kAttnBlock)
  float* acc = scores + group * kAttnBlock;  // (group, dv)
  float* qpad = acc + group * dv;            // (group, dv)
  float* part = qpad + group * dv;           // (group, 16, 16)
  float* m = part + group * 256;             // (group) running max
  float* l = m + group;                      // (group) running sum
  const float* q0 =
      a.q + static_cast<int64_t>(token) * a.ldq + static_cast<int64_t>(kv_head) * group * d;
  for (int h = 0; h < group; ++h) {
    m[h] = -__builtin_inff();
    l[h] = 0;
    for (int i = 0; i < DV; ++i) {
      _mm512_storeu_ps(acc + h * dv + i * 16, _mm512_setzero_ps());
      _mm512_storeu_ps(qpad + h * dv + i * 16,
                       _mm512_maskz_loadu_ps(i + 1 < DV ? 0xFFFF : tail, q0 + h * d + i * 16));
    }
  }
  const KvGeometry geo(kv, kv_head);
  const uint8_t* rows[kAttnBlock];
  for (int b0 = 0; b0 <= pos; b0 += kAttnBlock) {
    const int nb = static_cast<int>(Min(kAttnBlock, pos + 1 - b0));
    BlockRows(kv, seq.page_table, geo, b0, nb, rows);
    BlockScoresAny<DV>(qpad, group, rows, nb, KElems(kv), tail, a.scale, part, scores);
    BlockSoftmax(group, nb, dv, scores, m, l, acc);
    int h = 0;
    for (; h + kPvHeads<DV> <= group; h += kPvHeads<DV>)
      BlockPv<DV, kPvHeads<DV>>(rows, nb, geo.v_offset, VElems(kv), tail, scores, dv, h, acc);
    for (; h < group; ++h)
      BlockPv<DV, 1>(rows, nb, geo.v_offset, VElems(kv), tail, scores, dv, h, acc);
  }
  for (int h = 0; h < group; ++h) {
    float* out = a.out + static_cast<int64_t>(token) * a.ldo +
                 (static_cast<int64_t>(kv_head) * group + h) * d;
    const __m512 inv = _mm512_set1_ps(1.0f / l[h]);
    for (int i = 0; i < DV; ++i)
      _mm512_mask_storeu_ps(out + i * 16, i + 1 < DV ? 0xFFFF : tail,
                            _mm512_mul_ps(inv, _mm512_loadu_ps(acc + h * dv + i * 16)));
  }
}

// One token's state in AttentionRowsDv: scores (group, kAttnBlock), acc and qpad (group, dv),
// running max and sum (group), laid out as in AttentionItemDv.
struct RowState {
  float *scores, *acc, *qpad, *m, *l;
  RowState(float* base, int group, int dv)
      : scores(base),
        acc(scores + group * kAttnBlock),
        qpad(acc + group * dv),
        m(qpad + group * dv),
        l(m + group) {}
  static int Floats(int group, int dv) { return group * (kAttnBlock + 2 * dv + 2); }
};

// K and V rows of one block (positions b0..b0+nb) as f32 into kbuf/vbuf (nb, dv), tail lanes zero:
// the values LoadKv gives (bf16 -> f32 is exact; fp8 rounds once, the same whenever it runs), so
// reading them back as f32 changes no bit.
template <int DV>
inline void ConvertBlockKv(const PagedKv& kv, const uint8_t* const* rows, int nb, int64_t v_offset,
                           __mmask16 tail, float* kbuf, float* vbuf) {
  for (int j = 0; j < nb; ++j)
#pragma GCC unroll 8
    for (int i = 0; i < DV; ++i) {
      const __mmask16 m = i + 1 < DV ? 0xFFFF : tail;
      _mm512_storeu_ps(kbuf + j * DV * 16 + i * 16, LoadKv(rows[j], KElems(kv), i * 16, m));
      _mm512_storeu_ps(vbuf + j * DV * 16 + i * 16,
                       LoadKv(rows[j] + v_offset, VElems(kv), i * 16, m));
    }
}

// AttentionItemDv for tokens token0..token0+ntok (consecutive positions of one sequence): each
// block's K/V rows are located (and converted from bf16) once for all of them, then every token
// whose position reaches the block runs AttentionItemDv's steps on it; per token the same
// operations in the same order, so the same bits.
template <int DV>
void AttentionRowsDv(const AttentionArgs& a, int token0, int ntok, int kv_head, float* scratch) {
  const PagedKv& kv = a.kv;
  const AttnSeq& seq = a.seqs[a.token_seq[token0]];
  const int pos0 = seq.start_pos + (token0 - seq.token_begin), last = pos0 + ntok - 1;
  const int group = a.num_heads / kv.num_kv_heads;
  const int d = kv.head_dim, dv = DV * 16;
  const __mmask16 tail = TailMask(d - (DV - 1) * 16);
  const int state_floats = RowState::Floats(group, dv);
  float* part = scratch + kAttnRows * state_floats;  // (group, 16, 16)
  float* kbuf = part + group * 256;                  // (kAttnBlock, dv)
  float* vbuf = kbuf + kAttnBlock * dv;              // (kAttnBlock, dv)
  for (int t = 0; t < ntok; ++t) {
    const RowState st(scratch + t * state_floats, group, dv);
    const float* q0 =
        a.q + static_cast<int64_t>(token0 + t) * a.ldq + static_cast<int64_t>(kv_head) * group * d;
    for (int h = 0; h < group; ++h) {
      st.m[h] = -__builtin_inff();
      st.l[h] = 0;
      for (int i = 0; i < DV; ++i) {
        _mm512_storeu_ps(st.acc + h * dv + i * 16, _mm512_setzero_ps());
        _mm512_storeu_ps(st.qpad + h * dv + i * 16,
                         _mm512_maskz_loadu_ps(i + 1 < DV ? 0xFFFF : tail, q0 + h * d + i * 16));
      }
    }
  }
  const KvGeometry geo(kv, kv_head);
  const uint8_t* rows[kAttnBlock];
  const uint8_t* frows[kAttnBlock];  // rows of kbuf
  for (int j = 0; j < kAttnBlock; ++j) frows[j] = reinterpret_cast<const uint8_t*>(kbuf + j * dv);
  const int64_t f_offset = static_cast<int64_t>(kAttnBlock) * dv * 4;  // kbuf row -> vbuf row
  for (int b0 = 0; b0 <= last; b0 += kAttnBlock) {
    const int nb_all = static_cast<int>(Min(kAttnBlock, last + 1 - b0));
    BlockRows(kv, seq.page_table, geo, b0, nb_all, rows);
    const uint8_t* const* use = rows;
    int64_t v_offset = geo.v_offset;
    if (kv.bf16 || kv.fp8) {
      ConvertBlockKv<DV>(kv, rows, nb_all, geo.v_offset, tail, kbuf, vbuf);
      use = frows;
      v_offset = f_offset;
    }
    for (int t = 0; t < ntok; ++t) {
      if (pos0 + t < b0) continue;  // this block is past the token's position
      const int nb = static_cast<int>(Min(kAttnBlock, pos0 + t + 1 - b0));
      const RowState st(scratch + t * state_floats, group, dv);
      BlockScoresAny<DV>(st.qpad, group, use, nb, KvElems{}, tail, a.scale, part, st.scores);
      BlockSoftmax(group, nb, dv, st.scores, st.m, st.l, st.acc);
      int h = 0;
      for (; h + kPvHeads<DV> <= group; h += kPvHeads<DV>)
        BlockPv<DV, kPvHeads<DV>>(use, nb, v_offset, KvElems{}, tail, st.scores, dv, h, st.acc);
      for (; h < group; ++h)
        BlockPv<DV, 1>(use, nb, v_offset, KvElems{}, tail, st.scores, dv, h, st.acc);
    }
  }
  for (int t = 0; t < ntok; ++t) {
    const RowState st(scratch + t * state_floats, group, dv);
    for (int h = 0; h < group; ++h) {
      float* out = a.out + static_cast<int64_t>(token0 + t) * a.ldo +
                   (static_cast<int64_t>(kv_head) * group + h) * d;
      const __m512 inv = _mm512_set1_ps(1.0f / st.l[h]);
      for (int i = 0; i < DV; ++i)
        _mm512_mask_storeu_ps(out + i * 16, i + 1 < DV ? 0xFFFF : tail,
                              _mm512_mul_ps(inv, _mm512_loadu_ps(st.acc + h * dv + i * 16)));
    }
  }
}

using AttentionItemFn = void (*)(const AttentionArgs&, int, int, float*);
constexpr AttentionItemFn kAttentionDv[] = {nullptr,
                                            AttentionItemDv<1>,
                                            AttentionItemDv<2>,
                                            AttentionItemDv<3>,
                                            AttentionItemDv<4>,
                                            AttentionItemDv<5>,
                                            AttentionItemDv<6>,
                                            AttentionItemDv<7>,
                                            AttentionItemDv<8>};

// head_dim up to 128 takes the blocked kernel, larger ones the general one.
void AttentionItemAny(const AttentionArgs& a, int token, int kv_head, float* scratch) {
  const int dvecs = (a.kv.head_dim + 15) / 16;
  if (dvecs <= 8) {
    kAttentionDv[dvecs](a, token, kv_head, scratch);
  } else {
    AttentionItem(a, token, kv_head, scratch);
  }
}

using AttentionRowsFn = void (*)(const AttentionArgs&, int, int, int, float*);
constexpr AttentionRowsFn kAttentionRowsDv[] = {nullptr,
                                                AttentionRowsDv<1>,
                                                AttentionRowsDv<2>,
                                                AttentionRowsDv<3>,
                                                AttentionRowsDv<4>,
                                                AttentionRowsDv<5>,
                                                AttentionRowsDv<6>,
                                                AttentionRowsDv<7>,
                                                AttentionRowsDv<8>};

// head_dim up to 128 takes the blocked kernel for all tokens at once, larger ones the general
// per-token kernel.
void AttentionRowsAny(const AttentionArgs& a, int token, int num_tokens, int kv_head,
                      float* scratch) {
  const int dvecs = (a.kv.head_dim + 15) / 16;
  if (dvecs <= 8) {
    kAttentionRowsDv[dvecs](a, token, num_tokens, kv_head, scratch);
  } else {
    for (int t = token; t < token + num_tokens; ++t) AttentionItem(a, t, kv_head, scratch);
  }
}

// exp(x) for any x: Exp's reduction is valid up to ~88 (scalef saturates to inf beyond).
inline __m512 ExpAny(__m512 x) { return Exp(_mm512_min_ps(x, _mm512_set1_ps(88.0f))); }

void SiluMulRow(const float* gate, const float* up, int64_t dim, float* out) {
  for (int64_t i = 0; i < dim; i += 16) {
    const __mmask16 m = TailMask(Min(16, dim - i));
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = ExpAny(_mm512_sub_ps(_mm512_setzero_ps(), g));  // exp(-g)
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void RmsNormRow(const float* x, const float* w, int64_t dim, float eps, float* out) {
  __m512d ss0 = _mm512_setzero_pd(), ss1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < dim; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(TailMask(Min(16, dim - i)), x + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    ss0 = _mm512_fmadd_pd(lo, lo, ss0);
    ss1 = _mm512_fmadd_pd(hi, hi, ss1);
  }
  const double ss = _mm512_reduce_add_pd(_mm512_add_pd(ss0, ss1));
  const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / __builtin_sqrt(ss / dim + eps)));
  for (int64_t i = 0; i < dim; i += 16) {
    const __mmask16 m = TailMask(Min(16, dim - i));
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
  }
}

IsaKernels Avx512Table(PanelStream stream) {
  return {"avx512",    &Matmul,     Avx512PanelMatmul(stream), &AttentionItemAny,
          &SiluMulRow, &RmsNormRow, &AttentionRowsAny,         Avx512PanelDotMatmul(stream)};
}

}  // namespace

const IsaKernels& Avx512Kernels() {
  static const IsaKernels kSingle = Avx512Table(PanelStream::kSingle);
  static const IsaKernels kMulti = Avx512Table(PanelStream::kMulti);
  return ChosenPanelStream() == PanelStream::kMulti ? kMulti : kSingle;
}

}  // namespace pd::engine::kernels
