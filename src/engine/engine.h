// The engine's step API: requests in, one Step() = Schedule() -> Execute(batch) -> Update(batch,
// outputs), RequestOutputs out. Single-threaded: AsyncEngine runs it on its own thread.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "model/weights.h"

namespace pd::engine {

struct SchedulerOptions {
  int max_num_seqs = 64;             // running sequences at once
  int max_num_batched_tokens = 512;  // token budget per step (decodes first, then prefill chunks)
  int max_model_len = 4096;          // prompt + generated tokens
  bool enable_chunked_prefill = true;
};

struct EngineOptions {
  ModelRunnerOptions runner;
  SchedulerOptions scheduler;
  Clock* clock = nullptr;  // nullptr: SystemClock
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int num_free_pages = 0;
  int num_total_pages = 0;
  int64_t num_preemptions = 0;
  int num_awaiting_kv = 0;  // remote-KV requests queued for pages or waiting for their KV
  double kv_cache_usage() const {
    return num_total_pages == 0 ? 0.0 : 1.0 - double(num_free_pages) / num_total_pages;
  }
};

// One scheduled chunk of a prefill-only request, as the step observer sees it.
struct PrefillChunk {
  int64_t request_id = 0;
  int start_pos = 0;
  int num_tokens = 0;
  std::vector<int32_t> page_table;  // all the request's pages (allocated at admission)
  bool is_last_chunk = false;
};

// What one step runs, told before its Forward: the runner's step index (ModelRunner::steps_done()
// before the step; its layer l is final once progress() >= runner_step*num_layers + l + 1) and
// the chunks of prefill-only requests in it.
struct StepInfo {
  uint64_t runner_step = 0;
  std::vector<PrefillChunk> prefill_chunks;
};
// Runs on the engine thread before every non-empty step's Forward; must not block.
using StepObserver = std::function<void(const StepInfo&)>;

// A remote-KV request whose pages were just reserved.
struct KvReservation {
  int64_t request_id = 0;
  std::vector<int32_t> page_table;  // covers the whole prompt
};

// Thread safety: not thread-safe; one thread (the engine loop) calls every method.
class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(const model::ModelWeights& weights,
                                                const EngineOptions& options);
  // Runs on a given ModelRunner (tests and tools that build their own, e.g. a fake one).
  static Result<std::unique_ptr<Engine>> CreateWithRunner(std::unique_ptr<ModelRunner> runner,
                                                          const EngineOptions& options);
  virtual ~Engine() = default;

  // The checks AddRequest makes (everything but the id). Reads only immutable state: unlike the
  // rest of the class it may be called from any thread.
  virtual Status ValidateRequest(const Request& request) const = 0;

  // Validates (non-empty prompt, ids in vocab, prompt + max_tokens <= max_model_len, sampling
  // ranges) and queues the request. InvalidArgument names what was wrong.
  virtual Status AddRequest(Request request) = 0;
  // Finishes the request with kAbort at the next Step and frees its pages at once.
  virtual void Abort(int64_t request_id) = 0;
  virtual bool HasWork() const = 0;
  // HasWork, but the last Step scheduled nothing and preempted nothing: the waiting sequences
  // wait for pages (held by sequences awaiting their KV, or retained), and another Step does
  // nothing until a request is added or aborted, a KV arrives or pages are released.
  virtual bool Stalled() const = 0;
  // Runs one step; returns news for every request that got tokens or finished.
  virtual Result<std::vector<RequestOutput>> Step() = 0;
  virtual EngineStats stats() const = 0;
  virtual const model::ModelConfig& config() const = 0;
  virtual ModelRunner& runner() = 0;

  // --- Disaggregation hooks (docs/architecture.md, "Request flow, disaggregated") ---
  // Prefill side: computes the prompt, never samples; its final output (kStop) carries a
  // PrefillResult whose pages stay referenced until ReleasePages. Validated as AddRequest (the
  // sampling settings are ignored).
  virtual Status AddPrefillOnlyRequest(Request request) = 0;
  // Gives back pages a PrefillResult kept. Thread-safe (the page pool locks).
  virtual void ReleasePages(std::span<const int32_t> pages) = 0;
  // Takes one more reference on allocated pages (given back with ReleasePages), so they stay out
  // of the free list after their request ends: the decode side holds a remote-KV request's pages
  // until no write of its transfer can land any more. Thread-safe (the page pool locks).
  virtual void RetainPages(std::span<const int32_t> pages) = 0;
  virtual void SetStepObserver(StepObserver observer) = 0;
  // Decode side: the prompt's KV arrives from elsewhere. Pages for the whole prompt are reserved
  // when free (see TakeKvReservations); the request then waits until MarkKvReady, and its last
  // prompt token runs as its first decode step. Abort releases the pages at any point.
  virtual Status AddRemoteKvRequest(Request request) = 0;
  // Reserves pages for queued remote-KV requests (FCFS, as free pages allow); returns those
  // reserved now.
  virtual std::vector<KvReservation> TakeKvReservations() = 0;
  // NotFound for an unknown request; FailedPrecondition when its pages are not reserved yet.
  virtual Status MarkKvReady(int64_t request_id) = 0;
  // Decode side, while idle: true when a request waits for its KV (its pages reserved).
  virtual bool AwaitsKv() const = 0;
  // Reads the memory the next decode step will read (the weights, and the KV pages of requests
  // waiting for their KV) back into the caches, stopping between chunks once stop() is true;
  // only when that memory is at most max_bytes. Returns the bytes read. See cache_warm.h.
  virtual size_t WarmCaches(size_t max_bytes, const std::function<bool()>& stop) = 0;
};

}  // namespace pd::engine
