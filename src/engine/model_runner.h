// The forward pass of one instance over a batch that mixes prefill chunks and decode tokens: the
// interface, and Create, which picks the runner.
//
//   rank_runner.h      one rank's forward pass: the whole model at TP 1
//   tp_model_runner.h  TP > 1: N rank runners over sharded weights (tp_shard.h), in lockstep
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/check.h"
#include "common/status.h"
#include "common/trace.h"
#include "engine/cache_warm.h"
#include "engine/kv_cache.h"
#include "engine/layer_progress.h"
#include "engine/matmul_precision.h"
#include "model/weights.h"

namespace pd::engine {

// One sequence's part of a step.
struct SeqStep {
  int64_t seq_id = 0;
  int start_pos = 0;                    // position of token_ids[0] in the sequence
  std::span<const int32_t> token_ids;   // tokens to run now: a prefill chunk or one decode token
  std::span<const int32_t> page_table;  // the sequence's pages, covering start_pos+len tokens
  bool compute_logits = false;          // logits of the last token of this step
  // With compute_logits: logits of the last num_logits tokens of this step (speculative
  // verification: the last accepted token and the drafts), in 1..token_ids.size().
  int num_logits = 1;
  // An MTP runner (CreateMtpRunner) only: the target's hidden state h_t of each position, whose
  // token_ids are token_{t+1} (token_ids.size(), hidden); empty otherwise.
  std::span<const float> input_hidden = {};
};

struct ForwardBatch {
  std::vector<SeqStep> seqs;
  // Also return the hidden state of every token of the batch (ForwardOutput::hidden).
  bool all_hidden = false;
};

struct ForwardOutput {
  // (num_logits, vocab) row-major logits per seq with compute_logits, in batch order (one row
  // of the last token for num_logits 1); empty otherwise.
  std::vector<std::vector<float>> logits;
  // (hidden) final-norm hidden state of each seq's last token (the messenger's metadata).
  std::vector<std::vector<float>> last_hidden;
  // With ForwardBatch::all_hidden: (token_ids.size(), hidden) per seq in batch order, the hidden
  // state an MTP layer reads: a model's after its final norm (what the target hands its MTP layer),
  // an MTP runner's before shared_head.norm (what its next draft step reads). TP: replicated.
  std::vector<std::vector<float>> hidden;
};

struct ModelRunnerOptions {
  KvCacheSpec kv;     // num_layers/num_kv_heads/head_dim are filled from the config
  int num_pages = 0;  // pages in the region (0: from kv_cache_bytes)
  size_t kv_cache_bytes = 256ull << 20;
  int num_threads = 0;  // per rank; 0: all cores / tensor_parallel_size
  // Ranks (threads) splitting heads, KV heads, MLP columns and lm_head rows; kv_cache_bytes is
  // then the instance's total over all ranks' regions (one page table for all of them).
  int tensor_parallel_size = 1;
  KernelKind kernels = KernelKind::kFast;
  MatmulPrecision matmul = MatmulPrecision::kF32;
  Tracer* tracer = nullptr;  // borrowed, outlives the runner: one "layer" event per layer per step
};

// Thread safety: Forward is called by one thread at a time (the engine loop); progress() and
// region() may be read from others.
class ModelRunner {
 public:
  static Result<std::unique_ptr<ModelRunner>> Create(const model::ModelWeights& weights,
                                                     const ModelRunnerOptions& options);
  virtual ~ModelRunner() = default;

  // Runs the batch, writing its KV into the region and the requested logits into `out`.
  virtual Status Forward(const ForwardBatch& batch, ForwardOutput* out) = 0;
  virtual const model::ModelConfig& config() const = 0;
  virtual KvRegion& region() = 0;
  virtual const LayerProgress& progress() const = 0;
  virtual uint64_t steps_done() const = 0;
  // Appends the memory a decode step over `pages` reads (weights as the kernels read them, and
  // those pages' KV in every layer), for TouchRanges (cache_warm.h). Default: nothing.
  virtual void AppendWarmRanges(std::span<const int32_t> pages, std::vector<MemRange>* out) {
    (void)pages;
    (void)out;
  }
  // Tensor-parallel ranks, each with its own region of the same num_pages (its KV head-shard);
  // region() is rank 0's, and progress() is rank 0's (the all-reduces keep the ranks in step:
  // with TP, a layer is counted once every rank has written its KV).
  virtual int num_ranks() const { return 1; }
  virtual KvRegion& rank_region(int rank) {
    PD_CHECK(rank == 0) << "rank " << rank << " of 1";
    return region();
  }
};

// A runner over MTP layer `index` of a deepseek_v3 checkpoint (DeepSeek-V3's multi-token
// prediction module, spec_mtp.h): one decoder layer with its own latent KV region of
// options.num_pages (which must be set: the target's), its embedding, shared_head.norm and
// shared_head.head. Each SeqStep carries input_hidden; the layer's input is
// eh_proj([enorm(embed(token)); hnorm(h)]). With options.tensor_parallel_size > 1 it is sharded
// like the target (heads, experts, head rows) over as many ranks; eh_proj is replicated.
// InvalidArgument, naming num_nextn_predict_layers, when the checkpoint has no such MTP layer.
Result<std::unique_ptr<ModelRunner>> CreateMtpRunner(const model::ModelWeights& weights, int index,
                                                     const ModelRunnerOptions& options);

}  // namespace pd::engine
