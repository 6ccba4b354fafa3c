#include "planner/engine_scheduler.h"

#include <algorithm>
#include <string>
#include <unordered_set>

namespace pd::planner {

EngineStepScheduler::EngineStepScheduler(const SchedPolicy& policy, Role role)
    : policy_(policy), role_(role) {
  const int64_t pages = std::min<int64_t>(policy.kv_capacity_tokens / policy.page_size, 1 << 26);
  pool_ = std::make_unique<engine::PagePool>(static_cast<int>(pages));
  engine::SchedulerOptions o;
  o.max_num_seqs = policy.max_num_seqs;
  o.max_num_batched_tokens = policy.max_num_batched_tokens;
  o.max_model_len = 1 << 30;
  o.enable_chunked_prefill = policy.enable_chunked_prefill;
  sched_ = std::make_unique<engine::Scheduler>(o, pool_.get(), policy.page_size, &clock_);
}

Status EngineStepScheduler::Add(int64_t id, int num_tokens, int num_cached, double now) {
  if (sched_->PagesFor(num_tokens + 1) > pool_->num_total()) {
    return ResourceExhausted("sequence " + std::to_string(id) + " of " +
                             std::to_string(num_tokens) + " tokens exceeds the KV capacity");
  }
  clock_.Set(now);
  std::vector<int32_t> ids(num_tokens, 0);
  Status s;
  if (role_ == Role::kDecode && num_cached > 0) {
    // Remote KV: the first num_tokens - 1 tokens arrived; the last runs as a decode step.
    s = sched_->AddRemoteKvSequence(id, std::move(ids), now);
    if (s.ok()) MarkReserved();
  } else if (role_ == Role::kPrefill) {
    s = sched_->AddPrefillOnlySequence(id, std::move(ids), now);
  } else {
    s = sched_->AddSequence(id, std::move(ids), now);
  }
  if (s.ok()) ++num_unfinished_;
  return s;
}

void EngineStepScheduler::MarkReserved() {
  // In the simulator a remote-KV sequence's KV is already here when it is added, so it is ready
  // as soon as its pages are reserved.
  for (int64_t id : sched_->ReserveRemoteKv()) sched_->MarkKvReady(id).IgnoreError();
}

bool EngineStepScheduler::HasWork() const {
  return sched_->HasWork() || sched_->num_awaiting_pages() > 0;
}

SimBatch EngineStepScheduler::Schedule(double now) {
  SimBatch out;
  if (in_flight_) return out;
  clock_.Set(now);
  MarkReserved();
  batch_ = sched_->Schedule();
  if (batch_.empty()) return out;
  in_flight_ = true;
  out.items.reserve(batch_.seqs.size());
  for (const auto& s : batch_.seqs) {
    out.items.push_back({s.seq_id, s.start_pos, s.num_tokens, s.is_decode, s.samples});
  }
  return out;
}

void EngineStepScheduler::Update(const SimBatch& /*batch*/, std::span<const int64_t> finished) {
  std::unordered_set<int64_t> done(finished.begin(), finished.end());
  std::vector<engine::SeqUpdate> updates;
  updates.reserve(batch_.seqs.size());
  for (const auto& s : batch_.seqs) {
    if (!s.samples) continue;
    updates.push_back({s.seq_id, 0, done.count(s.seq_id) > 0});
  }
  sched_->Update(batch_, updates);
  num_unfinished_ -= static_cast<int>(done.size());
  in_flight_ = false;
  batch_ = {};
  MarkReserved();
}

SchedulerFactory EngineSchedulerFactory() {
  return [](const SchedPolicy& policy, Role role) -> std::unique_ptr<StepScheduler> {
    return std::make_unique<EngineStepScheduler>(policy, role);
  };
}

}  // namespace pd::planner
