// Rotary embedding of MLA's rope part (qk_rope_head_dim values per head), with DeepSeek-V3's yarn
// rope_scaling, and the softmax scale it changes. Computed in double, as transformers'
// _compute_yarn_parameters and DeepseekV3Attention define them (which compute in float32).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace pd::engine {

// The rotary parameters of the rope part of an MLA model.
struct MlaRope {
  std::vector<double> inv_freq;   // (qk_rope_head_dim / 2)
  double attention_factor = 1.0;  // cos and sin are multiplied by it (yarn's mscale ratio)
};

// Without yarn: inv_freq[i] = theta^(-2i/d). With yarn (d = qk_rope_head_dim, base = theta):
//   factor     = max_position_embeddings / original_max_position_embeddings when the latter is
//                given, else rope_scaling.factor
//   low, high  = correction range of beta_fast, beta_slow rotations over original_max (floored /
//                ceiled when truncate), clamped to [0, d-1]
//   ramp[i]    = clamp((i - low) / (high - low), 0, 1);  e = 1 - ramp[i]
//   inv_freq   = theta^(-2i/d) / factor * (1 - e) + theta^(-2i/d) * e
//   attention_factor = rope_scaling.attention_factor, else mscale(factor, mscale) /
//                mscale(factor, mscale_all_dim) when both are given, else mscale(factor, 1),
//   with mscale(s, m) = 0.1 * m * ln(s) + 1 for s > 1, else 1.
MlaRope ComputeMlaRope(const model::ModelConfig& c);

// cos/sin (rows, d/2) of positions: angle = pos * inv_freq[i] in double, times attention_factor.
void MlaRopeTable(const MlaRope& rope, const int32_t* positions, int64_t rows, float* cos_out,
                  float* sin_out);

// The softmax scale of MLA attention: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2
// under yarn with mscale_all_dim given (factor as config.json writes it, as DeepseekV3Attention
// reads it).
float MlaSoftmaxScale(const model::ModelConfig& c);

}  // namespace pd::engine
