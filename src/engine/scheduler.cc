#include "engine/scheduler.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/check.h"

namespace pd::engine {

struct Scheduler::StepState {
  ScheduledBatch batch;
  int budget = 0;          // tokens left this step
  bool preempted = false;  // a preemption happened: admit nothing new this step
};

Scheduler::Scheduler(const SchedulerOptions& options, PagePool* pool, int page_size,
                     const Clock* clock)
    : options_(options), pool_(pool), page_size_(page_size), clock_(clock) {
  PD_CHECK(pool_ != nullptr);
  PD_CHECK(clock_ != nullptr);
  PD_CHECK(page_size_ > 0);
  PD_CHECK(options_.max_num_seqs > 0);
  PD_CHECK(options_.max_num_batched_tokens > 0);
}

Scheduler::~Scheduler() {
  for (auto& [id, seq] : seqs_) pool_->Release(seq->page_table);
}

Status Scheduler::AddSequence(int64_t id, std::vector<int32_t> prompt_ids, double arrival_time) {
  if (prompt_ids.empty()) {
    return InvalidArgument("sequence " + std::to_string(id) + ": empty prompt");
  }
  if (seqs_.count(id) != 0) {
    return AlreadyExists("sequence " + std::to_string(id) + " is already scheduled");
  }
  auto seq = std::make_unique<Sequence>();
  seq->id = id;
  seq->num_prompt_tokens = static_cast<int>(prompt_ids.size());
  seq->token_ids = std::move(prompt_ids);
  seq->arrival_time = arrival_time;
  waiting_.push_back(seq.get());
  seqs_.emplace(id, std::move(seq));
  return OkStatus();
}

bool Scheduler::Abort(int64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  Sequence* seq = it->second.get();
  pool_->Release(seq->page_table);
  if (seq->state == SeqState::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  }
  seqs_.erase(it);
  return true;
}

const Sequence* Scheduler::Find(int64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

bool Scheduler::GrowPages(Sequence* seq, int num_tokens) {
  int needed = PagesFor(num_tokens) - static_cast<int>(seq->page_table.size());
  if (needed <= 0) return true;
  auto pages = pool_->Allocate(needed);
  if (!pages.ok()) return false;
  seq->page_table.insert(seq->page_table.end(), pages->begin(), pages->end());
  return true;
}

void Scheduler::Preempt(Sequence* seq) {
  PD_CHECK(seq->state == SeqState::kRunning);
  pool_->Release(seq->page_table);
  seq->page_table.clear();
  seq->num_computed_tokens = 0;
  seq->state = SeqState::kWaiting;
  seq->num_preemptions++;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
  num_preemptions_++;
}

Sequence* Scheduler::PickVictim() { return running_.empty() ? nullptr : running_.back(); }

namespace {

void AddToBatch(ScheduledBatch* batch, const Sequence* seq, int num_new) {
  ScheduledSeq s;
  s.seq = seq;
  s.seq_id = seq->id;
  s.start_pos = seq->num_computed_tokens;
  s.num_tokens = num_new;
  s.samples = s.start_pos + num_new == seq->num_tokens();
  s.is_decode = num_new == 1 && s.samples && s.start_pos >= seq->num_prompt_tokens;
  (s.is_decode ? batch->num_decode_tokens : batch->num_prefill_tokens) += num_new;
  batch->seqs.push_back(s);
}

// Removes `id` from the batch; returns the tokens it had (0 if it was not there).
int RemoveFromBatch(ScheduledBatch* batch, int64_t id) {
  auto it = std::find_if(batch->seqs.begin(), batch->seqs.end(),
                         [id](const ScheduledSeq& s) { return s.seq_id == id; });
  if (it == batch->seqs.end()) return 0;
  int n = it->num_tokens;
  (it->is_decode ? batch->num_decode_tokens : batch->num_prefill_tokens) -= n;
  batch->seqs.erase(it);
  return n;
}

bool InBatch(const ScheduledBatch& batch, int64_t id) {
  return std::any_of(batch.seqs.begin(), batch.seqs.end(),
                     [id](const ScheduledSeq& s) { return s.seq_id == id; });
}

}  // namespace

void Scheduler::ScheduleRunning(StepState* step, bool decodes) {
  const std::vector<Sequence*> snapshot = running_;  // preemption edits running_
  for (Sequence* seq : snapshot) {
    if (step->budget <= 0) return;
    if (seq->state != SeqState::kRunning || InBatch(step->batch, seq->id)) continue;
    int remaining = seq->num_tokens() - seq->num_computed_tokens;
    PD_CHECK(remaining > 0) << "sequence " << seq->id << " has nothing to compute";
    bool is_decode = remaining == 1 && seq->num_computed_tokens >= seq->num_prompt_tokens;
    if (is_decode != decodes) continue;
    if (remaining > step->budget && !options_.enable_chunked_prefill) continue;
    int num_new = std::min(remaining, step->budget);
    bool scheduled = true;
    while (!GrowPages(seq, seq->num_computed_tokens + num_new)) {
      Sequence* victim = PickVictim();
      PD_CHECK(victim != nullptr);
      step->budget += RemoveFromBatch(&step->batch, victim->id);
      step->batch.preempted_seq_ids.push_back(victim->id);
      step->preempted = true;
      Preempt(victim);
      if (victim == seq) {
        scheduled = false;
        break;
      }
    }
    if (!scheduled) continue;
    AddToBatch(&step->batch, seq, num_new);
    step->budget -= num_new;
  }
}

void Scheduler::ScheduleWaiting(StepState* step) {
  if (step->preempted) return;
  while (!waiting_.empty() && step->budget > 0 &&
         static_cast<int>(running_.size()) < options_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    int remaining = seq->num_tokens() - seq->num_computed_tokens;
    if (remaining > step->budget && !options_.enable_chunked_prefill) return;
    int num_new = std::min(remaining, step->budget);
    if (!GrowPages(seq, seq->num_computed_tokens + num_new)) return;  // FCFS: nobody jumps ahead
    waiting_.pop_front();
    seq->state = SeqState::kRunning;
    running_.push_back(seq);
    if (seq->first_scheduled_time < 0) seq->first_scheduled_time = step->batch.time;
    AddToBatch(&step->batch, seq, num_new);
    step->budget -= num_new;
  }
}

ScheduledBatch Scheduler::Schedule() {
  StepState step;
  step.budget = options_.max_num_batched_tokens;
  step.batch.time = clock_->NowSeconds();
  ScheduleRunning(&step, /*decodes=*/true);
  ScheduleRunning(&step, /*decodes=*/false);
  ScheduleWaiting(&step);
  return std::move(step.batch);
}

void Scheduler::Update(const ScheduledBatch& batch, std::span<const SeqUpdate> updates) {
  std::unordered_map<int64_t, const SeqUpdate*> by_id;
  by_id.reserve(updates.size());
  for (const SeqUpdate& u : updates) by_id[u.seq_id] = &u;
  for (const ScheduledSeq& s : batch.seqs) {
    auto it = seqs_.find(s.seq_id);
    if (it == seqs_.end()) continue;  // aborted since Schedule
    Sequence* seq = it->second.get();
    PD_CHECK(seq->state == SeqState::kRunning && seq->num_computed_tokens == s.start_pos)
        << "sequence " << seq->id << " changed between Schedule and Update";
    seq->num_computed_tokens += s.num_tokens;
    auto u = by_id.find(s.seq_id);
    if (s.samples) {
      PD_CHECK(u != by_id.end()) << "sequence " << seq->id << " sampled but got no update";
      seq->token_ids.push_back(u->second->new_token_id);
    }
    if (u != by_id.end() && u->second->finished) Abort(seq->id);
  }
}

}  // namespace pd::engine
