#include "planner/step_scheduler.h"

#include <algorithm>
#include <string>

#include "common/check.h"

namespace pd::planner {

Status KvCapacityExceeded(int64_t id, int num_tokens, const SchedPolicy& policy) {
  return ResourceExhausted("sequence " + std::to_string(id) + " of " + std::to_string(num_tokens) +
                           " tokens exceeds the KV capacity of " +
                           std::to_string(policy.kv_capacity_tokens) + " tokens");
}

NativeStepScheduler::NativeStepScheduler(const SchedPolicy& policy) : policy_(policy) {
  PD_CHECK(policy_.page_size > 0);
  const int64_t pages = policy_.kv_capacity_tokens / policy_.page_size;
  total_pages_ = free_pages_ = static_cast<int>(std::min<int64_t>(pages, 1 << 30));
}

Status NativeStepScheduler::Add(int64_t id, int num_tokens, int num_cached, double /*now*/) {
  if (num_tokens < 1 || num_cached < 0 || num_cached >= num_tokens) {
    return InvalidArgument("sequence " + std::to_string(id) + ": bad token counts");
  }
  if (PagesFor(num_tokens + 1) > total_pages_) {
    return KvCapacityExceeded(id, num_tokens, policy_);
  }
  auto [it, inserted] = seqs_.try_emplace(id);
  if (!inserted) return AlreadyExists("sequence " + std::to_string(id) + " is already queued");
  Seq& s = it->second;
  s.id = id;
  s.num_tokens = num_tokens;
  s.num_computed = num_cached;
  waiting_.push_back(&s);
  return OkStatus();
}

bool NativeStepScheduler::Grow(Seq* seq, int tokens) {
  const int need = PagesFor(tokens) - seq->num_pages;
  if (need <= 0) return true;
  if (need > free_pages_) return false;
  free_pages_ -= need;
  seq->num_pages += need;
  return true;
}

void NativeStepScheduler::Preempt(Seq* seq) {
  free_pages_ += seq->num_pages;
  seq->num_pages = 0;
  seq->num_computed = 0;
  seq->running = false;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
  ++num_preemptions_;
}

void NativeStepScheduler::Release(Seq* seq) {
  free_pages_ += seq->num_pages;
  if (seq->running)
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  else
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  seqs_.erase(seq->id);
}

SimBatch NativeStepScheduler::Schedule(double /*now*/) {
  SimBatch batch;
  int budget = policy_.max_num_batched_tokens;
  bool preempted = false;
  // 1. Decodes, oldest first; a decode that needs a page preempts the newest idle sequence.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Seq* s = running_[i];
    if (s->in_flight || s->num_tokens - s->num_computed != 1) continue;
    bool ok = Grow(s, s->num_tokens);
    while (!ok) {
      Seq* victim = nullptr;
      for (size_t j = running_.size(); j-- > i + 1;) {
        if (!running_[j]->in_flight) {
          victim = running_[j];
          break;
        }
      }
      if (victim == nullptr) break;
      Preempt(victim);
      preempted = true;
      ok = Grow(s, s->num_tokens);
    }
    if (!ok) continue;
    batch.items.push_back({s->id, s->num_computed, 1, /*decode=*/true, /*samples=*/true});
    s->in_flight = true;
    --budget;
  }
  // 2. Running sequences still prefilling (chunked prompts).
  for (Seq* s : running_) {
    const int remaining = s->num_tokens - s->num_computed;
    if (s->in_flight || remaining <= 1 || budget <= 0) continue;
    const int chunk = std::min(remaining, budget);
    if (!Grow(s, s->num_computed + chunk)) continue;
    batch.items.push_back({s->id, s->num_computed, chunk, false, chunk == remaining});
    s->in_flight = true;
    budget -= chunk;
  }
  // 3. Waiting sequences, FCFS.
  while (!preempted && !waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < policy_.max_num_seqs) {
    Seq* s = waiting_.front();
    const int remaining = s->num_tokens - s->num_computed;
    int chunk = remaining;
    if (remaining > budget) {
      if (policy_.enable_chunked_prefill) {
        chunk = budget;
      } else if (budget < policy_.max_num_batched_tokens) {
        break;  // waits for a step of its own
      }
    }
    // Admission needs the whole context's pages now and one more page of headroom for decoding.
    if (PagesFor(s->num_computed + chunk) - s->num_pages + 1 > free_pages_) break;
    Grow(s, s->num_computed + chunk);
    waiting_.pop_front();
    s->running = true;
    running_.push_back(s);
    const bool decode = remaining == 1;
    batch.items.push_back({s->id, s->num_computed, chunk, decode, chunk == remaining});
    s->in_flight = true;
    budget -= chunk;
  }
  return batch;
}

void NativeStepScheduler::Update(const SimBatch& batch, std::span<const int64_t> finished) {
  for (const BatchItem& item : batch.items) {
    auto it = seqs_.find(item.seq_id);
    if (it == seqs_.end()) continue;
    Seq& s = it->second;
    s.in_flight = false;
    s.num_computed = item.start + item.num_tokens;
    if (item.samples) ++s.num_tokens;
  }
  for (int64_t id : finished) {
    auto it = seqs_.find(id);
    if (it != seqs_.end()) Release(&it->second);
  }
}

}  // namespace pd::planner
