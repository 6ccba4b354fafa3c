// ModelRunner::Create: a lone rank runner at TP 1, the TP runner (which composes rank runners)
// above it.
#include "engine/model_runner.h"

#include "engine/rank_runner.h"
#include "engine/tp_model_runner.h"

namespace pd::engine {

Result<std::unique_ptr<ModelRunner>> ModelRunner::Create(const model::ModelWeights& weights,
                                                         const ModelRunnerOptions& options) {
  if (options.tensor_parallel_size == 1) return CreateSingleRankRunner(weights, options);
  return CreateTpModelRunner(weights, options);
}

}  // namespace pd::engine
