// The engine's step API: requests in, one Step() = Schedule() -> Execute(batch) -> Update(batch,
// outputs), RequestOutputs out. Single-threaded: AsyncEngine runs it on its own thread. What
// disaggregated serving adds (prefill-only and remote-KV requests, page references, the step
// observer, cache warming while KV is awaited) is a second interface, DisaggHooks
// (disagg_hooks.h): an engine made by Create gives it through disagg_hooks().
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "engine/disagg_hooks.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/spec_decode.h"
#include "model/weights.h"

namespace pd::engine {

class KvEventLog;  // kv_events.h

struct SchedulerOptions {
  int max_num_seqs = 64;             // running sequences at once
  int max_num_batched_tokens = 512;  // token budget per step (decodes first, then prefill chunks)
  int max_model_len = 4096;          // prompt + generated tokens
  bool enable_chunked_prefill = true;
  // Prefix caching (prefix_cache.h): computed full pages stay cached by their tokens, and a
  // prompt's cached prefix is shared instead of computed. Needs a PagePool made with a prefix
  // page size (the Engine makes one).
  bool enable_prefix_caching = true;
  uint64_t prefix_cache_root = 0;  // PrefixCacheRoot: the Engine sets it from model_fingerprint
};

struct EngineOptions {
  ModelRunnerOptions runner;
  SchedulerOptions scheduler;
  Clock* clock = nullptr;  // nullptr: SystemClock
  // Roots the prefix cache's page keys (with the KV format), e.g. the handshake's
  // ModelFingerprint, so that instances of one model name the same prefix with the same key.
  uint64_t model_fingerprint = 0;
  // Borrowed, may be null: the prefix cache's keys as they are stored and evicted, for KV-aware
  // routing (kv_events.h). Must outlive the engine.
  KvEventLog* kv_events = nullptr;
  // Speculative decoding (spec_decode.h); method kNone: off. "ngram", "draft_model"
  // (spec_draft_model.h) and "mtp" (spec_mtp.h: a deepseek_v3 checkpoint's MTP layer) run;
  // the last two in an engine made by Engine::Create only.
  SpeculativeConfig speculative;
  // draft_model: the draft's weights, borrowed (must outlive the engine); null: Create loads
  // speculative.model (which otherwise only names it). KV: runner.num_pages pages for each model,
  // or kv_cache_bytes split so that both have the same number of pages.
  const model::ModelWeights* draft_weights = nullptr;
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int num_free_pages = 0;
  int num_total_pages = 0;
  int64_t num_preemptions = 0;
  int num_awaiting_kv = 0;  // remote-KV requests queued for pages or waiting for their KV
  // Prefix cache, as vLLM v1 counts it: prompt tokens of the requests looked up (first
  // admissions) and the tokens of theirs found cached; pages cached (evictable or in use).
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int num_cached_pages = 0;
  // Speculative decoding, as vLLM counts it (all zero when it is off).
  SpecDecodeCounters spec_decode;
  double kv_cache_usage() const {
    return num_total_pages == 0 ? 0.0 : 1.0 - double(num_free_pages) / num_total_pages;
  }
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

  // Recounts the KV pages (a debug check, O(pages)): every page is free, cached-evictable or
  // referenced, the prefix cache's index and counts agree with a recount, and every page in a
  // request's page table holds at least that many references. Internal naming what is wrong.
  virtual Status CheckPages() const = 0;

  // Tokens of `prompt` whose KV the prefix cache holds now: whole pages of its longest cached
  // prefix, never its last token (which always runs); 0 without a prefix cache. Takes no
  // reference (a hint for routing and for the decode side's local-or-remote prefill choice).
  // Thread-safe, like ValidateRequest (the page pool locks).
  virtual int CachedPrefixTokens(std::span<const int32_t> /*prompt*/) const { return 0; }

  // The disaggregation hooks (disagg_hooks.h) of this engine; null when it has none. They live
  // as long as the engine.
  virtual DisaggHooks* disagg_hooks() { return nullptr; }
};

}  // namespace pd::engine
