#include "transfer/imm_counter.h"

#include <algorithm>
#include <chrono>

#include "common/rate_limited_log.h"

namespace pd::transfer {

bool ImmWaiter::reached() const {
  MutexLock lock(&mu_);
  return reached_;
}

uint64_t ImmWaiter::received() const {
  MutexLock lock(&mu_);
  return received_;
}

bool ImmWaiter::WaitFor(double timeout_s) const {
  MutexLock lock(&mu_);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::ceil<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
  while (!reached_) {
    if (!cv_.WaitUntil(&mu_, deadline)) break;
  }
  return reached_;
}

// The callback runs before the waiter reports the count reached, so whoever sees reached() or
// returns from WaitFor also sees everything the callback did.
void ImmCounterTable::Fire(Entry& entry) {
  if (entry.callback) entry.callback();
  ImmWaiter* waiter = entry.waiter.get();
  {
    MutexLock lock(&waiter->mu_);
    waiter->received_ = entry.received;
    waiter->reached_ = true;
  }
  waiter->cv_.SignalAll();
}

void ImmCounterTable::SetReceived(ImmWaiter* waiter, uint64_t received) {
  MutexLock lock(&waiter->mu_);
  waiter->received_ = received;
}

ImmCounterTable::ImmCounterTable(Options options)
    : options_(options), clock_(options.clock != nullptr ? *options.clock : SystemClock::Get()) {}

uint64_t ImmCounterTable::ExpireOld(double now_s) {
  uint64_t dropped = 0;
  while (!unclaimed_order_.empty()) {
    auto it = unclaimed_.find(unclaimed_order_.front());
    if (now_s - it->second.first_arrival_s < options_.unclaimed_ttl_s) break;
    dropped += DropOldest();
  }
  return dropped;
}

uint64_t ImmCounterTable::DropOldest() {
  auto it = unclaimed_.find(unclaimed_order_.front());
  const uint64_t count = it->second.count;
  EraseUnclaimed(it);
  expired_arrivals_ += count;
  return count;
}

void ImmCounterTable::EraseUnclaimed(std::unordered_map<uint32_t, Unclaimed>::iterator it) {
  unclaimed_order_.erase(it->second.order);
  unclaimed_.erase(it);
}

void ImmCounterTable::ReportExpired(uint64_t arrivals, size_t kept) {
  if (arrivals == 0) return;
  PD_LOG_WARN_EVERY_N_SEC(10.0, "imm",
                          "imm counters: dropped {} write(s) carrying an imm nobody "
                          "expected ({} imm value(s) still kept)",
                          arrivals, kept);
}

Result<std::shared_ptr<const ImmWaiter>> ImmCounterTable::Expect(uint32_t imm, uint64_t count,
                                                                 Callback callback) {
  if (count == 0) return InvalidArgument("imm counter " + std::to_string(imm) + ": count 0");
  Entry entry;
  entry.expected = count;
  entry.callback = std::move(callback);
  entry.waiter = std::make_shared<ImmWaiter>();
  std::shared_ptr<const ImmWaiter> waiter = entry.waiter;
  const double now_s = clock_.NowSeconds();
  uint64_t expired = 0;
  size_t kept = 0;
  bool reached = false;
  {
    MutexLock lock(&mu_);
    if (active_.count(imm) != 0) {
      return AlreadyExists("imm counter " + std::to_string(imm) + " is already active");
    }
    expired = ExpireOld(now_s);
    kept = unclaimed_.size();
    auto it = unclaimed_.find(imm);
    if (it != unclaimed_.end()) {
      uint64_t take = std::min(it->second.count, count);
      entry.received = take;
      it->second.count -= take;
      if (it->second.count == 0) EraseUnclaimed(it);
    }
    reached = entry.received >= entry.expected;
    if (!reached) {
      SetReceived(entry.waiter.get(), entry.received);
      active_.emplace(imm, std::move(entry));
    }
  }
  ReportExpired(expired, kept);
  if (reached) Fire(entry);  // every expected write had already landed
  return waiter;
}

bool ImmCounterTable::Remove(uint32_t imm) {
  MutexLock lock(&mu_);
  bool removed = active_.erase(imm) != 0;
  auto it = unclaimed_.find(imm);
  if (it != unclaimed_.end()) {
    EraseUnclaimed(it);
    removed = true;
  }
  return removed;
}

void ImmCounterTable::OnArrival(uint32_t imm) {
  Entry done;
  uint64_t expired = 0;
  size_t kept = 0;
  {
    MutexLock lock(&mu_);
    auto it = active_.find(imm);
    if (it == active_.end()) {
      expired = KeepUnclaimed(imm, clock_.NowSeconds());
      kept = unclaimed_.size();
    } else {
      Entry& entry = it->second;
      ++entry.received;
      if (entry.received < entry.expected) {
        SetReceived(entry.waiter.get(), entry.received);
        return;
      }
      done = std::move(entry);
      active_.erase(it);
    }
  }
  if (done.waiter) {
    Fire(done);  // outside the table lock: the callback may call Expect or Remove
  } else {
    ReportExpired(expired, kept);
  }
}

// An arrival for an imm without a counter: kept for a counter registered later, within bounds.
uint64_t ImmCounterTable::KeepUnclaimed(uint32_t imm, double now_s) {
  uint64_t expired = ExpireOld(now_s);
  auto it = unclaimed_.find(imm);
  if (it != unclaimed_.end()) {
    ++it->second.count;
    return expired;
  }
  if (options_.max_unclaimed_imms == 0) {
    ++expired_arrivals_;
    return expired + 1;
  }
  if (unclaimed_.size() >= options_.max_unclaimed_imms) expired += DropOldest();
  unclaimed_order_.push_back(imm);
  unclaimed_.emplace(imm, Unclaimed{1, now_s, std::prev(unclaimed_order_.end())});
  return expired;
}

size_t ImmCounterTable::num_unclaimed_imms() const {
  MutexLock lock(&mu_);
  return unclaimed_.size();
}

uint64_t ImmCounterTable::expired_arrivals() const {
  MutexLock lock(&mu_);
  return expired_arrivals_;
}

size_t ImmCounterTable::num_active() const {
  MutexLock lock(&mu_);
  return active_.size();
}

uint64_t ImmCounterTable::unclaimed(uint32_t imm) const {
  MutexLock lock(&mu_);
  auto it = unclaimed_.find(imm);
  return it == unclaimed_.end() ? 0 : it->second.count;
}

}  // namespace pd::transfer
