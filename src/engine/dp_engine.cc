// The data-parallel engine (dp_engine.h): N stepped sub-engines over rank runners that share one
// MoE exchange, their forward passes run in lockstep.
#include "engine/dp_engine.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/mutex.h"
#include "common/thread_util.h"
#include "common/trace.h"
#include "engine/engine_stepped.h"
#include "engine/moe_expert_parallel.h"
#include "engine/rank_runner.h"

namespace pd::engine {
namespace {

// Runs fn(rank) for every rank at once: rank 0 on the caller, ranks 1.. on threads owned here.
// Thread safety: Run is called by one thread at a time; it hands fn to the threads under mu_ and
// returns once every rank is done, so fn_ is only read by the threads while Run blocks.
class RankThreads {
 public:
  explicit RankThreads(int num_ranks) {
    for (int r = 1; r < num_ranks; ++r) threads_.emplace_back([this, r] { Loop(r); });
  }
  ~RankThreads() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    work_cv_.SignalAll();
    for (std::thread& t : threads_) t.join();
  }
  void Run(const std::function<void(int)>& fn) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      fn_ = &fn;
      pending_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    work_cv_.SignalAll();
    fn(0);
    MutexLock lock(&mu_);
    while (pending_ != 0) done_cv_.Wait(&mu_);
  }

 private:
  void Loop(int rank) EXCLUDES(mu_) {
    SetCurrentThreadName("pd-dp-" + std::to_string(rank));
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* fn;
      {
        MutexLock lock(&mu_);
        while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
        if (stop_) return;
        seen = generation_;
        fn = fn_;
      }
      (*fn)(rank);
      {
        MutexLock lock(&mu_);
        --pending_;
      }
      done_cv_.Signal();
    }
  }

  std::vector<std::thread> threads_;
  Mutex mu_;
  CondVar work_cv_, done_cv_;
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  int pending_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  const std::function<void(int)>* fn_ GUARDED_BY(mu_) = nullptr;
};

// What the messengers see of the instance (DpEngine::runner()): every DP rank's region, rank 0's
// config, progress and step count (DataParallelSize finds it). The ranks step through the engine
// only.
class DpRunnerView final : public ModelRunner {
 public:
  explicit DpRunnerView(std::vector<ModelRunner*> ranks) : ranks_(std::move(ranks)) {}
  Status Forward(const ForwardBatch&, ForwardOutput*) override {
    return FailedPrecondition("a data-parallel instance's ranks step through its engine");
  }
  const model::ModelConfig& config() const override { return ranks_[0]->config(); }
  KvRegion& region() override { return ranks_[0]->region(); }
  const LayerProgress& progress() const override { return ranks_[0]->progress(); }
  uint64_t steps_done() const override { return ranks_[0]->steps_done(); }
  int num_ranks() const override { return static_cast<int>(ranks_.size()); }
  int data_parallel_size() const { return static_cast<int>(ranks_.size()); }
  const LayerProgress& rank_progress(int rank) const {
    PD_CHECK(rank >= 0 && rank < num_ranks()) << "DP rank " << rank << " of " << num_ranks();
    return ranks_[rank]->progress();
  }
  KvRegion& rank_region(int rank) override {
    PD_CHECK(rank >= 0 && rank < num_ranks()) << "DP rank " << rank << " of " << num_ranks();
    return ranks_[rank]->region();
  }

 private:
  std::vector<ModelRunner*> ranks_;
};

std::vector<ModelRunner*> RankRunners(const std::vector<std::unique_ptr<SteppedEngine>>& ranks) {
  std::vector<ModelRunner*> out;
  for (const auto& r : ranks) out.push_back(&r->runner());
  return out;
}

std::vector<DisaggHooks*> RankHooks(const std::vector<std::unique_ptr<SteppedEngine>>& ranks) {
  std::vector<DisaggHooks*> out;
  for (const auto& r : ranks) {
    out.push_back(r->disagg_hooks());
    PD_CHECK(out.back() != nullptr);
  }
  return out;
}

// Thread safety: as Engine (one thread); the rank threads run only inside Step. ReleasePages and
// RetainPages, from any thread, read only what is fixed at construction and call the ranks' own
// thread-safe ones.
class DpEngine final : public Engine, public DisaggHooks {
 public:
  DpEngine(std::unique_ptr<MoeExchange> exchange, std::vector<std::unique_ptr<SteppedEngine>> ranks,
           Tracer* tracer)
      : exchange_(std::move(exchange)),
        ranks_(std::move(ranks)),
        load_(ranks_.size(), 0),
        idle_out_(ranks_.size()),
        statuses_(ranks_.size()),
        active_(ranks_.size(), false),
        threads_(static_cast<int>(ranks_.size())),
        tracer_(tracer),
        view_(RankRunners(ranks_)),
        hooks_(RankHooks(ranks_)),
        pages_per_rank_(ranks_[0]->runner().region().num_pages()) {}

  Status ValidateRequest(const Request& request) const override {
    return ranks_[0]->ValidateRequest(request);  // every rank has the same config and pages
  }
  Status AddRequest(Request request) override { return Add(std::move(request), Kind::kLocal); }
  void Abort(int64_t request_id) override {
    auto it = owner_.find(request_id);
    if (it != owner_.end()) ranks_[it->second]->Abort(request_id);  // reported at its next step
  }
  bool HasWork() const override {
    for (const auto& r : ranks_)
      if (r->HasWork()) return true;
    return false;
  }
  bool Stalled() const override {
    bool any = false;
    for (const auto& r : ranks_) {
      if (!r->HasWork()) continue;
      if (!r->Stalled()) return false;
      any = true;
    }
    return any;
  }
  Result<std::vector<RequestOutput>> Step() override;
  EngineStats stats() const override;
  const model::ModelConfig& config() const override { return ranks_[0]->config(); }
  ModelRunner& runner() override { return view_; }
  DisaggHooks* disagg_hooks() override { return this; }
  Status CheckPages() const override {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const Status s = ranks_[r]->CheckPages();
      if (!s.ok()) return Internal("DP rank " + std::to_string(r) + ": " + s.message());
    }
    return OkStatus();
  }

  // DisaggHooks: prefill-only and remote-KV requests go to the least loaded rank; pages are named
  // by DpPageId, in page tables (PrefillResult, KvReservation, the step observer's chunks) and in
  // ReleasePages / RetainPages. The step observer hears each rank's steps, its runner_step the
  // rank's own (DpRankProgress(runner(), rank) says when its layers are final); the rank of a
  // chunk is DpRankOfPage of its pages.
  Status AddPrefillOnlyRequest(Request request) override {
    return Add(std::move(request), Kind::kPrefillOnly);
  }
  void ReleasePages(std::span<const int32_t> pages) override {
    ForEachRank(pages, [](DisaggHooks& h, std::span<const int32_t> p) { h.ReleasePages(p); });
  }
  void RetainPages(std::span<const int32_t> pages) override {
    ForEachRank(pages, [](DisaggHooks& h, std::span<const int32_t> p) { h.RetainPages(p); });
  }
  void SetStepObserver(StepObserver observer) override {
    for (size_t r = 0; r < hooks_.size(); ++r) {
      if (!observer) {
        hooks_[r]->SetStepObserver(nullptr);
        continue;
      }
      hooks_[r]->SetStepObserver([this, observer, r](const StepInfo& info) {
        StepInfo global = info;
        for (PrefillChunk& c : global.prefill_chunks)
          for (int32_t& p : c.page_table) p = DpPageId(static_cast<int>(r), p, pages_per_rank_);
        observer(global);
      });
    }
  }
  Status AddRemoteKvRequest(Request request) override {
    return Add(std::move(request), Kind::kRemoteKv);
  }
  Status SetPrefilledHidden(int64_t request_id, std::vector<float> hidden) override {
    auto it = owner_.find(request_id);
    if (it == owner_.end())
      return NotFound("request " + std::to_string(request_id) + " is not running");
    return hooks_[it->second]->SetPrefilledHidden(request_id, std::move(hidden));
  }
  std::span<const float> PrefilledHidden(int64_t request_id) const override {
    auto it = owner_.find(request_id);
    return it == owner_.end() ? std::span<const float>()
                              : hooks_[it->second]->PrefilledHidden(request_id);
  }
  std::vector<KvReservation> TakeKvReservations() override;
  Status MarkKvReady(int64_t request_id) override {
    auto it = owner_.find(request_id);
    if (it == owner_.end())
      return NotFound("request " + std::to_string(request_id) + " is not running");
    return hooks_[it->second]->MarkKvReady(request_id);
  }
  // Each rank's draft region holds its own pages: not one region the messengers could name.
  ModelRunner* DraftKvRunner() override { return nullptr; }
  void SetRemoteDraftKv(bool on) override {
    for (DisaggHooks* h : hooks_) h->SetRemoteDraftKv(on);
  }
  bool AwaitsKv() const override {
    for (const DisaggHooks* h : hooks_)
      if (h->AwaitsKv()) return true;
    return false;
  }
  size_t WarmCaches(size_t max_bytes, const std::function<bool()>& stop) override {
    size_t bytes = 0;
    for (DisaggHooks* h : hooks_) bytes += h->WarmCaches(max_bytes, stop);
    return bytes;
  }

 private:
  enum class Kind { kLocal, kRemoteKv, kPrefillOnly };
  Status Add(Request request, Kind kind);
  // Names the pages of rank r's outputs [from, end) (their PrefillResults) by DpPageId.
  void GlobalPageIds(int r, size_t from, std::vector<RequestOutput>* outputs) const;
  // Calls fn(rank's hooks, its local page ids) for each rank that `pages` (DpPageIds) name.
  template <typename Fn>
  void ForEachRank(std::span<const int32_t> pages, Fn&& fn) {
    std::vector<std::vector<int32_t>> local(ranks_.size());
    for (int32_t id : pages) {
      const int r = DpRankOfPage(id, pages_per_rank_);
      PD_CHECK(id >= 0 && r < static_cast<int>(ranks_.size())) << "page id " << id;
      local[r].push_back(DpLocalPage(id, pages_per_rank_));
    }
    for (size_t r = 0; r < ranks_.size(); ++r)
      if (!local[r].empty()) fn(*hooks_[r], local[r]);
  }
  int LeastLoadedRank() const {
    int best = 0;
    for (int r = 1; r < static_cast<int>(load_.size()); ++r)
      if (load_[r] < load_[best]) best = r;
    return best;
  }
  void Forget(const std::vector<RequestOutput>& outputs);

  std::unique_ptr<MoeExchange> exchange_;  // outlives the ranks' runners, which point to it
  std::vector<std::unique_ptr<SteppedEngine>> ranks_;
  std::unordered_map<int64_t, int> owner_;  // unfinished request -> its rank
  std::vector<int> load_;                   // [rank] unfinished requests
  const ForwardBatch empty_batch_;          // a rank's batch when it scheduled nothing
  std::vector<ForwardOutput> idle_out_;     // [rank] its output then
  std::vector<Status> statuses_;            // [rank] its forward pass of the current step
  std::vector<bool> active_;                // [rank] it scheduled a batch this step
  RankThreads threads_;
  Tracer* const tracer_;
  DpRunnerView view_;
  const std::vector<DisaggHooks*> hooks_;  // [rank] its engine's
  const int32_t pages_per_rank_;
};

Status DpEngine::Add(Request request, Kind kind) {
  const int64_t id = request.id;
  if (owner_.count(id) != 0)
    return AlreadyExists("request " + std::to_string(id) + " is already running");
  const int rank = LeastLoadedRank();
  switch (kind) {
    case Kind::kLocal:
      RETURN_IF_ERROR(ranks_[rank]->AddRequest(std::move(request)));
      break;
    case Kind::kRemoteKv:
      RETURN_IF_ERROR(hooks_[rank]->AddRemoteKvRequest(std::move(request)));
      break;
    case Kind::kPrefillOnly:
      RETURN_IF_ERROR(hooks_[rank]->AddPrefillOnlyRequest(std::move(request)));
      break;
  }
  owner_.emplace(id, rank);
  ++load_[rank];
  return OkStatus();
}

std::vector<KvReservation> DpEngine::TakeKvReservations() {
  std::vector<KvReservation> out;
  for (size_t r = 0; r < ranks_.size(); ++r)
    for (KvReservation& res : hooks_[r]->TakeKvReservations()) {
      for (int32_t& p : res.page_table) p = DpPageId(static_cast<int>(r), p, pages_per_rank_);
      out.push_back(std::move(res));
    }
  return out;
}

void DpEngine::GlobalPageIds(int r, size_t from, std::vector<RequestOutput>* outputs) const {
  for (size_t i = from; i < outputs->size(); ++i) {
    RequestOutput& out = (*outputs)[i];
    if (out.prefill_result == nullptr) continue;
    auto global = std::make_shared<PrefillResult>(*out.prefill_result);
    for (int32_t& p : global->page_table) p = DpPageId(r, p, pages_per_rank_);
    out.prefill_result = std::move(global);
  }
}

void DpEngine::Forget(const std::vector<RequestOutput>& outputs) {
  for (const RequestOutput& out : outputs) {
    if (out.finish_reason == FinishReason::kNone) continue;
    auto it = owner_.find(out.request_id);
    if (it == owner_.end()) continue;
    --load_[it->second];
    owner_.erase(it);
  }
}

Result<std::vector<RequestOutput>> DpEngine::Step() {
  std::vector<RequestOutput> outputs;
  bool any = false;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const size_t from = outputs.size();
    active_[r] = ranks_[r]->BeginStep(&outputs);
    GlobalPageIds(static_cast<int>(r), from, &outputs);
    any = any || active_[r];
  }
  if (any) {
    TraceSpan span(tracer_, "step", "engine");
    if (span.enabled())
      span.Arg("dp_ranks_active",
               static_cast<int64_t>(std::count(active_.begin(), active_.end(), true)));
    threads_.Run([this](int r) {
      SteppedEngine& e = *ranks_[r];
      statuses_[r] = active_[r] ? e.runner().Forward(e.step_batch(), e.step_output())
                                : e.runner().Forward(empty_batch_, &idle_out_[r]);
    });
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (!active_[r]) continue;
      const size_t from = outputs.size();
      ranks_[r]->EndStep(statuses_[r], &outputs);
      GlobalPageIds(static_cast<int>(r), from, &outputs);
    }
  }
  Forget(outputs);
  return outputs;
}

EngineStats DpEngine::stats() const {
  EngineStats sum;
  for (const auto& r : ranks_) {
    const EngineStats s = r->stats();
    sum.num_running += s.num_running;
    sum.num_waiting += s.num_waiting;
    sum.num_free_pages += s.num_free_pages;
    sum.num_total_pages += s.num_total_pages;
    sum.num_preemptions += s.num_preemptions;
    sum.num_awaiting_kv += s.num_awaiting_kv;
    sum.prefix_cache_queries += s.prefix_cache_queries;
    sum.prefix_cache_hits += s.prefix_cache_hits;
    sum.num_cached_pages += s.num_cached_pages;
    sum.spec_decode += s.spec_decode;
  }
  return sum;
}

// Keeps rank `rank`'s routed experts of every MoE layer and drops the others' (their memory too).
void DealExperts(RunnerWeights* w, int num_ranks, int rank) {
  for (RunnerLayerWeights& l : w->layers)
    for (size_t x = 0; x < l.moe.experts.size(); ++x)
      if (ExpertOwner(static_cast<int>(x), num_ranks) != rank) l.moe.experts[x] = RunnerExpert{};
}

}  // namespace

Status ValidateDataParallel(const model::ModelConfig& c, int dp, int tp) {
  const std::string what = "data_parallel_size " + std::to_string(dp);
  if (dp < 1) return InvalidArgument(what + ": must be at least 1");
  if (dp == 1) return OkStatus();
  if (!c.is_mla())
    return InvalidArgument(what +
                           ": data-parallel attention is for MLA models (deepseek_v3); "
                           "this model (" +
                           std::string(model::ArchName(c.arch)) +
                           ") shards its KV heads with --tensor-parallel-size instead");
  if (tp != 1)
    return InvalidArgument(what + " with tensor_parallel_size " + std::to_string(tp) +
                           ": data-parallel ranks with tensor parallelism inside are not "
                           "supported; use one or the other");
  return OkStatus();
}

int DataParallelSize(const ModelRunner& runner) {
  const auto* view = dynamic_cast<const DpRunnerView*>(&runner);
  return view != nullptr ? view->data_parallel_size() : 1;
}

const LayerProgress& DpRankProgress(const ModelRunner& runner, int rank) {
  const auto* view = dynamic_cast<const DpRunnerView*>(&runner);
  if (view == nullptr) {
    PD_CHECK(rank == 0) << "DP rank " << rank << " of an instance without DP ranks";
    return runner.progress();
  }
  return view->rank_progress(rank);
}

Result<std::unique_ptr<Engine>> CreateDpEngine(const model::ModelWeights& weights,
                                               const EngineOptions& engine_options, int dp) {
  const model::ModelConfig& c = weights.config;
  RETURN_IF_ERROR(ValidateDataParallel(c, dp, engine_options.runner.tensor_parallel_size));
  EngineOptions options = engine_options;
  if (options.runner.num_threads == 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    options.runner.num_threads = std::max(1, cores / dp);
  }
  const KvCacheSpec spec = RankKvSpec(options.runner.kv, c, c.num_kv_heads);
  ASSIGN_OR_RETURN(int64_t num_pages,
                   RunnerNumPages(options.runner, spec.page_bytes() * dp, c.num_layers));
  if (num_pages * dp > INT32_MAX)  // DpPageId must fit
    return InvalidArgument("data_parallel_size " + std::to_string(dp) + " x " +
                           std::to_string(num_pages) + " pages per rank exceeds 2^31 page ids");
  auto exchange = std::make_unique<MoeExchange>(dp);
  std::vector<std::unique_ptr<SteppedEngine>> ranks;
  for (int r = 0; r < dp; ++r) {
    ASSIGN_OR_RETURN(std::unique_ptr<RunnerWeights> w, PrepareRunnerWeights(weights));
    DealExperts(w.get(), dp, r);
    RankContext ctx;
    ctx.experts = exchange.get();
    ctx.rank = r;
    ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                     CreateRankRunner(std::move(w), options.runner, num_pages, ctx));
    ASSIGN_OR_RETURN(std::unique_ptr<SteppedEngine> engine,
                     CreateSteppedEngine(std::move(runner), options));
    ranks.push_back(std::move(engine));
  }
  return std::unique_ptr<Engine>(
      new DpEngine(std::move(exchange), std::move(ranks), options.runner.tracer));
}

}  // namespace pd::engine
