// Test helper: turns the layers of a tiny in-memory model (MakeTinyModel, or any TinyModel) that
// moe.IsMoeLayer picks into sparse MoE layers with random router, experts and shared expert.
#pragma once

#include <cmath>
#include <random>
#include <utility>

#include "engine/model_runner_test_util.h"

namespace pd::engine::testing {

// Sets m's config.moe to `moe` (for arch qwen3_moe: decoder_sparse_step / mlp_only_layers decide
// the MoE layers; deepseek_v3: first_k_dense_replace) and gives every MoE layer a router (plus
// e_score_correction_bias for sigmoid scoring), moe.num_experts experts of width
// moe.moe_intermediate_size and, with n_shared_experts, the shared expert; their dense MLP views
// are cleared.
inline void AddMoeLayers(TinyModel* m, const model::MoeConfig& moe, uint64_t seed) {
  model::ModelConfig& c = m->weights.config;
  c.moe = moe;
  std::mt19937_64 rng(seed);
  const model::DType dt = m->weights.dtype;
  const int64_t h = c.hidden_size, mi = moe.moe_intermediate_size, ne = moe.num_experts;
  auto lin = [&](int64_t n, int64_t k) {
    return MakeTensor(*m, rng, {n, k}, dt, 1.0f / std::sqrt(static_cast<float>(k)), 0.0f);
  };
  auto expert = [&](int64_t width) {
    return model::MlpWeights{lin(width, h), lin(width, h), lin(h, width)};
  };
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.IsMoeLayer(l)) continue;
    model::LayerWeights& lw = m->weights.layers[l];
    lw.gate_proj = lw.up_proj = lw.down_proj = model::TensorView();
    model::MoeWeights w;
    w.router = lin(ne, h);
    if (moe.scoring == model::MoeConfig::Scoring::kSigmoid)
      w.router_bias = MakeTensor(*m, rng, {ne}, model::DType::kF32, 0.1f, 0.0f);
    for (int64_t e = 0; e < ne; ++e) w.experts.push_back(expert(mi));
    if (moe.n_shared_experts > 0) w.shared_expert = expert(moe.n_shared_experts * mi);
    lw.moe = std::move(w);
  }
}

}  // namespace pd::engine::testing
