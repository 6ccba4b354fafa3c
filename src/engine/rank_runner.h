// Private to src/engine: one rank's forward pass (rank_runner.cc). At TP 1 it is the instance's
// runner over the whole model; in a tensor-parallel instance (tp_model_runner.h) each rank runs one
// over its shard of the weights (tp_shard.h) and joins the others' partial sums through the
// all-reduce of its RankContext.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "engine/model_runner.h"
#include "engine/model_runner_weights.h"
#include "engine/tp_all_reduce.h"
#include "model/weights.h"

namespace pd::engine {

class MoeExchange;

// How a rank runner takes part in a TP or DP instance; the default is a plain single-rank runner.
struct RankContext {
  TpAllReduce* reduce = nullptr;  // null: TP 1
  // A data-parallel rank (dp_engine.h): its MoE layers run expert-parallel through this exchange
  // (moe_expert_parallel.h), `rank` being its DP rank. Forward then takes part in every MoE layer
  // even when its batch is empty or invalid, so that its experts serve the other ranks' tokens.
  MoeExchange* experts = nullptr;
  int rank = 0;
  int64_t vocab_begin = 0;  // where this rank's lm_head rows go in the logits
};

// A runner over already prepared (and, for TP, sharded) weights with a region of num_pages. In TP
// mode Forward expects `out` sized by the caller (logits rows of the full vocab, last_hidden rows
// of hidden) and writes only its logits columns (and last_hidden: rank 0).
Result<std::unique_ptr<ModelRunner>> CreateRankRunner(std::unique_ptr<RunnerWeights> w,
                                                      const ModelRunnerOptions& options,
                                                      int64_t num_pages, const RankContext& ctx);

// The TP 1 runner: the whole model as one rank.
Result<std::unique_ptr<ModelRunner>> CreateSingleRankRunner(const model::ModelWeights& weights,
                                                            const ModelRunnerOptions& options);

// The KV spec of a rank whose (sharded) config is c, holding num_kv_heads KV heads: an MLA model
// keeps one latent row (latent_dim) per token instead, the same on every rank.
KvCacheSpec RankKvSpec(KvCacheSpec spec, const model::ModelConfig& c, int num_kv_heads);

// num_pages for a region spec over `num_layers`, from options (num_pages, or kv_cache_bytes over
// the bytes one page takes on all ranks together: `page_bytes_all_ranks`).
Result<int64_t> RunnerNumPages(const ModelRunnerOptions& options, size_t page_bytes_all_ranks,
                               int num_layers);

}  // namespace pd::engine
