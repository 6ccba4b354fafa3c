#include "engine/preempt_yield.h"

#include <sched.h>
#include <sys/resource.h>

#include <utility>

namespace pd::engine {

int64_t ThreadInvoluntarySwitches() {
  struct rusage usage {};
  if (getrusage(RUSAGE_THREAD, &usage) != 0) return -1;
  return static_cast<int64_t>(usage.ru_nivcsw);
}

YieldAfterPreemption::YieldAfterPreemption(std::function<int64_t()> involuntary_switches,
                                           std::function<void()> yield)
    : involuntary_switches_(std::move(involuntary_switches)), yield_(std::move(yield)) {
  last_ = involuntary_switches_();
}

YieldAfterPreemption::YieldAfterPreemption()
    : YieldAfterPreemption(ThreadInvoluntarySwitches, [] { sched_yield(); }) {}

bool YieldAfterPreemption::Check(bool delivered) {
  const int64_t now = involuntary_switches_();
  const bool preempted = now >= 0 && last_ >= 0 && now > last_;
  if (preempted || delivered) {
    yield_();
    ++yields_;
    // The yield itself may count as a switch: read again so that it does not trigger the next.
    last_ = involuntary_switches_();
  } else {
    last_ = now;
  }
  return preempted || delivered;
}

}  // namespace pd::engine
