// The rank runner's Multi-head Latent Attention (deepseek_v3), weight-absorbed for prefill and
// decode alike: the cache holds one latent row per token, and no step expands it into per-head K
// or V. Per token, with this rank's H heads (R = kv_lora_rank, L = R + qk_rope_head_dim):
//   a        = h @ [q | kv_a]^T          (or [q_a | kv_a]; then q = RMSNorm(q_a) @ q_b^T)
//   latent   = [RMSNorm(c) * kv_a_layernorm | rope(k_rope)]   -> the page slot of the token
//   q_abs[h] = [W_UK[h]^T q_nope[h] | rope(q_rope[h])]        (L)
//   o_lat[h] = sum_s softmax(scale * q_abs[h] . latent[s]) latent[s][:R]
//   out[h]   = W_UV[h] o_lat[h];  x += out @ o_proj^T (all-reduced over ranks with TP)
#include <algorithm>

#include "engine/mla_kernels_ref.h"
#include "engine/rank_runner_impl.h"

namespace pd::engine {

void RankRunner::HeadMatmul(const kernels::HeadMatmulArgs& a) {
  if (fast_) {
    kernels::ParallelHeadMatmul(pool_, isa_, a);
    return;
  }
  for (int h = 0; h < a.num_heads; ++h)
    Matmul(a.x + h * a.x_head_stride, a.ldx, a.w[h], a.out + h * a.out_head_stride, a.ldo, a.rows);
}

void RankRunner::MlaAttentionBlock(int l) {
  const RunnerLayerWeights& lw = w_->layers[l];
  const RunnerMlaWeights& M = *lw.mla;
  const model::MlaConfig& m = c_.mla;
  const int64_t t = num_tokens_, hd = c_.hidden_size, H = c_.num_heads;
  const int64_t R = m.kv_lora_rank, dr = m.qk_rope_head_dim, dn = m.qk_nope_head_dim;
  const int64_t dv = m.v_head_dim, qh = dn + dr, L = R + dr, half = dr / 2;
  const bool q_lora = m.q_lora_rank > 0;
  const int64_t qa = q_lora ? m.q_lora_rank : H * qh;  // the q part of `a`
  const int64_t lda = qa + L;
  // transformers builds q_a_layernorm and kv_a_layernorm with RMSNorm's default eps, not
  // rms_norm_eps (DeepseekV3Attention); real configs have both at 1e-6.
  constexpr float eps = 1e-6f;
  Ensure(s_.mla_a, t * lda);
  if (q_lora) Ensure(s_.mla_q, t * H * qh);
  Ensure(s_.mla_qabs, t * H * L);
  Ensure(s_.mla_olat, t * H * R);
  Ensure(s_.mla_out, t * H * dv);
  float* x = s_.x.data();
  float* h = s_.h.data();
  float* a = s_.mla_a.data();  // (T, qa | L)
  RmsNorm(x, t, hd, hd, lw.input_norm.data(), h, hd);
  if (M.a.data != nullptr) {  // fused and packed at load
    Matmul(h, hd, M.a, a, lda, t);
  } else {
    Matmul(h, hd, q_lora ? M.q_a.w : M.q.w, a, lda, t);
    Matmul(h, hd, M.kv_a.w, a + qa, lda, t);
  }
  const float* cs = s_.rope_cos.data();
  const float* sn = s_.rope_sin.data();
  Rows(t, [&](int64_t b, int64_t e) {  // the latent rows (and q_a's norm)
    NormRows(a + b * lda + qa, e - b, R, lda, M.kv_a_norm.data(), eps, a + b * lda + qa, lda);
    if (q_lora) NormRows(a + b * lda, e - b, qa, lda, M.q_a_norm.data(), eps, a + b * lda, lda);
    ref::ApplyRopeStrided(a + b * lda + qa + R, e - b, lda, 1, 0, static_cast<int>(dr),
                          cs + b * half, sn + b * half, m.rope_interleave);
  });
  float* q = a;  // (T, H, qh) row stride ldq
  int64_t ldq = lda;
  if (q_lora) {
    q = s_.mla_q.data();
    ldq = H * qh;
    Matmul(a, lda, M.q_b.w, q, ldq, t);
  }
  float* qabs = s_.mla_qabs.data();    // (T, H, L)
  Rows(t, [&](int64_t b, int64_t e) {  // rotate q_rope of every head, copy it into q_abs
    ref::ApplyRopeStrided(q + b * ldq + dn, e - b, ldq, static_cast<int>(H), qh,
                          static_cast<int>(dr), cs + b * half, sn + b * half, m.rope_interleave);
    for (int64_t r = b; r < e; ++r)
      for (int64_t i = 0; i < H; ++i)
        std::copy_n(q + r * ldq + i * qh + dn, dr, qabs + (r * H + i) * L + R);
  });
  kernels::HeadMatmulArgs uk;  // q_abs[:, h, :R] = W_UK[h]^T q_nope[:, h]
  uk.x = q;
  uk.ldx = ldq;
  uk.x_head_stride = qh;
  uk.w = M.uk_t.data();
  uk.num_heads = static_cast<int>(H);
  uk.out = qabs;
  uk.ldo = H * L;
  uk.out_head_stride = L;
  uk.rows = t;
  HeadMatmul(uk);
  MlaAttention(l);
  kernels::HeadMatmulArgs uv;  // out[:, h] = W_UV[h] o_lat[:, h]
  uv.x = s_.mla_olat.data();
  uv.ldx = H * R;
  uv.x_head_stride = R;
  uv.w = M.uv.data();
  uv.num_heads = static_cast<int>(H);
  uv.out = s_.mla_out.data();
  uv.ldo = H * dv;
  uv.out_head_stride = dv;
  uv.rows = t;
  HeadMatmul(uv);
  Matmul(s_.mla_out.data(), H * dv, M.o.w, s_.tmp.data(), hd, t);
  AddResidual(x, s_.tmp.data(), t * hd, /*attention=*/true);
}

void RankRunner::MlaAttention(int l) {
  const KvCacheSpec& spec = region_->spec();
  const model::MlaConfig& m = c_.mla;
  const int64_t H = c_.num_heads, R = m.kv_lora_rank, L = m.latent_dim();
  const int64_t lda = (m.q_lora_rank > 0 ? m.q_lora_rank : H * m.qk_head_dim()) + L;
  kernels::PagedLatent kv;
  kv.base = region_->Block(l, 0);
  kv.page_bytes = static_cast<int64_t>(spec.page_bytes());
  kv.page_size = spec.page_size;
  kv.latent_dim = static_cast<int>(L);
  kv.kv_lora_rank = static_cast<int>(R);
  kv.bf16 = spec.dtype == KvDType::kBF16;
  kv.fp8 = spec.dtype == KvDType::kFP8E4M3;
  kv.scale = spec.LayerScales(l).k_scale;             // vLLM's MLA caches the latent with k_scale
  const float* latent = s_.mla_a.data() + (lda - L);  // (T, L) row stride lda
  Rows(static_cast<int64_t>(s_.seqs.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const AttnSeq& seq = s_.seqs[i];
      ref::AppendLatent(kv, seq, latent + static_cast<int64_t>(seq.token_begin) * lda, lda);
    }
  });
  kernels::MlaAttentionArgs a;
  a.kv = kv;
  a.num_heads = static_cast<int>(H);
  a.q = s_.mla_qabs.data();
  a.ldq = H * L;
  a.out = s_.mla_olat.data();
  a.ldo = H * R;
  a.seqs = s_.seqs.data();
  a.num_seqs = static_cast<int>(s_.seqs.size());
  a.token_seq = s_.token_seq.data();
  a.num_tokens = static_cast<int>(num_tokens_);
  a.scale = MlaSoftmaxScale(c_);
  if (fast_) {
    kernels::ParallelMlaAttention(pool_, *mla_isa_, a, &mla_ws_);
  } else {
    ref::MlaAttention(a, s_.attn_scratch.data());
  }
}

}  // namespace pd::engine
