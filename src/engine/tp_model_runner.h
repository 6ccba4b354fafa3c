// Private to src/engine: the tensor-parallel runner (tp_model_runner.cc). It splits the model over
// options.tensor_parallel_size ranks (tp_shard.h), each a rank runner (rank_runner.h) with its own
// KV region and thread pool, and runs them in lockstep: rank 0 on the caller's thread, the others
// on threads it owns.
#pragma once

#include <memory>

#include "common/status.h"
#include "engine/model_runner.h"
#include "engine/model_runner_weights.h"
#include "model/weights.h"

namespace pd::engine {

Result<std::unique_ptr<ModelRunner>> CreateTpModelRunner(const model::ModelWeights& weights,
                                                         const ModelRunnerOptions& options);
// The same over weights already prepared (an MTP layer's, with its input projection, which
// every rank shares: the residual stream is replicated).
Result<std::unique_ptr<ModelRunner>> CreateTpModelRunner(std::unique_ptr<RunnerWeights> full,
                                                         const ModelRunnerOptions& options);

}  // namespace pd::engine
