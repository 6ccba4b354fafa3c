#include "engine/layer_progress.h"

#include <chrono>

namespace pd::engine {

void LayerProgress::Bump() {
  {
    MutexLock lock(&mu_);
    value_.fetch_add(1, std::memory_order_acq_rel);
    if (on_bump_) on_bump_();
  }
  cv_.SignalAll();
}

void LayerProgress::SetListener(std::function<void()> on_bump) const {
  MutexLock lock(&mu_);
  on_bump_ = std::move(on_bump);
}

bool LayerProgress::WaitAtLeast(uint64_t target, int64_t timeout_ms) const {
  if (Value() >= target) return true;
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Value() < target) {
    if (!cv_.WaitUntil(&mu_, deadline)) return Value() >= target;
  }
  return true;
}

}  // namespace pd::engine
