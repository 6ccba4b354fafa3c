// vLLM v0's default batch scheduler (vllm/core/scheduler.py as DistServe's vLLM baseline ran it,
// before chunked prefill), for replaying colocated vLLM runs.
//
// Every step is either a prompt step or a decode step, never both:
//   1. Waiting sequences, FCFS, are admitted while they fit: the padded prompt batch
//      (count × longest) within max_num_batched_tokens, at most max_paddings padding tokens,
//      running sequences within max_num_seqs, and the prompt's KV blocks leaving a watermark of
//      1% of the blocks free. A step that admits any prompt runs those prompts alone; the running
//      sequences get no token from it.
//   2. Otherwise every running sequence decodes one token, oldest first. A sequence that needs a
//      block when none is free preempts the newest running sequence (or itself, when it is the
//      newest) by recompute: its blocks are freed and it goes back to the front of the waiting
//      queue, to be prefilled again over its prompt and the tokens it already generated.
#pragma once

#include <deque>
#include <unordered_map>
#include <vector>

#include "planner/step_scheduler.h"

namespace pd::planner {

// vLLM v0's defaults for the two limits SchedPolicy does not carry.
inline constexpr int kVllmMaxPaddings = 256;
inline constexpr double kVllmWatermark = 0.01;  // share of the blocks admission leaves free

// Thread safety: not thread-safe; the simulator's single thread calls everything.
class VllmStepScheduler final : public StepScheduler {
 public:
  explicit VllmStepScheduler(const SchedPolicy& policy);
  Status Add(int64_t id, int num_tokens, int num_cached, double now) override;
  SimBatch Schedule(double now) override;
  void Update(const SimBatch& batch, std::span<const int64_t> finished) override;
  bool HasWork() const override { return !waiting_.empty() || !running_.empty(); }
  int num_unfinished() const override { return static_cast<int>(seqs_.size()); }
  int max_in_flight() const override { return 1; }
  int64_t num_preemptions() const override { return num_preemptions_; }
  int free_blocks() const { return free_blocks_; }

 private:
  struct Seq {
    int64_t id = 0;
    int64_t order = 0;   // admission to the scheduler: the FCFS priority
    int num_tokens = 0;  // prompt + generated so far
    int num_blocks = 0;
  };
  int BlocksFor(int tokens) const { return (tokens + policy_.page_size - 1) / policy_.page_size; }
  SimBatch SchedulePrompts();
  SimBatch ScheduleDecodes();
  void Preempt(Seq* seq);

  SchedPolicy policy_;
  int total_blocks_ = 0;
  int free_blocks_ = 0;
  int watermark_blocks_ = 0;
  int64_t next_order_ = 0;
  bool in_flight_ = false;
  std::unordered_map<int64_t, Seq> seqs_;
  std::deque<Seq*> waiting_;
  std::vector<Seq*> running_;  // oldest first
  int64_t num_preemptions_ = 0;
};

}  // namespace pd::planner
