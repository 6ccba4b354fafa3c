// AsyncEngine: one loop thread owns the Engine; other threads submit and abort through a queue.
#include "engine/async_engine.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/mutex.h"
#include "common/thread_util.h"
#include "engine/idle_poll.h"
#include "engine/preempt_yield.h"

namespace pd::engine {
namespace {

// Thread safety: mu_ guards the queues, the pending count, stats_ and stop_; everything else
// (engine_, callbacks_) belongs to the loop thread. Callbacks run on the loop thread, no lock held.
class AsyncEngineImpl final : public AsyncEngine {
 public:
  AsyncEngineImpl(std::unique_ptr<Engine> engine, const AsyncEngineOptions& options)
      : engine_(std::move(engine)), options_(options), stats_(engine_->stats()) {
    loop_ = std::thread([this] { Loop(); });
  }
  ~AsyncEngineImpl() override { Shutdown(); }

  Result<int64_t> Submit(std::vector<int32_t> prompt_ids, const SamplingParams& sampling,
                         OutputCallback on_output) override;
  void Abort(int64_t request_id) override EXCLUDES(mu_);
  EngineStats stats() const override EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return stats_;
  }
  const model::ModelConfig& config() const override { return config_; }
  void Shutdown() override EXCLUDES(mu_, shutdown_mu_);
  Result<int64_t> SubmitPrefillOnly(std::vector<int32_t> prompt_ids,
                                    OutputCallback on_output) override;
  void ReleasePages(std::vector<int32_t> pages) override EXCLUDES(mu_);
  void RetainPages(const std::vector<int32_t>& pages) override {
    if (hooks_ != nullptr) hooks_->RetainPages(pages);
  }
  Result<int64_t> SubmitRemoteKv(std::vector<int32_t> prompt_ids, const SamplingParams& sampling,
                                 OutputCallback on_output, KvReservedCallback on_reserved) override;
  void MarkKvReady(int64_t request_id) override EXCLUDES(mu_);
  void SetPrefilledHidden(int64_t request_id, std::vector<float> hidden) override EXCLUDES(mu_);
  int CachedPrefixTokens(std::span<const int32_t> prompt) const override {
    return engine_->CachedPrefixTokens(prompt);  // thread-safe by contract
  }

 private:
  enum class Kind { kNormal, kPrefillOnly, kRemoteKv };
  struct Submission {
    Request request;
    OutputCallback on_output;
    Kind kind = Kind::kNormal;
    KvReservedCallback on_reserved;
  };
  Result<int64_t> Enqueue(Submission sub) EXCLUDES(mu_);
  void DeliverReservations();

  void Loop() EXCLUDES(mu_);
  void PollBeforeWaiting();  // options_.idle_poll_us: spin on news_ before the condvar wait
  // A Step would do something now. A stalled engine (Engine::Stalled) waits for news like an
  // idle one instead of spinning on empty steps, which would take the CPU from the threads
  // (fabric, messenger) that bring the KV or release the pages it waits for.
  bool Runnable() const { return engine_->HasWork() && !engine_->Stalled(); }
  // Something for the loop: a queue is not empty, stop_ is set, or Runnable().
  bool ReadyLocked() const REQUIRES(mu_) {
    return stop_ || !submissions_.empty() || !aborts_.empty() || !kv_ready_.empty() ||
           !hidden_.empty() || !releases_.empty() || Runnable();
  }
  // Moves queued submissions and aborts into the engine (loop thread).
  void Drain(std::vector<Submission>* submissions, std::vector<int64_t>* aborts);
  // Calls the callback (no lock held); forgets finished requests.
  void Deliver(const RequestOutput& out) EXCLUDES(mu_);
  void AbortEverything() EXCLUDES(mu_);
  void RefreshStats() EXCLUDES(mu_);

  std::unique_ptr<Engine> engine_;
  DisaggHooks* const hooks_ = engine_->disagg_hooks();  // null: the engine has none
  const AsyncEngineOptions options_;
  const model::ModelConfig config_ = engine_->config();

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<Submission> submissions_ GUARDED_BY(mu_);
  std::vector<int64_t> aborts_ GUARDED_BY(mu_);
  std::vector<int64_t> kv_ready_ GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, std::vector<float>>> hidden_ GUARDED_BY(mu_);  // prefilled
  std::vector<int32_t> releases_ GUARDED_BY(mu_);  // pages to give back
  int num_pending_ GUARDED_BY(mu_) = 0;            // queued + in the engine
  bool stop_ GUARDED_BY(mu_) = false;
  // Set (under mu_) with anything the loop must act on; lets a cache-warming pass stop early.
  std::atomic<bool> news_{false};
  EngineStats stats_ GUARDED_BY(mu_);  // refreshed after every step
  std::atomic<int64_t> next_id_{1};

  std::unordered_map<int64_t, OutputCallback> callbacks_;               // loop thread only
  std::unordered_map<int64_t, KvReservedCallback> reserved_callbacks_;  // loop thread only
  Mutex shutdown_mu_;  // serialises Shutdown callers (guards no field)
  std::thread loop_;
};

Result<int64_t> AsyncEngineImpl::Submit(std::vector<int32_t> prompt_ids,
                                        const SamplingParams& sampling, OutputCallback on_output) {
  Submission sub;
  sub.request.prompt_ids = std::move(prompt_ids);
  sub.request.sampling = sampling;
  sub.on_output = std::move(on_output);
  return Enqueue(std::move(sub));
}

Result<int64_t> AsyncEngineImpl::SubmitPrefillOnly(std::vector<int32_t> prompt_ids,
                                                   OutputCallback on_output) {
  if (hooks_ == nullptr) return Unimplemented("this engine does not run prefill-only requests");
  Submission sub;
  sub.request.prompt_ids = std::move(prompt_ids);
  sub.request.sampling.max_tokens = 1;  // only the prompt must fit (AddPrefillOnlyRequest)
  sub.on_output = std::move(on_output);
  sub.kind = Kind::kPrefillOnly;
  return Enqueue(std::move(sub));
}

Result<int64_t> AsyncEngineImpl::SubmitRemoteKv(std::vector<int32_t> prompt_ids,
                                                const SamplingParams& sampling,
                                                OutputCallback on_output,
                                                KvReservedCallback on_reserved) {
  if (hooks_ == nullptr) return Unimplemented("this engine does not take remote KV");
  Submission sub;
  sub.request.prompt_ids = std::move(prompt_ids);
  sub.request.sampling = sampling;
  sub.on_output = std::move(on_output);
  sub.kind = Kind::kRemoteKv;
  sub.on_reserved = std::move(on_reserved);
  return Enqueue(std::move(sub));
}

Result<int64_t> AsyncEngineImpl::Enqueue(Submission sub) {
  sub.request.id = next_id_.fetch_add(1);
  RETURN_IF_ERROR(engine_->ValidateRequest(sub.request));  // thread-safe by contract
  const int64_t id = sub.request.id;
  {
    MutexLock lock(&mu_);
    if (stop_) return Unavailable("the engine is shut down");
    if (num_pending_ >= options_.max_pending_requests) {
      return ResourceExhausted("too many pending requests (max_pending_requests = " +
                               std::to_string(options_.max_pending_requests) + ")");
    }
    ++num_pending_;
    submissions_.push_back(std::move(sub));
    news_.store(true, std::memory_order_relaxed);
  }
  cv_.Signal();
  return id;
}

void AsyncEngineImpl::ReleasePages(std::vector<int32_t> pages) {
  if (hooks_ == nullptr) return;
  {
    MutexLock lock(&mu_);
    if (stop_) {  // the loop is gone: give them back here (the pool locks)
      hooks_->ReleasePages(pages);
      return;
    }
    releases_.insert(releases_.end(), pages.begin(), pages.end());
    news_.store(true, std::memory_order_relaxed);
  }
  cv_.Signal();
}

void AsyncEngineImpl::MarkKvReady(int64_t request_id) {
  if (hooks_ == nullptr) return;
  {
    MutexLock lock(&mu_);
    if (stop_) return;
    kv_ready_.push_back(request_id);
    news_.store(true, std::memory_order_relaxed);
  }
  cv_.Signal();
}

void AsyncEngineImpl::SetPrefilledHidden(int64_t request_id, std::vector<float> hidden) {
  if (hooks_ == nullptr) return;
  {
    MutexLock lock(&mu_);
    if (stop_) return;
    hidden_.emplace_back(request_id, std::move(hidden));
    news_.store(true, std::memory_order_relaxed);
  }
  cv_.Signal();
}

void AsyncEngineImpl::Abort(int64_t request_id) {
  {
    MutexLock lock(&mu_);
    if (stop_) return;
    aborts_.push_back(request_id);
    news_.store(true, std::memory_order_relaxed);
  }
  cv_.Signal();
}

void AsyncEngineImpl::Drain(std::vector<Submission>* submissions, std::vector<int64_t>* aborts) {
  const double now = SystemClock::Get().NowSeconds();
  for (Submission& sub : *submissions) {
    const int64_t id = sub.request.id;
    sub.request.arrival_time = now;
    Status status;
    switch (sub.kind) {
      case Kind::kNormal:
        status = engine_->AddRequest(std::move(sub.request));
        break;
      case Kind::kPrefillOnly:
        status = hooks_->AddPrefillOnlyRequest(std::move(sub.request));
        break;
      case Kind::kRemoteKv:
        status = hooks_->AddRemoteKvRequest(std::move(sub.request));
        if (status.ok()) reserved_callbacks_[id] = std::move(sub.on_reserved);
        break;
    }
    callbacks_[id] = std::move(sub.on_output);
    if (!status.ok()) {  // validated in Submit: only an engine-side refusal lands here
      RequestOutput out;
      out.request_id = id;
      out.finish_reason = FinishReason::kError;
      out.error = status;
      Deliver(out);
    }
  }
  // Submissions come first: an abort always follows the submission of its id.
  for (int64_t id : *aborts) engine_->Abort(id);
}

void AsyncEngineImpl::DeliverReservations() {
  if (hooks_ == nullptr) return;
  for (KvReservation& r : hooks_->TakeKvReservations()) {
    auto it = reserved_callbacks_.find(r.request_id);
    if (it == reserved_callbacks_.end()) continue;
    KvReservedCallback cb = std::move(it->second);
    reserved_callbacks_.erase(it);
    if (cb) cb(r);
  }
}

void AsyncEngineImpl::Deliver(const RequestOutput& out) {
  auto it = callbacks_.find(out.request_id);
  if (it == callbacks_.end()) return;
  if (it->second) it->second(out);
  if (out.finished()) {
    callbacks_.erase(it);
    reserved_callbacks_.erase(out.request_id);
    MutexLock lock(&mu_);
    --num_pending_;
  }
}

void AsyncEngineImpl::Loop() {
  SetCurrentThreadName("pd-engine");
  if (!options_.loop_cpus.empty()) {
    if (Status s = PinCurrentThread(options_.loop_cpus); !s.ok()) {
      PD_LOG_WARN("engine loop: {}", s.ToString());  // validated by the caller; keeps running
    }
  }
  std::vector<Submission> submissions;
  std::vector<int64_t> aborts, kv_ready;
  std::vector<std::pair<int64_t, std::vector<float>>> hidden;
  std::vector<int32_t> releases;
  YieldAfterPreemption yield_after_preemption;  // on this thread: it reads this thread's count
  while (true) {
    PollBeforeWaiting();
    {
      MutexLock lock(&mu_);
      if (options_.warm_period_s > 0 && hooks_ != nullptr && hooks_->AwaitsKv()) {
        // Idle but for transfers in flight: keep what the first decode step reads cached.
        const auto deadline = std::chrono::steady_clock::now() +
                              std::chrono::ceil<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(options_.warm_period_s));
        bool ready = ReadyLocked();
        while (!ready) {
          const bool woken = cv_.WaitUntil(&mu_, deadline);
          ready = ReadyLocked();
          if (!woken) break;
        }
        if (!ready) {
          lock.Unlock();
          // A pass only fills time nothing else wants: it yields the CPU between chunks, so the
          // I/O threads that receive the KV (often on this core) are never queued behind it.
          hooks_->WarmCaches(options_.warm_max_bytes, [this] {
            sched_yield();
            return news_.load(std::memory_order_relaxed);
          });
          continue;
        }
      } else {
        while (!ReadyLocked()) cv_.Wait(&mu_);
      }
      if (stop_) break;
      news_.store(false, std::memory_order_relaxed);
      submissions.swap(submissions_);
      aborts.swap(aborts_);
      kv_ready.swap(kv_ready_);
      hidden.swap(hidden_);
      releases.swap(releases_);
    }
    Drain(&submissions, &aborts);
    if (!releases.empty()) hooks_->ReleasePages(releases);  // only queued when there are hooks
    for (auto& [id, h] : hidden) {  // before kv_ready: the first decode step may use it
      Status s = hooks_->SetPrefilledHidden(id, std::move(h));  // NotFound: it ended meanwhile
      if (!s.ok() && s.code() != StatusCode::kNotFound) {
        PD_LOG_WARN("SetPrefilledHidden({}): {}", id, s.ToString());
      }
    }
    hidden.clear();
    for (int64_t id : kv_ready) {
      Status s = hooks_->MarkKvReady(id);  // NotFound when it ended meanwhile: nothing to do
      if (!s.ok() && s.code() != StatusCode::kNotFound) {
        PD_LOG_WARN("MarkKvReady({}): {}", id, s.ToString());
      }
    }
    const bool changed = !submissions.empty() || !aborts.empty() || !releases.empty();
    submissions.clear();
    aborts.clear();
    kv_ready.clear();
    releases.clear();
    DeliverReservations();
    if (!engine_->HasWork()) {
      if (changed) RefreshStats();
      continue;
    }
    auto outputs = engine_->Step();
    if (!outputs.ok()) {
      PD_LOG_ERROR("engine step failed: {}", outputs.status().ToString());
      continue;
    }
    RefreshStats();  // before the callbacks: a final output implies stats showing its pages free
    for (const RequestOutput& out : *outputs) Deliver(out);
    DeliverReservations();  // pages the step freed
    // The outputs' HTTP threads, woken by Deliver, may be runnable behind this loop (preempted
    // themselves, or not let in): they run now, not at the end of this loop's slice
    // (engine/preempt_yield.h).
    yield_after_preemption.Check(/*delivered=*/!outputs->empty());
  }
  AbortEverything();
}

void AsyncEngineImpl::PollBeforeWaiting() {
  if (options_.idle_poll_us <= 0 || Runnable()) return;
  IdlePollOptions po;
  po.budget_ns = options_.idle_poll_us * 1000;
  // news_ is set with everything the loop is woken for (under mu_, which the wait then takes).
  (void)PollForFlag(news_, po, SteadyNowNs);
}

void AsyncEngineImpl::RefreshStats() {
  EngineStats stats = engine_->stats();
  MutexLock lock(&mu_);
  stats_ = stats;
}

// On shutdown: every request, queued or in the engine, ends with kAbort and its pages are freed.
void AsyncEngineImpl::AbortEverything() {
  std::vector<Submission> submissions;
  {
    MutexLock lock(&mu_);
    submissions.swap(submissions_);
    aborts_.clear();
    kv_ready_.clear();
    if (!releases_.empty()) hooks_->ReleasePages(releases_);
    releases_.clear();
  }
  for (Submission& sub : submissions) callbacks_[sub.request.id] = std::move(sub.on_output);
  std::vector<int64_t> ids;
  ids.reserve(callbacks_.size());
  for (const auto& [id, cb] : callbacks_) ids.push_back(id);
  for (int64_t id : ids) engine_->Abort(id);
  auto drained = engine_->Step();  // collects the engine's own abort reports; nothing runs
  (void)drained;
  {
    EngineStats stats = engine_->stats();
    MutexLock lock(&mu_);
    stats_ = stats;
  }
  for (int64_t id : ids) {
    RequestOutput out;
    out.request_id = id;
    out.finish_reason = FinishReason::kAbort;
    Deliver(out);
  }
}

void AsyncEngineImpl::Shutdown() {
  MutexLock serial(&shutdown_mu_);
  {
    MutexLock lock(&mu_);
    stop_ = true;
    news_.store(true, std::memory_order_relaxed);
  }
  cv_.SignalAll();
  if (loop_.joinable()) {
    PD_CHECK(loop_.get_id() != std::this_thread::get_id())
        << "AsyncEngine::Shutdown called from its own callback";
    loop_.join();
  }
}

}  // namespace

Result<int64_t> AsyncEngine::SubmitPrefillOnly(std::vector<int32_t>, OutputCallback) {
  return Unimplemented("this engine does not run prefill-only requests");
}
void AsyncEngine::ReleasePages(std::vector<int32_t>) {}
void AsyncEngine::RetainPages(const std::vector<int32_t>&) {}
Result<int64_t> AsyncEngine::SubmitRemoteKv(std::vector<int32_t>, const SamplingParams&,
                                            OutputCallback, KvReservedCallback) {
  return Unimplemented("this engine does not take remote KV");
}
void AsyncEngine::MarkKvReady(int64_t) {}
void AsyncEngine::SetPrefilledHidden(int64_t, std::vector<float>) {}
int AsyncEngine::CachedPrefixTokens(std::span<const int32_t>) const { return 0; }

Result<std::unique_ptr<AsyncEngine>> AsyncEngine::Create(std::unique_ptr<Engine> engine,
                                                         const AsyncEngineOptions& options) {
  if (engine == nullptr) return InvalidArgument("AsyncEngine needs an Engine");
  if (options.idle_poll_us < 0 || options.idle_poll_us > 60'000'000'000) {
    return InvalidArgument("idle_poll_us must be in [0, 6e10], got " +
                           std::to_string(options.idle_poll_us));
  }
  if (options.max_pending_requests < 1) {
    return InvalidArgument("max_pending_requests must be >= 1, got " +
                           std::to_string(options.max_pending_requests));
  }
  return std::unique_ptr<AsyncEngine>(new AsyncEngineImpl(std::move(engine), options));
}

}  // namespace pd::engine
