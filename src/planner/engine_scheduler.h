// Runs pdserve's own batch scheduler (engine::Scheduler) inside the simulator: a PagePool sized
// to the instance's KV capacity, a SimClock set to the simulated time, and sequences of dummy
// token ids. Prefill instances add prefill-only sequences, decode instances remote-KV sequences
// (reserved, then marked ready when the transfer lands), colocated instances plain ones.
//
// engine::Scheduler keeps one batch in flight (Schedule, then Update), so an instance with
// pipeline parallelism runs one batch at a time through its stages here: PP shortens nothing and
// adds no throughput. Use the native scheduler for PP > 1.
#pragma once

#include <memory>

#include "common/clock.h"
#include "engine/kv_cache.h"
#include "engine/scheduler.h"
#include "planner/simulator.h"

namespace pd::planner {

class EngineStepScheduler final : public StepScheduler {
 public:
  EngineStepScheduler(const SchedPolicy& policy, Role role);
  Status Add(int64_t id, int num_tokens, int num_cached, double now) override;
  SimBatch Schedule(double now) override;
  void Update(const SimBatch& batch, std::span<const int64_t> finished) override;
  bool HasWork() const override;
  int num_unfinished() const override { return num_unfinished_; }
  int max_in_flight() const override { return 1; }
  int64_t num_preemptions() const override { return sched_->num_preemptions(); }

 private:
  void MarkReserved();

  SchedPolicy policy_;
  Role role_;
  SimClock clock_;
  std::unique_ptr<engine::PagePool> pool_;
  std::unique_ptr<engine::Scheduler> sched_;
  engine::ScheduledBatch batch_;  // the batch in flight
  bool in_flight_ = false;
  int num_unfinished_ = 0;
};

// EngineStepScheduler for every role.
SchedulerFactory EngineSchedulerFactory();

}  // namespace pd::planner
