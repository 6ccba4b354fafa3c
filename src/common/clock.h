// Clocks. Code that schedules by time takes a Clock& so tests and the planner's simulator can
// drive it (SimClock) while the server uses the steady clock (SystemClock).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace pd {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time in seconds since an arbitrary epoch.
  virtual double NowSeconds() const = 0;
};

class SystemClock final : public Clock {
 public:
  double NowSeconds() const override {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
  }
  static SystemClock& Get() {
    static SystemClock clock;
    return clock;
  }
};

// A clock that moves only when told. Thread safety: Advance/Set may race with NowSeconds.
class SimClock final : public Clock {
 public:
  double NowSeconds() const override { return now_.load(std::memory_order_acquire); }
  void Set(double seconds) { now_.store(seconds, std::memory_order_release); }
  void Advance(double seconds) { Set(NowSeconds() + seconds); }

 private:
  std::atomic<double> now_{0.0};
};

}  // namespace pd
