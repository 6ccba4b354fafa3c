#include "engine/kernels_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/dtype.h"

namespace pd::engine::ref {

using kernels::AttentionArgs;
using kernels::AttnSeq;
using kernels::PagedKv;
using kernels::WeightMatrix;

void RmsNorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* w, float eps,
             float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;  // (dim)
    float* o = out + r * ldo;       // (dim)
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * w[i];
  }
}

void RopeTable(const int32_t* positions, int64_t rows, int head_dim, double theta, float* cos_out,
               float* sin_out) {
  const int half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < half; ++i) {
      const double angle = positions[r] * std::pow(theta, -2.0 * i / head_dim);
      cos_out[r * half + i] = static_cast<float>(std::cos(angle));
      sin_out[r * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void ApplyRope(float* x, int64_t rows, int num_heads, int head_dim, int64_t ldx,
               const float* cos_table, const float* sin_table) {
  const int half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos_table + r * half;  // (half)
    const float* s = sin_table + r * half;  // (half)
    for (int h = 0; h < num_heads; ++h) {
      float* xh = x + r * ldx + static_cast<int64_t>(h) * head_dim;  // (head_dim)
      for (int i = 0; i < half; ++i) {
        const float a = xh[i], b = xh[i + half];
        xh[i] = a * c[i] - b * s[i];
        xh[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

namespace {

// fp8 W (n, k) row-major with block scales (ceil(n/128), ceil(k/128)): per output, each k block's
// partial sum times its scale, added in block order.
void MatmulFp8Slice(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, int64_t n_begin,
                    int64_t n_end, float* out, int64_t ldo) {
  const uint8_t* q = static_cast<const uint8_t*>(w.data);  // (n, k)
  const int64_t kb = kernels::Fp8KBlocks(w.k);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t n = n_begin; n < n_end; ++n) {
      float acc = 0;
      for (int64_t b = 0; b < kb; ++b) {
        float partial = 0;
        const int64_t k1 = std::min(w.k, (b + 1) * kernels::kFp8Block);
        for (int64_t k = b * kernels::kFp8Block; k < k1; ++k)
          partial = std::fma(x[i * ldx + k], model::Fp8E4m3ToF32(q[n * w.k + k]), partial);
        acc = std::fma(partial, w.scales[(n / kernels::kFp8Block) * kb + b], acc);
      }
      out[i * ldo + n] = acc;
    }
}

}  // namespace

void MatmulSlice(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, int64_t n_begin,
                 int64_t n_end, float* out, int64_t ldo) {
  if (w.fp8) return MatmulFp8Slice(x, m, ldx, w, n_begin, n_end, out, ldo);
  const float* wf = static_cast<const float*>(w.data);        // (n, k) when f32
  const uint16_t* wb = static_cast<const uint16_t*>(w.data);  // (n, k) when bf16
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t n = n_begin; n < n_end; ++n) {
      float acc = 0;
      for (int64_t k = 0; k < w.k; ++k) {
        const float wv = w.bf16 ? model::Bf16ToF32(wb[n * w.k + k]) : wf[n * w.k + k];
        acc += x[i * ldx + k] * wv;
      }
      out[i * ldo + n] = acc;
    }
  }
}

void Matmul(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, float* out,
            int64_t ldo) {
  MatmulSlice(x, m, ldx, w, 0, w.n, out, ldo);
}

namespace {

float FlushDenormal(float v) {
  return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v;
}

// f32 -> bf16, nearest even, denormals to signed zero (as vcvtne2ps2bf16).
uint16_t RoundToBf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if (std::isnan(v)) return static_cast<uint16_t>((u >> 16) | 0x40);
  if (std::fpclassify(v) == FP_SUBNORMAL) u &= 0x80000000u;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

void MatmulBf16Dot(const float* x, int64_t m, int64_t ldx, const WeightMatrix& w, float* out,
                   int64_t ldo) {
  if (!w.bf16 || w.k % 2 != 0) return Matmul(x, m, ldx, w, out, ldo);
  const uint16_t* wb = static_cast<const uint16_t*>(w.data);  // (n, k)
  std::vector<float> xr(w.k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t k = 0; k < w.k; ++k)
      xr[k] = FlushDenormal(model::Bf16ToF32(RoundToBf16(x[i * ldx + k])));
    for (int64_t n = 0; n < w.n; ++n) {
      float acc = 0;
      for (int64_t k = 0; k < w.k; k += 2)
        for (int64_t kk : {k + 1, k}) {
          const float wv = FlushDenormal(model::Bf16ToF32(wb[n * w.k + kk]));
          acc = FlushDenormal(FlushDenormal(acc) + xr[kk] * wv);
        }
      out[i * ldo + n] = acc;
    }
  }
}

uint8_t F32ToE4m3Fast(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;          // NaN
  if (abs >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and infinity): saturate
  if (abs < 0x3c800000u) {                     // below 2^-6: the subnormal grid 2^-9
    const float units = std::nearbyint(std::fabs(f) * 512.0f);  // exact scaling, then RNE
    return sign | static_cast<uint8_t>(units);  // 8 units is the code of 2^-6 itself
  }
  // Normal: drop 20 of f32's 23 mantissa bits, rounding to nearest even (a carry moves into the
  // exponent as it should); rebias the exponent from 127 to 7. Below 448 it cannot pass 0x7e.
  const uint32_t r = (abs + 0x7ffffu + ((abs >> 20) & 1u)) >> 20;
  return sign | static_cast<uint8_t>(r - ((127u - 7u) << 3));
}

uint8_t QuantizeKvFp8(float x, float scale) { return F32ToE4m3Fast(x / scale); }

const uint8_t* KvElemPtr(const PagedKv& kv, int32_t page, int slot, int head, int which) {
  const size_t off =
      kv.hnd ? ((static_cast<size_t>(head) * 2 + which) * kv.page_size + slot) * kv.head_dim
             : ((static_cast<size_t>(slot) * kv.num_kv_heads + head) * 2 + which) * kv.head_dim;
  return kv.base + static_cast<size_t>(page) * kv.page_bytes + off * kv.elem_bytes();
}

float LoadKv(const PagedKv& kv, const uint8_t* p, int i, int which) {
  if (kv.fp8) return model::Fp8E4m3ToF32(p[i]) * (which == 0 ? kv.k_scale : kv.v_scale);
  if (kv.bf16) {
    uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    return model::Bf16ToF32(v);
  }
  float f;
  std::memcpy(&f, p + 4 * i, 4);
  return f;
}

void PagedAttentionItem(const AttentionArgs& a, int token, int kv_head, float* scores) {
  const PagedKv& kv = a.kv;
  const AttnSeq& seq = a.seqs[a.token_seq[token]];
  const int pos = seq.start_pos + (token - seq.token_begin);
  const int group = a.num_heads / kv.num_kv_heads;
  const int d = kv.head_dim;
  for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    const float* q = a.q + token * a.ldq + static_cast<int64_t>(h) * d;  // (head_dim)
    float* out = a.out + token * a.ldo + static_cast<int64_t>(h) * d;    // (head_dim)
    float max_score = -INFINITY;
    for (int j = 0; j <= pos; ++j) {  // scores (pos+1)
      const uint8_t* k =
          KvElemPtr(kv, seq.page_table[j / kv.page_size], j % kv.page_size, kv_head, 0);
      float dot = 0;
      for (int i = 0; i < d; ++i) dot += q[i] * LoadKv(kv, k, i, 0);
      scores[j] = dot * a.scale;
      max_score = std::fmax(max_score, scores[j]);
    }
    float sum = 0;
    for (int j = 0; j <= pos; ++j) {
      scores[j] = std::exp(scores[j] - max_score);
      sum += scores[j];
    }
    for (int i = 0; i < d; ++i) out[i] = 0;
    for (int j = 0; j <= pos; ++j) {
      const uint8_t* v =
          KvElemPtr(kv, seq.page_table[j / kv.page_size], j % kv.page_size, kv_head, 1);
      const float p = scores[j] / sum;
      for (int i = 0; i < d; ++i) out[i] += p * LoadKv(kv, v, i, 1);
    }
  }
}

void PagedAttention(const AttentionArgs& a, float* scratch) {
  for (int t = 0; t < a.num_tokens; ++t)
    for (int g = 0; g < a.kv.num_kv_heads; ++g) PagedAttentionItem(a, t, g, scratch);
}

void SiluMul(const float* gate, int64_t ldg, const float* up, int64_t ldu, int64_t rows,
             int64_t dim, float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) {
      const float g = gate[r * ldg + i];
      out[r * ldo + i] = g / (1.0f + std::exp(-g)) * up[r * ldu + i];
    }
}

void AppendKv(const PagedKv& kv, const AttnSeq& seq, const float* k, int64_t ldk, const float* v,
              int64_t ldv) {
  for (int t = 0; t < seq.num_tokens; ++t) {
    const int pos = seq.start_pos + t;
    const int32_t page = seq.page_table[pos / kv.page_size];
    for (int h = 0; h < kv.num_kv_heads; ++h) {
      for (int which = 0; which < 2; ++which) {
        const float* src = (which == 0 ? k + t * ldk : v + t * ldv) + h * kv.head_dim;
        uint8_t* dst = const_cast<uint8_t*>(KvElemPtr(kv, page, pos % kv.page_size, h, which));
        if (kv.fp8) {
          const float scale = which == 0 ? kv.k_scale : kv.v_scale;
          for (int i = 0; i < kv.head_dim; ++i) dst[i] = QuantizeKvFp8(src[i], scale);
        } else if (kv.bf16) {
          uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
          for (int i = 0; i < kv.head_dim; ++i) d16[i] = model::F32ToBf16(src[i]);
        } else {
          std::memcpy(dst, src, sizeof(float) * kv.head_dim);
        }
      }
    }
  }
}

}  // namespace pd::engine::ref
