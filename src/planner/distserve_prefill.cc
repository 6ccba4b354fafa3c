#include "planner/distserve_prefill.h"

#include <algorithm>
#include <string>

#include "common/check.h"

namespace pd::planner {

DistServePrefillScheduler::DistServePrefillScheduler(const SchedPolicy& policy) : policy_(policy) {
  PD_CHECK(policy_.page_size > 0);
  total_blocks_ = policy_.kv_capacity_tokens / policy_.page_size;
}

Status DistServePrefillScheduler::Add(int64_t id, int num_tokens, int num_cached, double /*now*/) {
  if (num_tokens < 1 || num_cached != 0) {
    return InvalidArgument("sequence " + std::to_string(id) +
                           ": DistServe's prefill takes whole prompts only (no cached tokens)");
  }
  if (BlocksFor(num_tokens) > total_blocks_ || num_tokens > policy_.max_num_batched_tokens) {
    return ResourceExhausted("prompt " + std::to_string(id) + " of " + std::to_string(num_tokens) +
                             " tokens exceeds the prefill instance's KV capacity or step budget");
  }
  waiting_.push_back({id, num_tokens});
  return OkStatus();
}

SimBatch DistServePrefillScheduler::Schedule(double /*now*/) {
  SimBatch batch;
  if (in_flight_) return batch;
  int tokens = 0;
  int64_t blocks = held_blocks_;
  while (!waiting_.empty()) {
    const Prompt& p = waiting_.front();
    if (static_cast<int>(batch.items.size()) >= policy_.max_num_seqs ||
        tokens + p.num_tokens > policy_.max_num_batched_tokens ||
        blocks + BlocksFor(p.num_tokens) > total_blocks_) {
      break;
    }
    tokens += p.num_tokens;
    blocks += BlocksFor(p.num_tokens);
    held_[p.id] = BlocksFor(p.num_tokens);
    batch.items.push_back({p.id, 0, p.num_tokens, /*decode=*/false, /*samples=*/true});
    waiting_.pop_front();
  }
  held_blocks_ = blocks;
  num_running_ = static_cast<int>(batch.items.size());
  in_flight_ = !batch.empty();
  return batch;
}

void DistServePrefillScheduler::Update(const SimBatch& /*batch*/,
                                       std::span<const int64_t> /*finished*/) {
  // Every prompt leaves with its first token; its blocks stay until ReleaseKv.
  in_flight_ = false;
  num_running_ = 0;
}

void DistServePrefillScheduler::ReleaseKv(int64_t id) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  held_blocks_ -= it->second;
  held_.erase(it);
}

}  // namespace pd::planner
