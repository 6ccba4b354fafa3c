// The tensor-parallel runner: N rank runners over sharded weights, each with its own KV region
// and thread pool, run step by step in lockstep (the all-reduces inside the layers keep them so).
// Rank 0 runs on the caller's thread (the engine loop), ranks 1.. on threads owned here.
#include "engine/tp_model_runner.h"

#include <algorithm>
#include <string>
#include <thread>

#include "common/check.h"
#include "common/mutex.h"
#include "common/thread_util.h"
#include "engine/rank_runner.h"
#include "engine/tp_all_reduce.h"
#include "engine/tp_shard.h"

namespace pd::engine {
namespace {

// Thread safety: Forward is called by one thread at a time; it hands the step to the rank
// threads under mu_ and waits until every rank is done, so batch_/out_ are only read by rank
// threads while Forward is blocked.
class TpRunner final : public ModelRunner {
 public:
  TpRunner(std::unique_ptr<RunnerWeights> full, std::unique_ptr<TpAllReduce> reduce,
           std::vector<std::unique_ptr<ModelRunner>> ranks)
      : full_(std::move(full)), reduce_(std::move(reduce)), ranks_(std::move(ranks)) {
    status_.resize(ranks_.size());
    for (size_t r = 1; r < ranks_.size(); ++r)
      threads_.emplace_back([this, r] { RankLoop(static_cast<int>(r)); });
  }
  ~TpRunner() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    work_cv_.SignalAll();
    for (std::thread& t : threads_) t.join();
  }

  Status Forward(const ForwardBatch& batch, ForwardOutput* out) override EXCLUDES(mu_);
  const model::ModelConfig& config() const override { return full_->config; }
  KvRegion& region() override { return ranks_[0]->region(); }
  const LayerProgress& progress() const override { return ranks_[0]->progress(); }
  uint64_t steps_done() const override { return ranks_[0]->steps_done(); }
  int num_ranks() const override { return static_cast<int>(ranks_.size()); }
  KvRegion& rank_region(int rank) override {
    PD_CHECK(rank >= 0 && rank < num_ranks()) << "rank " << rank << " of " << num_ranks();
    return ranks_[rank]->region();
  }

 private:
  void RankLoop(int rank) EXCLUDES(mu_);

  std::unique_ptr<RunnerWeights> full_;  // the unsharded views the ranks' weights point into
  std::unique_ptr<TpAllReduce> reduce_;
  std::vector<std::unique_ptr<ModelRunner>> ranks_;
  std::vector<std::thread> threads_;  // ranks 1..N-1

  Mutex mu_;
  CondVar work_cv_, done_cv_;
  uint64_t generation_ GUARDED_BY(mu_) = 0;  // bumped per step
  int pending_ GUARDED_BY(mu_) = 0;          // rank threads still running the step
  bool stop_ GUARDED_BY(mu_) = false;
  const ForwardBatch* batch_ GUARDED_BY(mu_) = nullptr;
  ForwardOutput* out_ GUARDED_BY(mu_) = nullptr;
  std::vector<Status> status_;  // [rank] of the current step
};

void TpRunner::RankLoop(int rank) {
  SetCurrentThreadName("pd-rank-" + std::to_string(rank));
  uint64_t seen = 0;
  for (;;) {
    const ForwardBatch* batch;
    ForwardOutput* out;
    {
      MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      batch = batch_;
      out = out_;
    }
    status_[rank] = ranks_[rank]->Forward(*batch, out);
    {
      MutexLock lock(&mu_);
      --pending_;
    }
    done_cv_.Signal();
  }
}

Status TpRunner::Forward(const ForwardBatch& batch, ForwardOutput* out) {
  // The ranks write disjoint parts of `out`: size it first.
  const size_t n = batch.seqs.size();
  out->logits.resize(n);
  out->last_hidden.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (batch.seqs[i].compute_logits) {
      const size_t rows =
          std::clamp<size_t>(batch.seqs[i].num_logits, 1, batch.seqs[i].token_ids.size());
      out->logits[i].resize(rows * full_->config.vocab_size);
    } else {
      out->logits[i].clear();
    }
    out->last_hidden[i].resize(full_->config.hidden_size);
  }
  out->hidden.resize(batch.all_hidden ? n : 0);  // rank 0 sizes and writes each seq's rows
  {
    MutexLock lock(&mu_);
    batch_ = &batch;
    out_ = out;
    pending_ = static_cast<int>(threads_.size());
    ++generation_;
  }
  work_cv_.SignalAll();
  // Every rank validates the same batch against the same page count, so all fail or none does
  // (a failed rank never reaches the all-reduce barriers).
  status_[0] = ranks_[0]->Forward(batch, out);
  {
    MutexLock lock(&mu_);
    while (pending_ != 0) done_cv_.Wait(&mu_);
  }
  for (const Status& s : status_) RETURN_IF_ERROR(s);
  return OkStatus();
}

}  // namespace

Result<std::unique_ptr<ModelRunner>> CreateTpModelRunner(const model::ModelWeights& weights,
                                                         const ModelRunnerOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<RunnerWeights> full, PrepareRunnerWeights(weights));
  return CreateTpModelRunner(std::move(full), options);
}

Result<std::unique_ptr<ModelRunner>> CreateTpModelRunner(std::unique_ptr<RunnerWeights> full,
                                                         const ModelRunnerOptions& options) {
  const int tp = options.tensor_parallel_size;
  const model::ModelConfig& c = full->config;
  RETURN_IF_ERROR(ValidateTensorParallel(c, tp));
  size_t page_bytes_all = 0;
  for (int r = 0; r < tp; ++r) {
    const KvCacheSpec spec = RankKvSpec(options.kv, c, ComputeTpShard(c, tp, r).num_kv_heads);
    page_bytes_all += spec.page_bytes();
  }
  ASSIGN_OR_RETURN(int64_t num_pages, RunnerNumPages(options, page_bytes_all, c.num_layers));
  auto reduce = std::make_unique<TpAllReduce>(tp);
  std::vector<std::unique_ptr<ModelRunner>> ranks;
  for (int r = 0; r < tp; ++r) {
    const TpShard shard = ComputeTpShard(c, tp, r);
    ASSIGN_OR_RETURN(std::unique_ptr<RunnerWeights> w, ShardRunnerWeights(*full, shard));
    if (full->mtp_input != nullptr) {  // replicated; eh_proj read in place from `full`
      w->mtp_input = std::make_unique<RunnerMtpInput>();
      w->mtp_input->enorm = full->mtp_input->enorm;
      w->mtp_input->hnorm = full->mtp_input->hnorm;
      w->mtp_input->eh_proj.w = full->mtp_input->eh_proj.w;
    }
    RankContext ctx;
    ctx.reduce = reduce.get();
    ctx.rank = r;
    ctx.vocab_begin = shard.vocab_begin;
    ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                     CreateRankRunner(std::move(w), options, num_pages, ctx));
    ranks.push_back(std::move(runner));
  }
  return std::unique_ptr<ModelRunner>(
      new TpRunner(std::move(full), std::move(reduce), std::move(ranks)));
}

}  // namespace pd::engine
