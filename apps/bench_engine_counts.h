// Private to cmd_bench_engine.cc: the parameters, bytes and flops of a decode or prefill step of
// a model config, which the benchmark's fractions of bandwidth and FMA peak are computed from.
#pragma once

#include <cmath>

#include "model/config.h"

namespace pd::apps::bench_counts {

// Matrix parameters of one layer's attention: q/k/v/o, or MLA's projections (kv_b counted once:
// the absorbed decode reads W_UK and W_UV, which are its rows).
inline double AttentionParams(const model::ModelConfig& c) {
  const double h = c.hidden_size;
  if (!c.is_mla()) return h * (c.q_size() + 2 * c.kv_size()) + c.q_size() * h;
  const model::MlaConfig& m = c.mla;
  const double nh = c.num_heads, qk = m.qk_head_dim();
  const double q = m.q_lora_rank > 0 ? m.q_lora_rank * (h + nh * qk) : nh * qk * h;
  return q + h * m.latent_dim() + m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim) +
         nh * m.v_head_dim * h;
}

// Matrix parameters of the layers a step multiplies by: attention, and the dense MLP or the MoE
// router, `experts` routed experts per MoE layer and the shared expert.
inline double LayerMatrixParams(const model::ModelConfig& c, double experts) {
  const double h = c.hidden_size;
  const model::MoeConfig& m = c.moe;
  double params = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    params += AttentionParams(c);
    if (c.IsMoeLayer(l)) {
      params +=
          h * m.num_experts + 3 * h * m.moe_intermediate_size * (experts + m.n_shared_experts);
    } else {
      params += 3 * h * c.intermediate_size;
    }
  }
  return params;
}

// Routed experts a token multiplies by in each MoE layer (0 for a dense model).
inline double ExpertsPerToken(const model::ModelConfig& c) { return c.moe.num_experts_per_tok; }

// Distinct routed experts a decode step of `batch` tokens reads per MoE layer: top_k at batch 1;
// above, the expectation under uniform routing, E (1 - (1 - k/E)^batch) — an estimate, the
// synthetic router's choices are close to uniform.
inline double ExpertsRead(const model::ModelConfig& c, int batch) {
  if (!c.is_moe()) return 0;
  const double e = c.moe.num_experts, k = c.moe.num_experts_per_tok;
  return batch == 1 ? k : e * (1 - std::pow(1 - k / e, batch));
}

// Weight bytes a decode step of `batch` tokens reads: the layer matrices (MoE layers: only the
// experts chosen) and lm_head. bf16 checkpoints: 2 bytes each. FP8 ones: the projections and
// experts 1 byte plus an f32 scale per 128x128 block; the router and lm_head stay bf16.
inline double WeightBytes(const model::ModelConfig& c, bool fp8, int batch) {
  const double lm_head = static_cast<double>(c.vocab_size) * c.hidden_size;
  const double layers = LayerMatrixParams(c, ExpertsRead(c, batch));
  if (!fp8) return (layers + lm_head) * 2;
  double router = 0;
  for (int l = 0; l < c.num_layers; ++l)
    if (c.IsMoeLayer(l)) router += static_cast<double>(c.hidden_size) * c.moe.num_experts;
  // MLA's kv_b is dequantised to f32 at load (W_UK^T and W_UV, which decode reads).
  const double kv_b = c.is_mla() ? static_cast<double>(c.num_layers) * c.mla.kv_lora_rank *
                                       c.num_heads * (c.mla.qk_nope_head_dim + c.mla.v_head_dim)
                                 : 0.0;
  return (layers - router - kv_b) * (1 + 4.0 / (128 * 128)) + (router + lm_head) * 2 + kv_b * 4;
}

// Attention flops of one query at `pos` (QK^T and PV over pos+1 keys, every layer); for
// MLA (absorbed): scores over the latent and rope key, output over the latent, per head.
inline double AttnFlops(const model::ModelConfig& c, int pos) {
  if (c.is_mla())
    return 2.0 * (pos + 1) * c.num_heads * (c.mla.latent_dim() + c.mla.kv_lora_rank) * c.num_layers;
  return 4.0 * (pos + 1) * c.q_size() * c.num_layers;
}

}  // namespace pd::apps::bench_counts
