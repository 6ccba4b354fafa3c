// Private to src/engine: the weights of Multi-head Latent Attention as the runner reads them
// (RunnerMlaWeights in model_runner_weights.h): prepared from the checkpoint, packed, sharded.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "engine/model_runner_weights.h"
#include "model/config.h"
#include "model/weights.h"

namespace pd::engine {

// Checks the MLA tensors of one layer (`prefix` is "model.layers.N.self_attn.") and lays them out:
// kv_b_proj is split per head into W_UK[h]^T (R, dn), copied transposed, and W_UV[h] (dv, R), a
// view; everything else is read in place (f16 converted).
Status PrepareMlaWeights(const model::MlaWeights& w, const model::ModelConfig& c,
                         model::DType dtype, const std::string& prefix, RunnerMlaWeights* out);

// The matrices of one MLA layer PackRunnerWeights lays out in kPanel32: q|kv_a (or q_a|kv_a)
// stacked into `a`, q_b, every head's W_UK^T and W_UV, and o.
void AppendMlaPackJobs(RunnerMlaWeights* w, std::vector<PackJob>* jobs);

// The MLA weights of query heads [head_begin, head_begin + num_heads) over the full (row-major)
// ones, which must outlive the result: q (or q_b) rows and W_UK^T/W_UV of those heads, o_proj's
// columns of them; q_a, kv_a and the norms whole (each rank computes the latent itself).
RunnerMlaWeights ShardMlaWeights(const RunnerMlaWeights& full, const model::ModelConfig& c,
                                 int head_begin, int num_heads);

}  // namespace pd::engine
