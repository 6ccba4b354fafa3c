// The seam between the simulator and a batch scheduler: which chunk of which sequence runs in an
// instance's next step. Two implementations: NativeStepScheduler (below; token counts only, no
// token ids, several batches in flight for pipeline parallelism) and EngineStepScheduler
// (engine_scheduler.h: pdserve's own engine::Scheduler driven on the simulated clock).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace pd::planner {

// Which batch scheduler NativeSchedulerFactory builds.
enum class BatchRule {
  kPdserve,           // NativeStepScheduler: engine::Scheduler's policy, decodes and prompts mixed
  kVllmV0,            // VllmStepScheduler (vllm_scheduler.h): a step is all prompts or all decodes
  kDistServePrefill,  // DistServePrefillScheduler (distserve_prefill.h): keeps KV until taken
};

struct SchedPolicy {
  BatchRule rule = BatchRule::kPdserve;
  int max_num_seqs = 256;             // running sequences at once
  int max_num_batched_tokens = 2048;  // token budget per step
  bool enable_chunked_prefill = false;
  int64_t kv_capacity_tokens = 1 << 20;
  int page_size = 16;
};

// The error Add returns for a sequence that could never fit in `policy`'s KV capacity.
Status KvCapacityExceeded(int64_t id, int num_tokens, const SchedPolicy& policy);

// One sequence's part of a step: tokens [start, start + num_tokens).
struct BatchItem {
  int64_t seq_id = 0;
  int start = 0;
  int num_tokens = 0;
  bool decode = false;   // one token after everything before it was computed
  bool samples = false;  // the chunk ends at the sequence's last token: the step yields a token
};

struct SimBatch {
  std::vector<BatchItem> items;
  bool empty() const { return items.empty(); }
};

// Thread safety: not thread-safe; the simulator's single thread calls everything.
class StepScheduler {
 public:
  virtual ~StepScheduler() = default;
  // Queues a sequence of num_tokens tokens whose first num_cached tokens already have their KV in
  // this instance (a decode instance receiving a migrated prompt). ResourceExhausted when the
  // sequence can never fit in the KV cache.
  virtual Status Add(int64_t id, int num_tokens, int num_cached, double now) = 0;
  // The next step's work; sequences of batches not yet updated are not scheduled again.
  // Implementations that cannot keep more than one batch in flight return an empty batch while
  // one is (max_in_flight() == 1).
  virtual SimBatch Schedule(double now) = 0;
  // Completes a batch: every sampled item appends one token; `finished` lists the sequences to
  // release (each sampled in this batch).
  virtual void Update(const SimBatch& batch, std::span<const int64_t> finished) = 0;
  virtual bool HasWork() const = 0;
  virtual int num_unfinished() const = 0;
  virtual int max_in_flight() const = 0;
  virtual int64_t num_preemptions() const = 0;
  // The decode instance has taken sequence `id`'s KV (or the sequence ended at its first token).
  // A prefill scheduler that keeps a prompt's KV until then (DistServe's) frees it here.
  virtual void ReleaseKv(int64_t /*id*/) {}
};

// Same policy as engine::Scheduler (src/engine/scheduler.h): decodes oldest first, then running
// prefills, then waiting sequences FCFS within max_num_seqs and the token budget (chunked if
// enabled); pages allocated as positions grow; when the pool runs dry the newest running sequence
// is preempted by recompute and no waiting sequence is admitted that step.
class NativeStepScheduler final : public StepScheduler {
 public:
  explicit NativeStepScheduler(const SchedPolicy& policy);
  Status Add(int64_t id, int num_tokens, int num_cached, double now) override;
  SimBatch Schedule(double now) override;
  void Update(const SimBatch& batch, std::span<const int64_t> finished) override;
  bool HasWork() const override { return !waiting_.empty() || !running_.empty(); }
  int num_unfinished() const override { return static_cast<int>(seqs_.size()); }
  int max_in_flight() const override { return 1 << 20; }
  int64_t num_preemptions() const override { return num_preemptions_; }
  int free_pages() const { return free_pages_; }

 private:
  struct Seq {
    int64_t id = 0;
    int num_tokens = 0;    // prompt + generated so far
    int num_computed = 0;  // tokens whose KV is cached
    int num_pages = 0;
    bool in_flight = false;
    bool running = false;
  };
  int PagesFor(int tokens) const { return (tokens + policy_.page_size - 1) / policy_.page_size; }
  bool Grow(Seq* seq, int tokens);
  void Preempt(Seq* seq);
  void Release(Seq* seq);

  SchedPolicy policy_;
  int total_pages_ = 0;
  int free_pages_ = 0;
  std::unordered_map<int64_t, Seq> seqs_;
  std::deque<Seq*> waiting_;
  std::vector<Seq*> running_;  // admission order: back() is the newest
  int64_t num_preemptions_ = 0;
};

}  // namespace pd::planner
