#include "planner/distserve_decode.h"

#include <algorithm>

#include "common/check.h"

namespace pd::planner {

DistServeDecodeLoop::DistServeDecodeLoop(const DecodeLoopOptions& options, DecodeLoopHost* host)
    : opt_(options), host_(host), slots_(std::max(1, options.pp)) {
  PD_CHECK(opt_.page_size > 0 && host_ != nullptr);
  opt_.pp = std::max(1, opt_.pp);
  total_blocks_ = opt_.kv_capacity_tokens / opt_.page_size;
}

void DistServeDecodeLoop::Next(Phase phase, double when) {
  phase_ = phase;
  host_->WakeLoopAt(opt_.instance, when);
}

int64_t DistServeDecodeLoop::BlocksHeld() const {
  int64_t blocks = 0;
  for (const auto& slot : slots_)
    for (const Seq& s : slot) blocks += BlocksFor(s.tokens);
  for (const Seq& s : waiting_) blocks += BlocksFor(s.tokens);
  return blocks;
}

void DistServeDecodeLoop::HandOver(double now, int64_t req, int prompt_len) {
  // The prompt's first token came from the prefill instance: the first step here computes it.
  unaccepted_.push_back({req, prompt_len + 1});
  ++num_seqs_;
  if (phase_ == Phase::kIdle) Next(Phase::kAccept, now);
}

void DistServeDecodeLoop::Wake(double now) {
  switch (phase_) {
    case Phase::kIdle:
      return;
    case Phase::kTurn:
      Turn(now);
      return;
    case Phase::kCheckFull:
      if (static_cast<int>(pipeline_.size()) < opt_.pp) break;
      if (pipeline_.front().slot < 0) {
        pipeline_.pop_front();
        break;
      }
      if (pipeline_.front().done_s > now) {
        Next(Phase::kCollect, pipeline_.front().done_s);
        return;
      }
      Collect(now);
      break;
    case Phase::kCollect:
      Collect(now);
      break;
    case Phase::kAccept:
      break;
    case Phase::kMigrated:
      host_->OnMigrated(opt_.instance, now, unaccepted_.front().id);
      waiting_.push_back(unaccepted_.front());
      unaccepted_.pop_front();
      break;
  }
  Accept(now);
}

void DistServeDecodeLoop::Admit(std::vector<Seq>& slot) {
  while (!swapped_.empty() || !waiting_.empty()) {
    std::deque<Seq>& from = swapped_.empty() ? waiting_ : swapped_;
    const Seq s = from.front();
    // A waiting sequence's blocks are already counted; a swapped one's come back.
    const int64_t extra = &from == &swapped_ ? BlocksFor(s.tokens) : 0;
    if (static_cast<int>(slot.size()) >= opt_.max_batch_size ||
        BlocksHeld() + extra > total_blocks_) {
      break;
    }
    slot.push_back(s);
    from.pop_front();
  }
}

void DistServeDecodeLoop::Turn(double now) {
  cur_ = (cur_ + 1) % opt_.pp;
  std::vector<Seq>& slot = slots_[cur_];
  while (BlocksHeld() > total_blocks_ && !slot.empty()) {
    swapped_.push_back(slot.back());
    slot.pop_back();
  }
  Admit(slot);
  if (slot.empty()) {
    pipeline_.push_back({-1, now});
    Next(Phase::kCheckFull, now + kEmptyTurnSeconds);
    return;
  }
  StepShape shape;
  shape.decode_seqs = static_cast<int>(slot.size());
  for (const Seq& s : slot) shape.decode_context += s.tokens;
  const double start = std::max(now, stage_free_s_);
  const LoopStep step = host_->OnLaunch(opt_.instance, start, shape);
  stage_free_s_ = start + step.times.stage_s;
  // Micro-batches leave the pipeline in the order they entered it.
  last_done_s_ = std::max(start + step.times.step_s, last_done_s_);
  pipeline_.push_back({cur_, last_done_s_});
  Next(Phase::kCheckFull, now + step.launch_s);
}

void DistServeDecodeLoop::Collect(double now) {
  const int slot_index = pipeline_.front().slot;
  pipeline_.pop_front();
  std::vector<Seq>& slot = slots_[slot_index];
  std::vector<Seq> kept;
  kept.reserve(slot.size());
  for (Seq& s : slot) {
    if (host_->OnLoopToken(opt_.instance, now, s.id)) {
      --num_seqs_;
    } else {
      ++s.tokens;
      kept.push_back(s);
    }
  }
  slot = std::move(kept);
}

void DistServeDecodeLoop::Accept(double now) {
  if (!unaccepted_.empty()) {
    int64_t waiting_blocks = 0;
    for (const Seq& s : waiting_) waiting_blocks += BlocksFor(s.tokens);
    const Seq& s = unaccepted_.front();
    if (waiting_blocks < kWaitingBlockShare * total_blocks_ &&
        BlocksFor(s.tokens) <= total_blocks_ - BlocksHeld()) {
      // The migration runs on the workers after the micro-batch they are running.
      double busy = now;
      for (const Launched& l : pipeline_)
        if (l.slot >= 0) busy = std::max(busy, l.done_s);
      Next(Phase::kMigrated, busy + host_->MigrationSeconds(opt_.instance, s.id));
      return;
    }
  }
  bool work = !waiting_.empty() || !swapped_.empty();
  for (const auto& slot : slots_) work = work || !slot.empty();
  for (const Launched& l : pipeline_) work = work || l.slot >= 0;
  if (!work) {
    // Nothing to decode, and nothing handed over that fits: wait for the next hand-over.
    pipeline_.clear();
    phase_ = Phase::kIdle;
    return;
  }
  Next(Phase::kTurn, now);
}

}  // namespace pd::planner
