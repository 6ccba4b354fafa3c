// Fast kernels for AVX2 + FMA + F16C (this file is compiled with -mavx2 -mfma -mf16c): the
// fallback for CPUs without AVX-512. Only intrinsics and file-local helpers here (see kernels.h).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "engine/kernels.h"

namespace pd::engine::kernels {
namespace {

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }

inline float Bf16(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
inline __m256 LoadBf16(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline float Sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <bool kBf16>
inline __m256 LoadW(const void* row, int64_t k) {
  if constexpr (kBf16) return LoadBf16(static_cast<const uint16_t*>(row) + k);
  return _mm256_loadu_ps(static_cast<const float*>(row) + k);
}
template <bool kBf16>
inline float WAt(const void* row, int64_t k) {
  if constexpr (kBf16) return Bf16(static_cast<const uint16_t*>(row)[k]);
  return static_cast<const float*>(row)[k];
}

// out (MR, NR) tile = x (MR rows, K) . W (NR rows from n0, K)^T, K tail in scalar code.
template <int MR, int NR, bool kBf16>
void Tile(const float* x, int64_t ldx, const WeightMatrix& w, int64_t n0, float* out, int64_t ldo) {
  const int64_t K = w.k;
  const size_t elem = kBf16 ? 2 : 4;
  const uint8_t* wbase = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(n0) * K * elem;
  const void* wrow[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) wrow[j] = wbase + static_cast<size_t>(j) * K * elem;
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = LoadW<kBf16>(wrow[j], k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = Sum(acc[i][j]);
      for (int64_t kk = k; kk < K; ++kk) s += x[i * ldx + kk] * WAt<kBf16>(wrow[j], kk);
      out[i * ldo + n0 + j] = s;
    }
  }
}

template <int MR, bool kBf16>
void RowBlock(const float* x, int64_t ldx, const WeightMatrix& w, int64_t n_begin, int64_t n_end,
              float* out, int64_t ldo) {
  int64_t n = n_begin;
  for (; n + 4 <= n_end; n += 4) Tile<MR, 4, kBf16>(x, ldx, w, n, out, ldo);
  for (; n < n_end; ++n) Tile<MR, 1, kBf16>(x, ldx, w, n, out, ldo);
}

template <bool kBf16>
void MatmulT(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w, int64_t n_begin,
             int64_t n_end, float* out, int64_t ldo) {
  const int64_t panel = kBf16 ? 128 : 64;
  for (int64_t nc = n_begin; nc < n_end; nc += panel) {
    const int64_t nce = Min(nc + panel, n_end);
    int64_t m = 0;
    for (; m + 3 <= rows; m += 3)
      RowBlock<3, kBf16>(x + m * ldx, ldx, w, nc, nce, out + m * ldo, ldo);
    if (rows - m == 2) RowBlock<2, kBf16>(x + m * ldx, ldx, w, nc, nce, out + m * ldo, ldo);
    if (rows - m == 1) RowBlock<1, kBf16>(x + m * ldx, ldx, w, nc, nce, out + m * ldo, ldo);
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

// How the K or the V rows of a layer are stored: f32, bf16, or fp8 (e4m3fn) codes worth
// code * scale. An fp8 code becomes binary16 by the shift kernels_avx512_fp8.cc describes (the
// binary16 value is the e4m3 value times 2^-8 exactly), then f32 times scale * 2^8: one rounding,
// the same f32 as Fp8E4m3ToF32(code) * scale; the NaN codes read as NaN.
struct KvElems {
  bool bf16 = false;
  bool fp8 = false;
  float scale256 = 256.0f;  // fp8: scale * 2^8
};
inline KvElems KElems(const PagedKv& kv) { return {kv.bf16, kv.fp8, kv.k_scale * 256.0f}; }
inline KvElems VElems(const PagedKv& kv) { return {kv.bf16, kv.fp8, kv.v_scale * 256.0f}; }

inline uint16_t Fp8ToHalfBits(uint8_t code) {
  const uint16_t ext = static_cast<uint16_t>(static_cast<int16_t>(static_cast<int8_t>(code)));
  return static_cast<uint16_t>((ext << 7) & 0xBFFF);
}
inline __m256 LoadKv8(const uint8_t* row, KvElems e, int i) {
  if (e.fp8) {
    const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i));
    const __m128i c16 = _mm_cvtepi8_epi16(codes);
    const __m128i h = _mm_and_si128(_mm_slli_epi16(c16, 7), _mm_set1_epi16(-16385));  // 0xBFFF
    const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(e.scale256));
    const __m128i low7 = _mm_set1_epi16(0x7f);
    const __m128i nan16 = _mm_cmpeq_epi16(_mm_and_si128(c16, low7), low7);
    const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan16));
    return _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_nanf("")), nan);
  }
  if (e.bf16) return LoadBf16(reinterpret_cast<const uint16_t*>(row) + i);
  return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
}
inline float KvAt(const uint8_t* row, KvElems e, int i) {
  if (e.fp8) {
    if ((row[i] & 0x7f) == 0x7f) return __builtin_nanf("");
    return _cvtsh_ss(Fp8ToHalfBits(row[i])) * e.scale256;
  }
  if (e.bf16) {
    uint16_t v;
    __builtin_memcpy(&v, row + 2 * i, 2);
    return Bf16(v);
  }
  float f;
  __builtin_memcpy(&f, row + 4 * i, 4);
  return f;
}

// Online softmax over blocks of kAttnBlock positions (see ScalarAttentionItem in kernels.cc).
void AttentionItem(const AttentionArgs& a, int token, int kv_head, float* scratch) {
  const PagedKv& kv = a.kv;
  const AttnSeq& seq = a.seqs[a.token_seq[token]];
  const int pos = seq.start_pos + (token - seq.token_begin);
  const int group = a.num_heads / kv.num_kv_heads;
  const int d = kv.head_dim;
  const int d8 = d / 8 * 8;
  float* scores = scratch;                   // (group, kAttnBlock)
  float* acc = scores + group * kAttnBlock;  // (group, d)
  float* m = acc + group * d;                // (group)
  float* l = m + group;                      // (group)
  for (int i = 0; i < group * d; ++i) acc[i] = 0;
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
        __m256 dot = _mm256_setzero_ps();
        for (int i = 0; i < d8; i += 8)
          dot = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), LoadKv8(k, KElems(kv), i), dot);
        float s = Sum(dot);
        for (int i = d8; i < d; ++i) s += q[i] * KvAt(k, KElems(kv), i);
        scores[h * kAttnBlock + j] = s * a.scale;
      }
    }
    for (int h = 0; h < group; ++h) {
      float* s = scores + h * kAttnBlock;
      float block_max = m[h];
      for (int j = 0; j < nb; ++j) block_max = s[j] > block_max ? s[j] : block_max;
      const float corr = __builtin_expf(m[h] - block_max);
      m[h] = block_max;
      float sum = 0;
      for (int j = 0; j < nb; ++j) {
        s[j] = __builtin_expf(s[j] - block_max);
        sum += s[j];
      }
      l[h] = l[h] * corr + sum;
      if (corr != 1.0f)
        for (int i = 0; i < d; ++i) acc[h * d + i] *= corr;
    }
    for (int j = 0; j < nb; ++j) {
      const uint8_t* v = KvRow(kv, seq.page_table, b0 + j, kv_head, 1);
      for (int h = 0; h < group; ++h) {
        const float p = scores[h * kAttnBlock + j];
        const __m256 pv = _mm256_set1_ps(p);
        float* ah = acc + h * d;
        for (int i = 0; i < d8; i += 8)
          _mm256_storeu_ps(ah + i,
                           _mm256_fmadd_ps(pv, LoadKv8(v, VElems(kv), i), _mm256_loadu_ps(ah + i)));
        for (int i = d8; i < d; ++i) ah[i] += p * KvAt(v, VElems(kv), i);
      }
    }
  }
  for (int h = 0; h < group; ++h) {
    float* out = a.out + static_cast<int64_t>(token) * a.ldo +
                 (static_cast<int64_t>(kv_head) * group + h) * d;
    const float inv = 1.0f / l[h];
    for (int i = 0; i < d; ++i) out[i] = acc[h * d + i] * inv;
  }
}

const IsaKernels kAvx2 = {"avx2",         &Matmul,           nullptr,
                          &AttentionItem, &ScalarSiluMulRow, &ScalarRmsNormRow};

}  // namespace

const IsaKernels& Avx2Kernels() { return kAvx2; }

}  // namespace pd::engine::kernels
