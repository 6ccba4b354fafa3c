// The forward pass of one instance over a batch that mixes prefill chunks and decode tokens.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/check.h"
#include "common/status.h"
#include "common/trace.h"
#include "engine/cache_warm.h"
#include "engine/kv_cache.h"
#include "model/weights.h"

namespace pd::engine {

// One sequence's part of a step.
struct SeqStep {
  int64_t seq_id = 0;
  int start_pos = 0;                    // position of token_ids[0] in the sequence
  std::span<const int32_t> token_ids;   // tokens to run now: a prefill chunk or one decode token
  std::span<const int32_t> page_table;  // the sequence's pages, covering start_pos+len tokens
  bool compute_logits = false;          // logits of the last token of this step
};

struct ForwardBatch {
  std::vector<SeqStep> seqs;
};

struct ForwardOutput {
  // (vocab) logits per seq with compute_logits, in batch order; empty rows otherwise.
  std::vector<std::vector<float>> logits;
  // (hidden) final-norm hidden state of each seq's last token (the messenger's metadata).
  std::vector<std::vector<float>> last_hidden;
};

// Counts finished layers across steps: after step s (0-based, counted by this runner) finishes
// layer l's attention output projection, Value() >= s*num_layers + l + 1. Another thread waits on
// it to stream that layer's KV pages. Thread safety: any thread.
class LayerProgress {
 public:
  uint64_t Value() const { return value_.load(std::memory_order_acquire); }
  void Bump();
  // True once Value() >= target; false if timeout_ms passes first.
  bool WaitAtLeast(uint64_t target, int64_t timeout_ms) const;
  // Called on the bumping thread after every Bump (nullptr: none), so a thread that waits for
  // other events too (the prefill messenger's task queue) wakes at a bump without polling. It
  // must be quick and must not call back into this object.
  void SetListener(std::function<void()> on_bump) const;

 private:
  std::atomic<uint64_t> value_{0};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable std::function<void()> on_bump_;  // GUARDED_BY(mu_); an observer, not part of the value
};

enum class KernelKind { kReference, kFast };

// How the matmuls over bf16 weights multiply.
//   kF32:  x stays f32, each product exact (the default).
//   kBf16: x rounded to bf16 and multiplied with AVX-512 BF16 dot products (vdpbf16ps): up to
//          twice the FMA rate where the CPU runs them at full speed (bench-engine prints the
//          ratio), logits within ~1e-2 relative of kF32. Needs AVX512_BF16 for the fast kernels
//          (without it they keep kF32; MatmulBf16DotUsed says which); the reference kernels
//          emulate it (ref::MatmulBf16Dot). Matrices with f32 weights or odd k keep kF32.
enum class MatmulPrecision { kF32, kBf16 };
std::string_view MatmulPrecisionName(MatmulPrecision p);  // "f32" | "bf16"
Result<MatmulPrecision> ParseMatmulPrecision(std::string_view name);
// Whether a runner created with these kernels and precision multiplies in bf16.
bool MatmulBf16DotUsed(KernelKind kernels, MatmulPrecision precision);

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

}  // namespace pd::engine
