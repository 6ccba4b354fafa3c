// What disaggregated serving needs of an engine beyond the step API (engine.h): prefill-only
// requests whose pages outlive them, requests whose prompt KV arrives from elsewhere, the page
// references a transfer holds, a look at every step before it runs, and, on the decode side while
// KV is awaited, keeping what the first decode step reads in the caches. The messengers use them
// through AsyncEngine, which runs them on the engine loop (docs/architecture.md, "Request flow,
// disaggregated").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/status.h"
#include "engine/request.h"

namespace pd::engine {

// Conditional disaggregation: serve's and up's --local-prefill-max-tokens default, the longest
// uncached prompt part a decode instance computes itself instead of asking a prefill instance.
// From the measurement in docs/prefix-caching.md: computed locally, a prompt's TTFT is lower at
// every length, and the requests decoding beside it see no change in TPOT up to 64 tokens (from
// 128 on, 16% and more).
inline constexpr int kDefaultLocalPrefillMaxTokens = 64;
// serve's and up's --kv-prefill-wait-s (messenger::DecodeMessengerOptions::prefill_wait_s): long
// enough for a supervised prefill instance to restart and be greeted again (a rolling restart),
// short against a client's patience.
inline constexpr double kDefaultPrefillWaitS = 10.0;

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
  // The leading pages of page_table taken from this instance's prefix cache (their KV is here
  // already): only pages [num_cached_pages, end) need to arrive. 0 without a prefix cache.
  int num_cached_pages = 0;
};

// Thread safety: as the Engine they belong to (its loop thread), but for ReleasePages and
// RetainPages, which any thread may call.
class DisaggHooks {
 public:
  virtual ~DisaggHooks() = default;

  // --- Prefill side ---
  // Computes the prompt, never samples; its final output (kStop) carries a PrefillResult whose
  // pages stay referenced until ReleasePages. Validated as Engine::AddRequest (the sampling
  // settings are ignored).
  virtual Status AddPrefillOnlyRequest(Request request) = 0;
  // Gives back pages a PrefillResult kept (or RetainPages took). Thread-safe (the pool locks).
  virtual void ReleasePages(std::span<const int32_t> pages) = 0;
  // Takes one more reference on allocated pages (given back with ReleasePages), so they stay out
  // of the free list after their request ends: the decode side holds a remote-KV request's pages
  // until no write of its transfer can land any more. Thread-safe (the page pool locks).
  virtual void RetainPages(std::span<const int32_t> pages) = 0;
  virtual void SetStepObserver(StepObserver observer) = 0;

  // --- Decode side ---
  // The prompt's KV arrives from elsewhere. Pages for the whole prompt are reserved when free
  // (see TakeKvReservations), the leading ones taken from the prefix cache where it holds them;
  // the request then waits until MarkKvReady, and its last prompt token runs as its first decode
  // step. Engine::Abort releases the pages at any point.
  virtual Status AddRemoteKvRequest(Request request) = 0;
  // Reserves pages for queued remote-KV requests (FCFS, as free pages allow); returns those
  // reserved now.
  virtual std::vector<KvReservation> TakeKvReservations() = 0;
  // NotFound for an unknown request; FailedPrecondition when its pages are not reserved yet.
  virtual Status MarkKvReady(int64_t request_id) = 0;
  // While idle: true when a request waits for its KV (its pages reserved).
  virtual bool AwaitsKv() const = 0;
  // The last prefilled position's final-norm hidden state (hidden_size floats), which the prefill
  // instance sends as the transfer's metadata: kept on the request until it ends, so that a
  // drafter that starts from the target's hidden state (MTP) can draft at its first decode step.
  // It may come at any point of the request's life (decoding never waits for it). NotFound for a
  // request that is not running (ended meanwhile); InvalidArgument for a wrong size.
  virtual Status SetPrefilledHidden(int64_t request_id, std::vector<float> hidden) = 0;
  // What SetPrefilledHidden kept for the request; empty when nothing came (yet) or the request is
  // not running. Valid until the request ends or the next SetPrefilledHidden for it.
  virtual std::span<const float> PrefilledHidden(int64_t request_id) const = 0;
  // While a request awaits its KV: reads the memory the next decode step will read (the weights,
  // and the KV pages of the requests waiting for their KV) back into the caches, stopping between
  // chunks once stop() is true; only when that memory is at most max_bytes. Returns the bytes
  // read (0 when no KV is awaited). See cache_warm.h.
  virtual size_t WarmCaches(size_t max_bytes, const std::function<bool()>& stop) = 0;
};

}  // namespace pd::engine
