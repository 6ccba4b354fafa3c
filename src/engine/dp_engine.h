// Data-parallel attention (`--data-parallel-size N`, MLA models): one instance of N attention
// ranks, each a sub-engine with its own requests, scheduler, page pool and KV region (latent
// pages), stepped together. Per step every rank schedules its own batch; then all ranks run their
// forward passes at once, rank 0 on the engine loop and ranks 1.. on threads of their own: each
// rank runs attention (and the dense MLP layers, whose weights every rank holds) over its own
// tokens, and the MoE layers run over all ranks' tokens together, expert-parallel, the routed
// experts dealt to the ranks and the tokens exchanged in-process (moe_expert_parallel.h). A rank
// with nothing scheduled still serves its experts. Then each rank samples its own requests.
//
// Requests go to the rank with the fewest unfinished requests (lowest rank on a tie). Since each
// token's computation does not depend on the tokens sharing its step, a request's tokens and
// logprobs equal those of a DP 1 instance.
//
// A DP instance serves the prefill role too: each prefill-only request goes to the least loaded
// rank, which computes it in its own pages (the prefill messenger sends them from that rank's
// region, posting each layer once that rank's progress says it is final).
//
// Refused: non-MLA models (the feature is the MLA deployment's: GQA models shard their KV with
// TP instead), and DP together with TP above 1.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/config.h"
#include "model/weights.h"

namespace pd::engine {

// InvalidArgument naming the sizes and the model when `data_parallel_size` cannot serve it.
Status ValidateDataParallel(const model::ModelConfig& c, int data_parallel_size,
                            int tensor_parallel_size);

// The engine of `data_parallel_size` ranks (at least 1); options.runner.kv_cache_bytes is split
// evenly over the ranks' regions (num_pages, when set, is per rank), num_threads is per rank (0:
// all cores / ranks).
Result<std::unique_ptr<Engine>> CreateDpEngine(const model::ModelWeights& weights,
                                               const EngineOptions& options,
                                               int data_parallel_size);

// The data-parallel ranks of the instance whose runner() this is: N for a DP engine's (its
// rank_region(r) is then DP rank r's region, with page ids of its own), else 1.
int DataParallelSize(const ModelRunner& runner);

// DP rank `rank`'s layer progress (each rank counts its own steps): a DP engine's step observer
// chunks of that rank are final per layer against it. Without DP ranks: rank 0, runner.progress().
const LayerProgress& DpRankProgress(const ModelRunner& runner, int rank);

// A DP engine's DisaggHooks name page `page` of DP rank `rank` by DpPageId, every rank's region
// holding `pages_per_rank` pages; and back.
inline int32_t DpPageId(int rank, int32_t page, int32_t pages_per_rank) {
  return rank * pages_per_rank + page;
}
inline int DpRankOfPage(int32_t id, int32_t pages_per_rank) { return id / pages_per_rank; }
inline int32_t DpLocalPage(int32_t id, int32_t pages_per_rank) { return id % pages_per_rank; }

}  // namespace pd::engine
