// AsyncEngine: one loop thread owns the Engine; other threads submit and abort through a queue.
#include "engine/async_engine.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/log.h"

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
  void Abort(int64_t request_id) override;
  EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  const model::ModelConfig& config() const override { return config_; }
  void Shutdown() override;

 private:
  struct Submission {
    Request request;
    OutputCallback on_output;
  };

  void Loop();
  // Moves queued submissions and aborts into the engine (loop thread).
  void Drain(std::vector<Submission>* submissions, std::vector<int64_t>* aborts);
  void Deliver(const RequestOutput& out);  // calls the callback; forgets finished requests
  void AbortEverything();

  std::unique_ptr<Engine> engine_;
  const AsyncEngineOptions options_;
  const model::ModelConfig config_ = engine_->config();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Submission> submissions_;  // GUARDED_BY(mu_)
  std::vector<int64_t> aborts_;          // GUARDED_BY(mu_)
  int num_pending_ = 0;                  // GUARDED_BY(mu_): queued + in the engine
  bool stop_ = false;                    // GUARDED_BY(mu_)
  EngineStats stats_;                    // GUARDED_BY(mu_): refreshed after every step
  std::atomic<int64_t> next_id_{1};

  std::unordered_map<int64_t, OutputCallback> callbacks_;  // loop thread only
  std::mutex shutdown_mu_;                                 // serialises Shutdown callers
  std::thread loop_;
};

Result<int64_t> AsyncEngineImpl::Submit(std::vector<int32_t> prompt_ids,
                                        const SamplingParams& sampling, OutputCallback on_output) {
  Submission sub;
  sub.request.id = next_id_.fetch_add(1);
  sub.request.prompt_ids = std::move(prompt_ids);
  sub.request.sampling = sampling;
  sub.on_output = std::move(on_output);
  RETURN_IF_ERROR(engine_->ValidateRequest(sub.request));  // thread-safe by contract
  const int64_t id = sub.request.id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return Unavailable("the engine is shut down");
    if (num_pending_ >= options_.max_pending_requests) {
      return ResourceExhausted("too many pending requests (max_pending_requests = " +
                               std::to_string(options_.max_pending_requests) + ")");
    }
    ++num_pending_;
    submissions_.push_back(std::move(sub));
  }
  cv_.notify_one();
  return id;
}

void AsyncEngineImpl::Abort(int64_t request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    aborts_.push_back(request_id);
  }
  cv_.notify_one();
}

void AsyncEngineImpl::Drain(std::vector<Submission>* submissions, std::vector<int64_t>* aborts) {
  const double now = SystemClock::Get().NowSeconds();
  for (Submission& sub : *submissions) {
    const int64_t id = sub.request.id;
    sub.request.arrival_time = now;
    Status status = engine_->AddRequest(std::move(sub.request));
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

void AsyncEngineImpl::Deliver(const RequestOutput& out) {
  auto it = callbacks_.find(out.request_id);
  if (it == callbacks_.end()) return;
  if (it->second) it->second(out);
  if (out.finished()) {
    callbacks_.erase(it);
    std::lock_guard<std::mutex> lock(mu_);
    --num_pending_;
  }
}

void AsyncEngineImpl::Loop() {
  std::vector<Submission> submissions;
  std::vector<int64_t> aborts;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !submissions_.empty() || !aborts_.empty() || engine_->HasWork();
      });
      if (stop_) break;
      submissions.swap(submissions_);
      aborts.swap(aborts_);
    }
    Drain(&submissions, &aborts);
    submissions.clear();
    aborts.clear();
    if (!engine_->HasWork()) continue;
    auto outputs = engine_->Step();
    if (!outputs.ok()) {
      PD_LOG_ERROR("engine step failed: {}", outputs.status().ToString());
      continue;
    }
    {  // before the callbacks: a final output implies stats that already show its pages free
      EngineStats stats = engine_->stats();
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = stats;
    }
    for (const RequestOutput& out : *outputs) Deliver(out);
  }
  AbortEverything();
}

// On shutdown: every request, queued or in the engine, ends with kAbort and its pages are freed.
void AsyncEngineImpl::AbortEverything() {
  std::vector<Submission> submissions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    submissions.swap(submissions_);
    aborts_.clear();
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
    std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> serial(shutdown_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) {
    PD_CHECK(loop_.get_id() != std::this_thread::get_id())
        << "AsyncEngine::Shutdown called from its own callback";
    loop_.join();
  }
}

}  // namespace

Result<std::unique_ptr<AsyncEngine>> AsyncEngine::Create(std::unique_ptr<Engine> engine,
                                                         const AsyncEngineOptions& options) {
  if (engine == nullptr) return InvalidArgument("AsyncEngine needs an Engine");
  if (options.max_pending_requests < 1) {
    return InvalidArgument("max_pending_requests must be >= 1, got " +
                           std::to_string(options.max_pending_requests));
  }
  return std::unique_ptr<AsyncEngine>(new AsyncEngineImpl(std::move(engine), options));
}

}  // namespace pd::engine
