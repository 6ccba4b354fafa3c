// Runs an Engine on its own thread. HTTP threads submit and abort through a bounded queue and
// receive RequestOutputs through a callback; they never block the loop.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace pd::engine {

struct AsyncEngineOptions {
  int max_pending_requests = 256;  // queued + running; beyond it Submit is ResourceExhausted
  // CPUs the engine loop thread (which runs the model's forward passes) is pinned to; empty: it
  // keeps the creating thread's affinity.
  std::vector<int> loop_cpus;
  // Decode side: while requests wait for their KV and nothing else runs, the loop reads the
  // weights and the arriving KV back into the caches every warm_period_s, so the first decode
  // step does not run at the speed of memory left untouched through the prefill (cache_warm.h);
  // 0 turns it off. Only when that memory is at most warm_max_bytes: a pass over more than the
  // caches hold would only spend memory bandwidth.
  double warm_period_s = 0.002;
  size_t warm_max_bytes = 64ull << 20;
  // When it runs out of work, the loop spins this long on an atomic "work arrived" flag before it
  // sleeps on its condition variable (engine/idle_poll.h), so that work arriving meanwhile finds
  // it running instead of having to wake its core: 70-120 us on a KVM guest whose idle vCPUs
  // halt, against ~1 us. Only for a loop on CPUs no other busy thread uses (serve applies
  // --idle-poll-us only when its --compute-cpus and --io-cpus are disjoint); 0: off.
  int64_t idle_poll_us = 0;
};

// Called on the engine thread for every RequestOutput of the request, the last one finished().
// It must not block (hand the output to the HTTP thread through a queue).
using OutputCallback = std::function<void(const RequestOutput&)>;
// Called on the engine thread once a remote-KV request's pages are reserved (its page table and
// how many of its leading pages came from the prefix cache). Must not block.
using KvReservedCallback = std::function<void(const KvReservation& reservation)>;

// Thread safety: every public method may be called from any thread.
class AsyncEngine {
 public:
  static Result<std::unique_ptr<AsyncEngine>> Create(std::unique_ptr<Engine> engine,
                                                     const AsyncEngineOptions& options);
  virtual ~AsyncEngine() = default;  // stops the loop; unfinished requests end with kAbort

  // Queues the request (id assigned by the engine, returned). ResourceExhausted when
  // max_pending_requests are already pending; InvalidArgument as Engine::AddRequest.
  virtual Result<int64_t> Submit(std::vector<int32_t> prompt_ids, const SamplingParams& sampling,
                                 OutputCallback on_output) = 0;
  // Aborts a request: its callback gets a final kAbort output and its pages are freed.
  virtual void Abort(int64_t request_id) = 0;
  virtual EngineStats stats() const = 0;
  virtual const model::ModelConfig& config() const = 0;
  virtual void Shutdown() = 0;
  // Tokens of `prompt` whose KV the prefix cache holds now (whole pages, the last token never
  // counted: it always runs), as Engine::CachedPrefixTokens. A hint: nothing is reserved, so a
  // request submitted next may find fewer (evicted meanwhile) or more. Default: 0.
  virtual int CachedPrefixTokens(std::span<const int32_t> prompt) const;

  // --- Disaggregation (the engine's DisaggHooks, run on the loop; defaults: Unimplemented /
  // no-op, and so for an engine without hooks) ---
  // Prefill side: a prefill-only request; its final kStop output carries the PrefillResult.
  virtual Result<int64_t> SubmitPrefillOnly(std::vector<int32_t> prompt_ids,
                                            OutputCallback on_output);
  // Gives back the pages of a PrefillResult.
  virtual void ReleasePages(std::vector<int32_t> pages);
  // One more reference on allocated pages, taken at once (not on the loop): call it from a
  // KvReservedCallback to hold a remote-KV request's pages past its end; ReleasePages gives it
  // back.
  virtual void RetainPages(const std::vector<int32_t>& pages);
  // Decode side: a request whose prompt KV arrives from elsewhere. on_reserved gets its page
  // table once reserved (never, if it ends first); it then waits for MarkKvReady(id).
  virtual Result<int64_t> SubmitRemoteKv(std::vector<int32_t> prompt_ids,
                                         const SamplingParams& sampling, OutputCallback on_output,
                                         KvReservedCallback on_reserved);
  virtual void MarkKvReady(int64_t request_id);
  // Decode side: the request's last prefilled position's hidden state, from the transfer's
  // metadata; kept on the request (DisaggHooks::SetPrefilledHidden). Before a MarkKvReady called
  // after it, it reaches the engine first. Ignored for a request that has ended.
  virtual void SetPrefilledHidden(int64_t request_id, std::vector<float> hidden);
};

}  // namespace pd::engine
