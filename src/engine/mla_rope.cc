#include "engine/mla_rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace pd::engine {
namespace {

double YarnMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// The dimension (of d) whose wavelength makes num_rotations turns over max_pos positions.
double CorrectionDim(double num_rotations, int d, double base, double max_pos) {
  return d * std::log(max_pos / (num_rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

}  // namespace

MlaRope ComputeMlaRope(const model::ModelConfig& c) {
  const int d = c.mla.qk_rope_head_dim, half = d / 2;
  const double base = c.rope_theta;
  MlaRope rope;
  rope.inv_freq.resize(half);
  for (int i = 0; i < half; ++i) rope.inv_freq[i] = std::pow(base, -2.0 * i / d);
  if (!c.yarn) return rope;
  const model::YarnScaling& y = c.yarn_scaling;
  // transformers' _compute_yarn_parameters (main): the config's factor as given (the parser
  // requires it); original_max_position_embeddings, when given, only sets the correction range.
  // Its 4.4x-4.5x releases replaced factor by max_position_embeddings / original whenever original
  // was given; real DeepSeek-V3 configs have max_position_embeddings == factor * original, where
  // both readings agree.
  const double factor = y.factor;
  const double original = y.original_max_position_embeddings > 0
                              ? y.original_max_position_embeddings
                              : c.max_position_embeddings;
  if (y.attention_factor > 0) {
    rope.attention_factor = y.attention_factor;
  } else if (y.mscale != 0 && y.mscale_all_dim != 0) {
    rope.attention_factor = YarnMscale(factor, y.mscale) / YarnMscale(factor, y.mscale_all_dim);
  } else {
    rope.attention_factor = YarnMscale(factor, 1.0);
  }
  double low = CorrectionDim(y.beta_fast, d, base, original);
  double high = CorrectionDim(y.beta_slow, d, base, original);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(d - 1));
  if (low == high) high += 0.001;  // as transformers: no division by zero
  for (int i = 0; i < half; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;
    rope.inv_freq[i] =
        rope.inv_freq[i] / factor * (1.0 - extrapolation) + rope.inv_freq[i] * extrapolation;
  }
  return rope;
}

void MlaRopeTable(const MlaRope& rope, const int32_t* positions, int64_t rows, float* cos_out,
                  float* sin_out) {
  const int64_t half = static_cast<int64_t>(rope.inv_freq.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = positions[r] * rope.inv_freq[i];
      cos_out[r * half + i] = static_cast<float>(std::cos(angle) * rope.attention_factor);
      sin_out[r * half + i] = static_cast<float>(std::sin(angle) * rope.attention_factor);
    }
}

float MlaSoftmaxScale(const model::ModelConfig& c) {
  double scale = 1.0 / std::sqrt(static_cast<double>(c.mla.qk_head_dim()));
  if (c.yarn && c.yarn_scaling.mscale_all_dim != 0) {
    const double m = YarnMscale(c.yarn_scaling.factor, c.yarn_scaling.mscale_all_dim);
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

}  // namespace pd::engine
