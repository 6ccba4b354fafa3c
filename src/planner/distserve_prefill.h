// DistServe's context-stage (prefill) scheduler (distserve/context_stage_scheduler.py, FCFS), for
// replaying DistServe's runs. Whole prompts, FCFS, as many per step as fit within
// max_num_seqs (--context-max-batch-size) and max_num_batched_tokens
// (--context-max-tokens-per-batch), and within the KV blocks: a prompt's blocks stay taken after
// its step until the decode instance has migrated its KV (ReleaseKv), so a decode instance that
// stops accepting stops this instance's admissions (back-pressure).
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>

#include "planner/step_scheduler.h"

namespace pd::planner {

// Thread safety: not thread-safe; the simulator's single thread calls everything.
class DistServePrefillScheduler final : public StepScheduler {
 public:
  explicit DistServePrefillScheduler(const SchedPolicy& policy);
  Status Add(int64_t id, int num_tokens, int num_cached, double now) override;
  SimBatch Schedule(double now) override;
  void Update(const SimBatch& batch, std::span<const int64_t> finished) override;
  void ReleaseKv(int64_t id) override;
  bool HasWork() const override { return !waiting_.empty() || in_flight_; }
  int num_unfinished() const override { return static_cast<int>(waiting_.size()) + num_running_; }
  int max_in_flight() const override { return 1; }
  int64_t num_preemptions() const override { return 0; }
  int64_t held_blocks() const { return held_blocks_; }

 private:
  struct Prompt {
    int64_t id = 0;
    int num_tokens = 0;
  };
  int64_t BlocksFor(int tokens) const {
    return (tokens + policy_.page_size - 1) / policy_.page_size;
  }

  SchedPolicy policy_;
  int64_t total_blocks_ = 0;
  std::deque<Prompt> waiting_;
  bool in_flight_ = false;
  int num_running_ = 0;                        // in the step in flight
  std::unordered_map<int64_t, int64_t> held_;  // prompt -> blocks kept for its migration
  int64_t held_blocks_ = 0;                    // in flight and held
};

}  // namespace pd::planner
