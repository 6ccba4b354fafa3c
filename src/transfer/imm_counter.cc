#include "transfer/imm_counter.h"

#include <algorithm>
#include <chrono>

namespace pd::transfer {

bool ImmWaiter::reached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reached_;
}

uint64_t ImmWaiter::received() const {
  std::lock_guard<std::mutex> lock(mu_);
  return received_;
}

bool ImmWaiter::WaitFor(double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return reached_; });
}

// The callback runs before the waiter reports the count reached, so whoever sees reached() or
// returns from WaitFor also sees everything the callback did.
void ImmCounterTable::Fire(Entry& entry) {
  if (entry.callback) entry.callback();
  {
    std::lock_guard<std::mutex> lock(entry.waiter->mu_);
    entry.waiter->received_ = entry.received;
    entry.waiter->reached_ = true;
  }
  entry.waiter->cv_.notify_all();
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
    std::lock_guard<std::mutex> lock(mu_);
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
      entry.waiter->received_ = entry.received;
      active_.emplace(imm, std::move(entry));
      return waiter;
    }
  }
  Fire(entry);  // every expected write had already landed
  return waiter;
}

bool ImmCounterTable::Remove(uint32_t imm) {
  std::lock_guard<std::mutex> lock(mu_);
  bool removed = active_.erase(imm) != 0;
  removed = unclaimed_.erase(imm) != 0 || removed;
  return removed;
}

void ImmCounterTable::OnArrival(uint32_t imm) {
  Entry done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = active_.find(imm);
    if (it == active_.end()) {
      ++unclaimed_[imm];
      return;
    }
    Entry& entry = it->second;
    ++entry.received;
    if (entry.received < entry.expected) {
      std::lock_guard<std::mutex> wlock(entry.waiter->mu_);
      entry.waiter->received_ = entry.received;
      return;
    }
    done = std::move(entry);
    active_.erase(it);
  }
  Fire(done);  // outside the table lock: the callback may call Expect or Remove
}

size_t ImmCounterTable::num_active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_.size();
}

uint64_t ImmCounterTable::unclaimed(uint32_t imm) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = unclaimed_.find(imm);
  return it == unclaimed_.end() ? 0 : it->second;
}

}  // namespace pd::transfer
