// One generation request between an HTTP thread and the engine thread: the engine's callback
// pushes outputs into a per-request channel (never blocking the engine loop); the HTTP thread
// waits on the channel, turns outputs into text deltas and records the serving metrics.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "engine/async_engine.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/text_stream.h"

namespace pd::server {

// Thread safety: Push from the engine thread, Wait and SetNotify from the request's owner; all
// lock mu_.
class OutputChannel {
 public:
  // `notify` runs (under mu_, on the pushing thread) after each Push; it must not block. Empty:
  // none. Set before items are pushed, or see pending() after setting it.
  void SetNotify(std::function<void()> notify) EXCLUDES(mu_);
  bool pending() EXCLUDES(mu_);
  struct Item {
    engine::RequestOutput output;
    double time = 0.0;  // SystemClock seconds when the engine handed it over
  };
  void Push(const engine::RequestOutput& output, double time) EXCLUDES(mu_);
  // Moves every queued item into *items; waits up to timeout when none is queued.
  void Wait(std::vector<Item>* items, std::chrono::milliseconds timeout) EXCLUDES(mu_);

 private:
  Mutex mu_;
  CondVar cv_;
  std::deque<Item> items_ GUARDED_BY(mu_);  // bounded by the request's max_tokens
  std::function<void()> notify_ GUARDED_BY(mu_);
};

// Thread safety: owned and used by one thread (an HTTP thread or the stream loop).
class Generation {
 public:
  struct Stats {
    int prompt_tokens = 0;
    int completion_tokens = 0;
    int cached_tokens = 0;  // prompt tokens found in the engine's prefix cache
  };

  // Submits to the engine. The Status is the engine's (ResourceExhausted when it is full).
  static Result<std::unique_ptr<Generation>> Start(engine::AsyncEngine& engine,
                                                   const model::Tokenizer& tokenizer,
                                                   ServingMetrics& metrics,
                                                   std::vector<int32_t> prompt_ids,
                                                   const GenerateRequest& request);
  ~Generation();  // aborts the engine request if it has not finished

  // Waits up to `timeout` for news; returns the non-empty deltas (the last one finished()).
  std::vector<TextDelta> Next(std::chrono::milliseconds timeout);
  // `on_news` runs on the engine's thread whenever outputs arrive (and once now if some already
  // have), so an event loop can call Next(0) instead of a thread waiting in it. It must not
  // block; it is cleared when the Generation is destroyed.
  void SetOnNews(std::function<void()> on_news);
  // The client went away: abort the engine request and finish with "abort".
  TextDelta Abort();
  bool finished() const { return generator_.finished(); }
  Stats stats() const {
    return {num_prompt_tokens_, generator_.num_generated_tokens(), num_cached_tokens_};
  }
  int64_t request_id() const { return request_id_; }

 private:
  Generation(engine::AsyncEngine& engine, const model::Tokenizer& tokenizer,
             ServingMetrics& metrics, const GenerateRequest& request, int num_prompt_tokens);
  void RecordTokens(const OutputChannel::Item& item, int num_new_tokens);
  void RecordFinished(const std::string& reason);

  engine::AsyncEngine& engine_;
  ServingMetrics& metrics_;
  std::shared_ptr<OutputChannel> channel_;
  TextGenerator generator_;
  const int num_prompt_tokens_;
  int num_cached_tokens_ = 0;
  int64_t request_id_ = -1;
  bool engine_done_ = false;  // the engine sent its final output or was told to abort
  double submit_time_ = 0.0;
  double last_token_time_ = 0.0;
  bool first_token_seen_ = false;
  bool queue_time_recorded_ = false;
};

}  // namespace pd::server
