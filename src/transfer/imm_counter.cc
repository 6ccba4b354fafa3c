#include "transfer/imm_counter.h"

#include <algorithm>
#include <chrono>

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

Result<std::shared_ptr<const ImmWaiter>> ImmCounterTable::Expect(uint32_t imm, uint64_t count,
                                                                 Callback callback) {
  if (count == 0) return InvalidArgument("imm counter " + std::to_string(imm) + ": count 0");
  Entry entry;
  entry.expected = count;
  entry.callback = std::move(callback);
  entry.waiter = std::make_shared<ImmWaiter>();
  std::shared_ptr<const ImmWaiter> waiter = entry.waiter;
  {
    MutexLock lock(&mu_);
    if (active_.count(imm) != 0) {
      return AlreadyExists("imm counter " + std::to_string(imm) + " is already active");
    }
    auto it = unclaimed_.find(imm);
    if (it != unclaimed_.end()) {
      uint64_t take = std::min(it->second, count);
      entry.received = take;
      it->second -= take;
      if (it->second == 0) unclaimed_.erase(it);
    }
    if (entry.received < entry.expected) {
      SetReceived(entry.waiter.get(), entry.received);
      active_.emplace(imm, std::move(entry));
      return waiter;
    }
  }
  Fire(entry);  // every expected write had already landed
  return waiter;
}

bool ImmCounterTable::Remove(uint32_t imm) {
  MutexLock lock(&mu_);
  bool removed = active_.erase(imm) != 0;
  removed = unclaimed_.erase(imm) != 0 || removed;
  return removed;
}

void ImmCounterTable::OnArrival(uint32_t imm) {
  Entry done;
  {
    MutexLock lock(&mu_);
    auto it = active_.find(imm);
    if (it == active_.end()) {
      ++unclaimed_[imm];
      return;
    }
    Entry& entry = it->second;
    ++entry.received;
    if (entry.received < entry.expected) {
      SetReceived(entry.waiter.get(), entry.received);
      return;
    }
    done = std::move(entry);
    active_.erase(it);
  }
  Fire(done);  // outside the table lock: the callback may call Expect or Remove
}

size_t ImmCounterTable::num_active() const {
  MutexLock lock(&mu_);
  return active_.size();
}

uint64_t ImmCounterTable::unclaimed(uint32_t imm) const {
  MutexLock lock(&mu_);
  auto it = unclaimed_.find(imm);
  return it == unclaimed_.end() ? 0 : it->second;
}

}  // namespace pd::transfer
