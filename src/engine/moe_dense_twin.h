// A dense model with a MoE model's active parameters, for benchmarks that compare the two: every
// MoE layer's MLP becomes one dense SwiGLU of width W = (top_k + n_shared_experts) *
// moe_intermediate_size whose columns are the layer's first top_k routed experts and its shared
// expert side by side (so a token multiplies by as many MLP parameters as in the MoE model, less
// the router). Layers that were dense keep their first W columns (their intermediate_size must be
// at least W; DeepSeek-V3's dense layers are exactly W wide). Attention, norms, embedding and
// lm_head are the MoE model's own tensors. FP8 checkpoints: the matrices keep their codes and
// block scales side by side, so moe_intermediate_size must be a multiple of the 128-wide block.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "model/weights.h"

namespace pd::engine {

struct DenseTwin {
  std::vector<std::vector<uint8_t>> buffers;  // the MLP matrices built here
  model::ModelWeights weights;  // views into buffers and into the MoE model's checkpoint
};

// InvalidArgument when `moe` has no MoE layer, a dense layer narrower than W, or FP8 experts whose
// width is not a whole number of scale blocks. `moe` must outlive
// the result.
Result<std::unique_ptr<DenseTwin>> MakeDenseTwin(const model::ModelWeights& moe);

}  // namespace pd::engine
