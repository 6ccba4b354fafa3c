// How far the forward pass has got, layer by layer, for the threads that stream a layer's KV
// pages as soon as that layer is final (the prefill messenger).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "common/mutex.h"

namespace pd::engine {

// Counts finished layers across steps: after step s (0-based, counted by this runner) finishes
// layer l's attention output projection, Value() >= s*num_layers + l + 1. Another thread waits on
// it to stream that layer's KV pages. Thread safety: any thread.
class LayerProgress {
 public:
  uint64_t Value() const { return value_.load(std::memory_order_acquire); }
  void Bump() EXCLUDES(mu_);
  // True once Value() >= target; false if timeout_ms passes first.
  bool WaitAtLeast(uint64_t target, int64_t timeout_ms) const EXCLUDES(mu_);
  // Called on the bumping thread after every Bump (nullptr: none), so a thread that waits for
  // other events too (the prefill messenger's task queue) wakes at a bump without polling. It
  // must be quick and must not call back into this object.
  void SetListener(std::function<void()> on_bump) const EXCLUDES(mu_);

 private:
  std::atomic<uint64_t> value_{0};
  mutable Mutex mu_;
  mutable CondVar cv_;
  // An observer, not part of the value.
  mutable std::function<void()> on_bump_ GUARDED_BY(mu_);
};

}  // namespace pd::engine
