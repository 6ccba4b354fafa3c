// Test helper: a tiny random Llama / Qwen2 / Qwen3 model built in memory (TensorViews over buffers
// this struct owns), for runner tests that need no checkpoint on disk.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "engine/matmul_precision.h"
#include "model/dtype.h"
#include "model/weights.h"

namespace pd::engine::testing {

struct TinyModel {
  std::vector<std::vector<uint8_t>> buffers;
  model::ModelWeights weights;
};

struct TinyModelOptions {
  model::Arch arch = model::Arch::kQwen3;
  model::DType dtype = model::DType::kF32;
  uint64_t seed = 1;
  int vocab = 67;
  int hidden = 24;
  int intermediate = 40;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 10;
  bool tie = false;
};

inline model::TensorView MakeTensor(TinyModel& m, std::mt19937_64& rng, std::vector<int64_t> shape,
                                    model::DType dtype, float scale, float offset) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint8_t> bytes(n * model::DTypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float v = offset + scale * dist(rng);
    if (dtype == model::DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == model::DType::kBF16 ? model::F32ToBf16(v) : model::F32ToF16(v);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  m.buffers.push_back(std::move(bytes));
  model::TensorView t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = m.buffers.back().data();
  return t;
}

inline std::unique_ptr<TinyModel> MakeTinyModel(const TinyModelOptions& o) {
  auto m = std::make_unique<TinyModel>();
  m->buffers.reserve(1024);  // views point into buffers: never reallocate
  model::ModelConfig& c = m->weights.config;
  c.arch = o.arch;
  c.vocab_size = o.vocab;
  c.hidden_size = o.hidden;
  c.intermediate_size = o.intermediate;
  c.num_layers = o.layers;
  c.num_heads = o.heads;
  c.num_kv_heads = o.kv_heads;
  c.head_dim = o.head_dim;
  c.max_position_embeddings = 256;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = o.tie;
  c.attention_bias = o.arch == model::Arch::kQwen2;
  c.qk_norm = o.arch == model::Arch::kQwen3;
  m->weights.dtype = o.dtype;
  std::mt19937_64 rng(o.seed);
  const model::DType dt = o.dtype;
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), in = c.intermediate_size;
  auto lin = [&](int64_t n, int64_t k) {
    return MakeTensor(*m, rng, {n, k}, dt, 1.0f / std::sqrt(static_cast<float>(k)), 0.0f);
  };
  auto norm = [&](int64_t n) { return MakeTensor(*m, rng, {n}, dt, 0.1f, 1.0f); };
  m->weights.embed_tokens = MakeTensor(*m, rng, {c.vocab_size, h}, dt, 1.0f, 0.0f);
  for (int l = 0; l < c.num_layers; ++l) {
    model::LayerWeights lw;
    lw.input_norm = norm(h);
    lw.q_proj = lin(q, h);
    lw.k_proj = lin(kv, h);
    lw.v_proj = lin(kv, h);
    if (c.attention_bias) {
      lw.q_bias = MakeTensor(*m, rng, {q}, dt, 0.2f, 0.0f);
      lw.k_bias = MakeTensor(*m, rng, {kv}, dt, 0.2f, 0.0f);
      lw.v_bias = MakeTensor(*m, rng, {kv}, dt, 0.2f, 0.0f);
    }
    if (c.qk_norm) {
      lw.q_norm = norm(c.head_dim);
      lw.k_norm = norm(c.head_dim);
    }
    lw.o_proj = lin(h, q);
    lw.post_norm = norm(h);
    lw.gate_proj = lin(in, h);
    lw.up_proj = lin(in, h);
    lw.down_proj = lin(h, in);
    m->weights.layers.push_back(std::move(lw));
  }
  m->weights.final_norm = norm(h);
  m->weights.lm_head = o.tie
                           ? m->weights.embed_tokens
                           : MakeTensor(*m, rng, {c.vocab_size, h}, dt, 3.0f / std::sqrt(h), 0.0f);
  return m;
}

// max |a - b| / max |b|: the relative error of a whole logits row.
inline double RelError(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / scale;
}

// SetAmxAllowed(allowed) for its lifetime (runners created meanwhile follow it), then the setting
// it found.
class ScopedAmxAllowed {
 public:
  explicit ScopedAmxAllowed(bool allowed) : before_(AmxAllowed()) { SetAmxAllowed(allowed); }
  ~ScopedAmxAllowed() { SetAmxAllowed(before_); }
  ScopedAmxAllowed(const ScopedAmxAllowed&) = delete;
  ScopedAmxAllowed& operator=(const ScopedAmxAllowed&) = delete;

 private:
  const bool before_;
};

// n normal(0, scale) floats, deterministic for a seed (kernel test inputs).
inline std::vector<float> Random(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// n deterministic token ids below vocab, different per seed.
inline std::vector<int32_t> Tokens(int n, int seed, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (seed * 31 + i * 17 + i * i) % vocab;
  return t;
}

}  // namespace pd::engine::testing
