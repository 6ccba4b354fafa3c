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

#include <cmath>

#include "engine/mla_kernels.h"

namespace pd::engine::kernels {
namespace {

inline __mmask16 TailMask(int n) {
  return n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
}

// Row (L) of the latent cache as f32 into dst (Lp, zero padded past L).
inline void LoadRow(const PagedLatent& kv, const uint8_t* row, int L, int Lp, float* dst) {
  for (int i = 0; i < Lp; i += 16) {
    const __mmask16 m = TailMask(L - i);
    __m512 v;
    if (kv.bf16) {
      const __m256i b = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + i);
      v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    } else {
      v = _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
    }
    _mm512_storeu_ps(dst + i, v);
  }
}

void Avx512Chunk(const MlaAttentionArgs& a, int token, int p_begin, int p_end,
                 const MlaPartial& out, float* scratch) {
  const PagedLatent& kv = a.kv;
  const int L = kv.latent_dim, R = kv.kv_lora_rank, H = a.num_heads;
  const int Lp = (L + 15) / 16 * 16;
  const AttnSeq& seq = a.seqs[a.token_seq[token]];
  float* rows = scratch;                        // (kMlaBlock, Lp)
  float* scores = rows + kMlaBlock * (L + 16);  // (H, kMlaBlock)
  for (int h = 0; h < H; ++h) {
    out.m[h] = -INFINITY;
    out.l[h] = 0.0f;
  }
  for (int64_t i = 0; i < static_cast<int64_t>(H) * R; ++i) out.acc[i] = 0.0f;
  const float* q = a.q + static_cast<int64_t>(token) * a.ldq;  // (H, L)
  const size_t elem = kv.bf16 ? 2 : 4;
  for (int b0 = p_begin; b0 < p_end; b0 += kMlaBlock) {
    const int nb = p_end - b0 < kMlaBlock ? p_end - b0 : kMlaBlock;
    for (int j = 0; j < nb; ++j) {
      const int p = b0 + j;
      const uint8_t* row = kv.base +
                           static_cast<size_t>(seq.page_table[p / kv.page_size]) * kv.page_bytes +
                           static_cast<size_t>(p % kv.page_size) * L * elem;
      LoadRow(kv, row, L, Lp, rows + j * Lp);
    }
    for (int h = 0; h < H; ++h) {
      float* s = scores + h * kMlaBlock;
      const float* qh = q + static_cast<int64_t>(h) * L;
      float block_max = out.m[h];
      for (int j = 0; j < nb; ++j) {
        __m512 d0 = _mm512_setzero_ps(), d1 = _mm512_setzero_ps();
        const float* r = rows + j * Lp;
        int i = 0;
        for (; i + 32 <= L; i += 32) {
          d0 = _mm512_fmadd_ps(_mm512_loadu_ps(qh + i), _mm512_loadu_ps(r + i), d0);
          d1 = _mm512_fmadd_ps(_mm512_loadu_ps(qh + i + 16), _mm512_loadu_ps(r + i + 16), d1);
        }
        for (; i < L; i += 16)
          d0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(TailMask(L - i), qh + i),
                               _mm512_loadu_ps(r + i), d0);
        s[j] = _mm512_reduce_add_ps(_mm512_add_ps(d0, d1)) * a.scale;
        block_max = s[j] > block_max ? s[j] : block_max;
      }
      const float correction = std::exp(out.m[h] - block_max);
      out.m[h] = block_max;
      float sum = out.l[h] * correction;
      for (int j = 0; j < nb; ++j) {
        s[j] = std::exp(s[j] - block_max);
        sum += s[j];
      }
      out.l[h] = sum;
      float* acc = out.acc + static_cast<int64_t>(h) * R;
      const __m512 corr = _mm512_set1_ps(correction);
      for (int i = 0; i < R; i += 16) {
        const __mmask16 m = TailMask(R - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, acc + i), corr);
        for (int j = 0; j < nb; ++j)
          v = _mm512_fmadd_ps(_mm512_set1_ps(s[j]), _mm512_loadu_ps(rows + j * Lp + i), v);
        _mm512_mask_storeu_ps(acc + i, m, v);
      }
    }
  }
}

const MlaIsaKernels kMlaAvx512 = {"avx512", &Avx512Chunk};

}  // namespace

const MlaIsaKernels& MlaAvx512Kernels() { return kMlaAvx512; }

}  // namespace pd::engine::kernels
