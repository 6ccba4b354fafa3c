// A cap on requests in flight, taken and given back atomically: TryAcquire checks and increments
// in one compare-and-swap, so concurrent HTTP threads never admit more than the cap between them
// (a load, a check and a later increment would let each of them pass the same check).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <memory>

namespace pd::server {

class InflightCap {
 public:
  // max <= 0: no cap (every TryAcquire succeeds; the count is still kept).
  explicit InflightCap(int max) : max_(max) {}

  // One slot, or false when `max` are held.
  bool TryAcquire() {
    int held = held_.load(std::memory_order_relaxed);
    do {
      if (max_ > 0 && held >= max_) return false;
    } while (!held_.compare_exchange_weak(held, held + 1, std::memory_order_acq_rel,
                                          std::memory_order_relaxed));
    return true;
  }
  void Release() { held_.fetch_sub(1, std::memory_order_acq_rel); }
  int held() const { return held_.load(std::memory_order_relaxed); }
  int max() const { return max_; }

  // A slot held for as long as the Slot lives.
  class Slot {
   public:
    explicit Slot(InflightCap* cap) : cap_(cap) {}
    ~Slot() { cap_->Release(); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    InflightCap* cap_;
  };
  // A held slot, or null when the cap is reached.
  std::unique_ptr<Slot> TryAcquireSlot() {
    return TryAcquire() ? std::make_unique<Slot>(this) : nullptr;
  }

 private:
  const int max_;
  std::atomic<int> held_{0};
};

}  // namespace pd::server
