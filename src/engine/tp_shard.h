// Private to src/engine: how a tensor-parallel instance splits the model over its ranks, each
// rank's weights, and the all-reduce that joins the ranks' partial sums.
//
// Rank r of TP t (model: nh query heads, H KV heads, I MLP columns, V vocab rows):
//   query heads     [r*nh/t, (r+1)*nh/t)                           (nh % t == 0)
//   KV heads        t <= H: [r*H/t, (r+1)*H/t)                      (H % t == 0)
//                   t >  H: head r*H/t = r/(t/H): t/H replicas each  (t % H == 0)
//                   (the rule of src/messenger/shard_plan.h, so the messenger can move them)
//   MLP columns     [r*I/t, (r+1)*I/t) of gate/up rows and down columns (I % t == 0)
//   lm_head rows    [r*V/t, (r+1)*V/t) (any V): every rank computes its slice of the logits
// q/k/v/gate/up are row-split (their rows are views into the checkpoint); o_proj and down_proj are
// column-split (copied at load), so each rank's o/down output is a partial sum over its heads /
// columns, added over ranks by TpAllReduce. Embedding and norms are computed by every rank on the
// replicated residual stream (cheap, and keeps the ranks bit-identical).
#pragma once

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "common/status.h"
#include "engine/model_runner.h"
#include "engine/model_runner_weights.h"
#include "model/config.h"

namespace pd::engine {

struct TpShard {
  int rank = 0;
  int tp_size = 1;
  int head_begin = 0, num_heads = 0;        // query heads
  int kv_head_begin = 0, num_kv_heads = 0;  // KV heads held (one when replicated)
  int64_t inter_begin = 0, inter = 0;       // MLP columns
  int64_t vocab_begin = 0, vocab = 0;       // lm_head rows
};

// InvalidArgument naming the numbers when tp_size cannot split this model.
Status ValidateTensorParallel(const model::ModelConfig& c, int tp_size);
// The shard of rank `rank`; call ValidateTensorParallel first.
TpShard ComputeTpShard(const model::ModelConfig& c, int tp_size, int rank);

// The rank's weights over the full (unpacked, row-major) ones, which must outlive the result:
// config holds the rank's head / KV head / MLP sizes (vocab_size stays the model's).
Result<std::unique_ptr<RunnerWeights>> ShardRunnerWeights(const RunnerWeights& full,
                                                          const TpShard& shard);

// A barrier whose waiters spin a little, then yield, and never sleep: ranks meet twice per layer,
// microseconds apart, and a futex sleep's wake-up costs a scheduler tick on a loaded machine.
// Thread safety: any num_ranks threads, each calling ArriveAndWait once per phase.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void ArriveAndWait() {
    const uint64_t gen = generation_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);  // publishes every arriver's writes
      return;
    }
    for (int i = 0; generation_.load(std::memory_order_acquire) == gen; ++i) {
      if (i < 256) {
        _mm_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<uint64_t> generation_{0};
};

// Sum of the ranks' partial outputs in a fixed rank order (deterministic, and bit-identical on
// every rank). Collective: every rank calls Arrive, reads Parts(), then calls Depart.
// Thread safety: each rank calls from its own thread; parts_[r] is written only by rank r before
// the first barrier and read by all between the two barriers.
class TpAllReduce {
 public:
  explicit TpAllReduce(int num_ranks) : parts_(num_ranks, nullptr), barrier_(num_ranks) {}
  int num_ranks() const { return static_cast<int>(parts_.size()); }
  // Publishes rank's partial and waits until every rank has published.
  void Arrive(int rank, const float* partial) {
    parts_[rank] = partial;
    barrier_.ArriveAndWait();
  }
  const std::vector<const float*>& Parts() const { return parts_; }
  // Waits until every rank is done reading the partials (they may be overwritten after).
  void Depart() { barrier_.ArriveAndWait(); }

 private:
  std::vector<const float*> parts_;
  SpinBarrier barrier_;
};

// How a rank runner takes part in a TP instance; the default is a plain single-rank runner.
struct RankContext {
  TpAllReduce* reduce = nullptr;  // null: TP 1
  int rank = 0;
  int64_t vocab_begin = 0;  // where this rank's lm_head rows go in the logits
};

// A runner over already prepared (and, for TP, sharded) weights with a region of num_pages
// (model_runner.cc). In TP mode Forward expects `out` sized by the caller (logits rows of the full
// vocab, last_hidden rows of hidden) and writes only its logits columns (and last_hidden: rank 0).
Result<std::unique_ptr<ModelRunner>> CreateRankRunner(std::unique_ptr<RunnerWeights> w,
                                                      const ModelRunnerOptions& options,
                                                      int64_t num_pages, const RankContext& ctx);

// num_pages for a region spec over `num_layers`, from options (num_pages, or kv_cache_bytes over
// the bytes one page takes on all ranks together: `page_bytes_all_ranks`).
Result<int64_t> RunnerNumPages(const ModelRunnerOptions& options, size_t page_bytes_all_ranks,
                               int num_layers);

// The TP runner (tp_model_runner.cc): options.tensor_parallel_size ranks, each on its own thread.
Result<std::unique_ptr<ModelRunner>> CreateTpModelRunner(const model::ModelWeights& weights,
                                                         const ModelRunnerOptions& options);

}  // namespace pd::engine
