#include "engine/layer_progress.h"

#include <chrono>

namespace pd::engine {

void LayerProgress::Bump() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    value_.fetch_add(1, std::memory_order_acq_rel);
    if (on_bump_) on_bump_();
  }
  cv_.notify_all();
}

void LayerProgress::SetListener(std::function<void()> on_bump) const {
  std::lock_guard<std::mutex> lock(mu_);
  on_bump_ = std::move(on_bump);
}

bool LayerProgress::WaitAtLeast(uint64_t target, int64_t timeout_ms) const {
  if (Value() >= target) return true;
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                      [&] { return Value() >= target; });
}

}  // namespace pd::engine
