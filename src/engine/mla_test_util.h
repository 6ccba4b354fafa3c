// Test helper: a tiny random deepseek_v3 model (MLA attention, dense SwiGLU MLPs) built in memory,
// for runner tests that need no checkpoint on disk. Odd sizes: kv_lora_rank 40, rope 6.
#pragma once

#include <memory>
#include <random>
#include <vector>

#include "engine/model_runner_test_util.h"

namespace pd::engine::testing {

struct TinyMlaOptions {
  model::DType dtype = model::DType::kF32;
  uint64_t seed = 7;
  int vocab = 67;
  int hidden = 32;
  int intermediate = 40;
  int layers = 2;
  int heads = 4;
  int q_lora_rank = 0;  // 0: plain q_proj
  int kv_lora_rank = 40;
  int nope = 8;
  int rope = 6;
  int v_head_dim = 10;
  bool interleave = true;
  bool yarn = false;
};

inline std::unique_ptr<TinyModel> MakeTinyMlaModel(const TinyMlaOptions& o) {
  auto m = std::make_unique<TinyModel>();
  m->buffers.reserve(1024);  // views point into buffers: never reallocate
  model::ModelConfig& c = m->weights.config;
  c.arch = model::Arch::kDeepseekV3;
  c.vocab_size = o.vocab;
  c.hidden_size = o.hidden;
  c.intermediate_size = o.intermediate;
  c.num_layers = o.layers;
  c.num_heads = o.heads;
  c.num_kv_heads = o.heads;  // as transformers sets them for deepseek_v3
  c.head_dim = o.rope;
  c.max_position_embeddings = 256;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.mla.q_lora_rank = o.q_lora_rank;
  c.mla.kv_lora_rank = o.kv_lora_rank;
  c.mla.qk_nope_head_dim = o.nope;
  c.mla.qk_rope_head_dim = o.rope;
  c.mla.v_head_dim = o.v_head_dim;
  c.mla.rope_interleave = o.interleave;
  if (o.yarn) {
    c.yarn = true;
    c.yarn_scaling.factor = 4.0;
    c.yarn_scaling.original_max_position_embeddings = 64;
    c.yarn_scaling.mscale = 0.8;
    c.yarn_scaling.mscale_all_dim = 1.0;
  }
  m->weights.dtype = o.dtype;
  std::mt19937_64 rng(o.seed);
  const model::DType dt = o.dtype;
  const int64_t h = c.hidden_size, H = c.num_heads, qh = o.nope + o.rope;
  auto lin = [&](int64_t n, int64_t k) {
    return MakeTensor(*m, rng, {n, k}, dt, 1.0f / std::sqrt(static_cast<float>(k)), 0.0f);
  };
  auto norm = [&](int64_t n) { return MakeTensor(*m, rng, {n}, dt, 0.1f, 1.0f); };
  m->weights.embed_tokens = MakeTensor(*m, rng, {c.vocab_size, h}, dt, 1.0f, 0.0f);
  for (int l = 0; l < c.num_layers; ++l) {
    model::LayerWeights lw;
    lw.input_norm = norm(h);
    model::MlaWeights mla;
    if (o.q_lora_rank > 0) {
      mla.q_a_proj = lin(o.q_lora_rank, h);
      mla.q_a_norm = norm(o.q_lora_rank);
      mla.q_b_proj = lin(H * qh, o.q_lora_rank);
    } else {
      mla.q_proj = lin(H * qh, h);
    }
    mla.kv_a_proj = lin(o.kv_lora_rank + o.rope, h);
    mla.kv_a_norm = norm(o.kv_lora_rank);
    mla.kv_b_proj = lin(H * (o.nope + o.v_head_dim), o.kv_lora_rank);
    mla.o_proj = lin(h, H * o.v_head_dim);
    lw.mla = mla;
    lw.post_norm = norm(h);
    lw.gate_proj = lin(c.intermediate_size, h);
    lw.up_proj = lin(c.intermediate_size, h);
    lw.down_proj = lin(h, c.intermediate_size);
    m->weights.layers.push_back(std::move(lw));
  }
  m->weights.final_norm = norm(h);
  m->weights.lm_head = MakeTensor(*m, rng, {c.vocab_size, h}, dt, 3.0f / std::sqrt(h), 0.0f);
  return m;
}

}  // namespace pd::engine::testing
