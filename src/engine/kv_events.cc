#include "engine/kv_events.h"

#include <algorithm>
#include <random>

namespace pd::engine {
namespace {

uint64_t RandomEpoch() {
  std::random_device rd;
  uint64_t e = 0;
  while (e == 0) e = (uint64_t{rd()} << 32) ^ rd();  // 0 asks for a snapshot: never an epoch
  return e;
}

}  // namespace

KvEventLog::KvEventLog(const KvEventLogOptions& options)
    : options_(options), epoch_(RandomEpoch()) {}

void KvEventLog::SetFormat(uint64_t root, int page_size) {
  MutexLock lock(&mu_);
  root_ = root;
  page_size_ = page_size;
}

bool KvEventLog::Listening(std::chrono::steady_clock::time_point now) const {
  return polled_ && now - last_poll_ < std::chrono::milliseconds(options_.listener_idle_ms);
}

void KvEventLog::Record(bool stored, uint64_t key) {
  ++last_seq_;
  if (!Listening(std::chrono::steady_clock::now()) || options_.max_events == 0) {
    events_.clear();  // a listener that comes back resnapshots
    first_kept_ = last_seq_ + 1;
    return;
  }
  events_.push_back(KvEvent{last_seq_, stored, key});
  while (events_.size() > options_.max_events) {
    events_.pop_front();
    ++first_kept_;
  }
  changed_.SignalAll();
}

void KvEventLog::OnStored(uint64_t key) {
  MutexLock lock(&mu_);
  if (keys_.insert(key).second) Record(true, key);
}

void KvEventLog::OnRemoved(uint64_t key) {
  MutexLock lock(&mu_);
  if (keys_.erase(key) != 0) Record(false, key);
}

KvEventBatch KvEventLog::Poll(uint64_t epoch, uint64_t after, std::chrono::milliseconds wait,
                              size_t max_events) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  MutexLock lock(&mu_);
  last_poll_ = std::chrono::steady_clock::now();
  polled_ = true;
  KvEventBatch b;
  b.epoch = epoch_;
  b.root = root_;
  b.page_size = page_size_;
  // Incremental only when every event after `after` is still kept.
  if (epoch != epoch_ || after > last_seq_ || after + 1 < first_kept_) {
    b.snapshot = true;
    b.seq = last_seq_;
    b.keys.assign(keys_.begin(), keys_.end());
    return b;
  }
  while (last_seq_ == after && !closed_) {
    if (!changed_.WaitUntil(&mu_, deadline)) break;
  }
  if (after + 1 < first_kept_) {  // events dropped while waiting: too slow a reader
    b.snapshot = true;
    b.seq = last_seq_;
    b.keys.assign(keys_.begin(), keys_.end());
    return b;
  }
  const size_t skip = static_cast<size_t>(after + 1 - first_kept_);
  const size_t n = std::min(events_.size() - skip, std::max<size_t>(max_events, 1));
  b.events.assign(events_.begin() + skip, events_.begin() + skip + n);
  b.seq = n == 0 ? after : b.events.back().seq;
  return b;
}

void KvEventLog::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  changed_.SignalAll();
}

size_t KvEventLog::num_keys() const {
  MutexLock lock(&mu_);
  return keys_.size();
}

size_t KvEventLog::num_kept_events() const {
  MutexLock lock(&mu_);
  return events_.size();
}

}  // namespace pd::engine
