#include "engine/mla_kernels_ref.h"

#include <cmath>
#include <cstring>

#include "engine/kernels_ref.h"
#include "model/dtype.h"

namespace pd::engine::ref {

using kernels::AttnSeq;
using kernels::MlaAttentionArgs;
using kernels::PagedLatent;

const uint8_t* LatentRowPtr(const PagedLatent& kv, int32_t page, int slot) {
  const size_t off = static_cast<size_t>(slot) * kv.latent_dim * kv.elem_bytes();
  return kv.base + static_cast<size_t>(page) * kv.page_bytes + off;
}

float LoadLatent(const PagedLatent& kv, const uint8_t* row, int i) {
  if (kv.fp8) return model::Fp8E4m3ToF32(row[i]) * kv.scale;
  if (kv.bf16) {
    uint16_t v;
    std::memcpy(&v, row + 2 * i, 2);
    return model::Bf16ToF32(v);
  }
  float f;
  std::memcpy(&f, row + 4 * i, 4);
  return f;
}

void AppendLatent(const PagedLatent& kv, const AttnSeq& seq, const float* rows, int64_t ld) {
  for (int j = 0; j < seq.num_tokens; ++j) {
    const int p = seq.start_pos + j;
    uint8_t* dst =
        const_cast<uint8_t*>(LatentRowPtr(kv, seq.page_table[p / kv.page_size], p % kv.page_size));
    const float* src = rows + j * ld;  // (latent_dim)
    for (int i = 0; i < kv.latent_dim; ++i) {
      if (kv.fp8) {
        dst[i] = QuantizeKvFp8(src[i], kv.scale);
      } else if (kv.bf16) {
        const uint16_t v = model::F32ToBf16(src[i]);
        std::memcpy(dst + 2 * i, &v, 2);
      } else {
        std::memcpy(dst + 4 * i, &src[i], 4);
      }
    }
  }
}

void MlaAttention(const MlaAttentionArgs& a, float* scores) {
  const PagedLatent& kv = a.kv;
  const int L = kv.latent_dim, R = kv.kv_lora_rank;
  for (int t = 0; t < a.num_tokens; ++t) {
    const AttnSeq& seq = a.seqs[a.token_seq[t]];
    const int pos = seq.start_pos + (t - seq.token_begin);
    for (int h = 0; h < a.num_heads; ++h) {
      const float* q = a.q + t * a.ldq + static_cast<int64_t>(h) * L;  // (L)
      float* out = a.out + t * a.ldo + static_cast<int64_t>(h) * R;    // (R)
      float max_score = -INFINITY;
      for (int s = 0; s <= pos; ++s) {
        const uint8_t* row = LatentRowPtr(kv, seq.page_table[s / kv.page_size], s % kv.page_size);
        float dot = 0;
        for (int i = 0; i < L; ++i) dot += q[i] * LoadLatent(kv, row, i);
        scores[s] = dot * a.scale;
        max_score = std::fmax(max_score, scores[s]);
      }
      float sum = 0;
      for (int s = 0; s <= pos; ++s) {
        scores[s] = std::exp(scores[s] - max_score);
        sum += scores[s];
      }
      for (int i = 0; i < R; ++i) out[i] = 0;
      for (int s = 0; s <= pos; ++s) {
        const uint8_t* row = LatentRowPtr(kv, seq.page_table[s / kv.page_size], s % kv.page_size);
        const float p = scores[s] / sum;
        for (int i = 0; i < R; ++i) out[i] += p * LoadLatent(kv, row, i);
      }
    }
  }
}

void ApplyRopeStrided(float* x, int64_t rows, int64_t ldx, int num_heads, int64_t head_stride,
                      int dim, const float* cos_table, const float* sin_table, bool interleave) {
  const int half = dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos_table + r * half;  // (half)
    const float* s = sin_table + r * half;  // (half)
    for (int h = 0; h < num_heads; ++h) {
      float* xh = x + r * ldx + h * head_stride;  // (dim)
      for (int i = 0; i < half; ++i) {
        const int i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + half;
        const float a = xh[i0], b = xh[i1];
        xh[i0] = a * c[i] - b * s[i];
        xh[i1] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace pd::engine::ref
