// Private to src/engine: the weights as the forward-pass kernels read them, laid out once at load.
// F16 checkpoints are converted to F32; BF16 and F32 matrices are read in place from the mapped
// checkpoint (which must outlive the runner); small vectors (norms, biases) become F32.
#pragma once

#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/kernels.h"
#include "model/weights.h"

namespace pd::engine {

// One linear layer W (n, k), plus the F32 copy it owns when the checkpoint was F16.
struct LinearWeight {
  kernels::WeightMatrix w;
  std::vector<float> owned;  // (n, k) when converted
};

struct RunnerLayerWeights {
  std::vector<float> input_norm, post_norm;   // (hidden)
  std::vector<float> q_norm, k_norm;          // (head_dim) when qk_norm, else empty
  std::vector<float> q_bias, k_bias, v_bias;  // (q_size)/(kv_size) when attention_bias
  LinearWeight q, k, v, o, gate, up, down;
};

struct RunnerWeights {
  model::ModelConfig config;
  std::vector<RunnerLayerWeights> layers;
  std::vector<float> final_norm;  // (hidden)
  LinearWeight embed;             // (vocab, hidden): row lookups
  LinearWeight lm_head;           // (vocab, hidden)
};

// Checks shapes and dtypes against the config and lays the weights out for the kernels.
Result<std::unique_ptr<RunnerWeights>> PrepareRunnerWeights(const model::ModelWeights& weights);

// Row `row` of an embedding-like matrix as f32 into out (k).
void LoadWeightRow(const kernels::WeightMatrix& w, int64_t row, float* out);

}  // namespace pd::engine
