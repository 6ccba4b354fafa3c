#include "planner/vllm_scheduler.h"

#include <algorithm>
#include <string>

#include "common/check.h"

namespace pd::planner {

VllmStepScheduler::VllmStepScheduler(const SchedPolicy& policy) : policy_(policy) {
  PD_CHECK(policy_.page_size > 0);
  const int64_t blocks = policy_.kv_capacity_tokens / policy_.page_size;
  total_blocks_ = free_blocks_ = static_cast<int>(std::min<int64_t>(blocks, 1 << 30));
  watermark_blocks_ = static_cast<int>(kVllmWatermark * total_blocks_);
}

Status VllmStepScheduler::Add(int64_t id, int num_tokens, int num_cached, double /*now*/) {
  if (num_tokens < 1 || num_cached != 0) {
    return InvalidArgument("sequence " + std::to_string(id) +
                           ": vLLM's scheduler takes whole prompts only (no cached tokens)");
  }
  if (total_blocks_ - BlocksFor(num_tokens) < watermark_blocks_) {
    return KvCapacityExceeded(id, num_tokens, policy_);
  }
  auto [it, inserted] = seqs_.try_emplace(id);
  if (!inserted) return AlreadyExists("sequence " + std::to_string(id) + " is already queued");
  Seq& s = it->second;
  s.id = id;
  s.order = next_order_++;
  s.num_tokens = num_tokens;
  waiting_.push_back(&s);
  return OkStatus();
}

SimBatch VllmStepScheduler::Schedule(double /*now*/) {
  if (in_flight_) return {};
  SimBatch batch = SchedulePrompts();
  if (batch.empty()) batch = ScheduleDecodes();
  // Every running sequence preempted: vLLM's next step runs the waiting prompts.
  if (batch.empty()) batch = SchedulePrompts();
  in_flight_ = !batch.empty();
  return batch;
}

SimBatch VllmStepScheduler::SchedulePrompts() {
  SimBatch batch;
  int longest = 0, sum = 0;
  while (!waiting_.empty()) {
    Seq* s = waiting_.front();
    const int blocks = BlocksFor(s->num_tokens);
    if (free_blocks_ - blocks < watermark_blocks_) break;
    const int count = static_cast<int>(batch.items.size()) + 1;
    const int padded = count * std::max(longest, s->num_tokens);
    if (padded > policy_.max_num_batched_tokens) break;
    if (static_cast<int>(running_.size()) + 1 > policy_.max_num_seqs) break;
    if (padded - (sum + s->num_tokens) > kVllmMaxPaddings) break;
    longest = std::max(longest, s->num_tokens);
    sum += s->num_tokens;
    waiting_.pop_front();
    free_blocks_ -= blocks;
    s->num_blocks = blocks;
    // Running stays in FCFS order: a recomputed sequence goes back to its old place.
    auto pos = std::upper_bound(running_.begin(), running_.end(), s,
                                [](const Seq* a, const Seq* b) { return a->order < b->order; });
    running_.insert(pos, s);
    batch.items.push_back({s->id, 0, s->num_tokens, /*decode=*/false, /*samples=*/true});
  }
  return batch;
}

void VllmStepScheduler::Preempt(Seq* seq) {
  free_blocks_ += seq->num_blocks;
  seq->num_blocks = 0;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
  ++num_preemptions_;
}

SimBatch VllmStepScheduler::ScheduleDecodes() {
  SimBatch batch;
  // Oldest first; a sequence may preempt only those after it.
  for (size_t i = 0; i < running_.size(); ++i) {
    Seq* s = running_[i];
    bool self_preempted = false;
    // vLLM asks for a free block per running sequence before appending a slot, whether or not
    // the slot opens a new block.
    while (free_blocks_ < 1) {
      if (i + 1 < running_.size()) {
        Preempt(running_.back());
      } else {
        Preempt(s);
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;
    const int need = BlocksFor(s->num_tokens) - s->num_blocks;
    free_blocks_ -= need;
    s->num_blocks += need;
    batch.items.push_back({s->id, s->num_tokens - 1, 1, /*decode=*/true, /*samples=*/true});
  }
  return batch;
}

void VllmStepScheduler::Update(const SimBatch& batch, std::span<const int64_t> finished) {
  in_flight_ = false;
  for (const BatchItem& item : batch.items) {
    auto it = seqs_.find(item.seq_id);
    if (it != seqs_.end()) ++it->second.num_tokens;
  }
  for (int64_t id : finished) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    Seq* s = &it->second;
    free_blocks_ += s->num_blocks;
    running_.erase(std::find(running_.begin(), running_.end(), s));
    seqs_.erase(it);
  }
}

}  // namespace pd::planner
