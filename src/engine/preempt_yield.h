// Giving the core back after an engine step, to the I/O threads it woke or was preempted by.
//
// The engine loop often shares its core with short-lived I/O threads (the HTTP thread that writes
// each token, the KV messenger, a router). Each runs for tens of microseconds when woken, with a
// short EEVDF slice so that it preempts the loop at once. But a thread that is itself preempted
// while still runnable (the HTTP thread, by the router thread its write woke) has by then run
// ahead of the loop in virtual time: it is not eligible, so the loop is picked when the CPU
// frees, and nothing picks the I/O thread again until the loop's slice ends at a scheduler tick
// (4 ms at HZ=250). Tokens pile up behind it and leave in a burst (issue #5: 2.5-4 ms gaps).
// A woken I/O thread may also fail to preempt the loop at all, for the same reason (it ran ahead
// at its previous wake-up), and wait the same way. After a step whose outputs woke such threads,
// or after being switched out involuntarily since its last check, the loop therefore calls
// sched_yield() (EEVDF: an eligible yielder gives up the rest of its slice), so a thread left
// runnable behind it runs now, and the loop resumes once those have run. When nothing else is
// runnable the yield returns at once (~1 us). Measured on the 2-core guest (issue #5, low-load
// disaggregated, 3 alternating rounds of 450 ITLs): ITL gaps > 2 ms 47 -> 0, ITL p99 3.5 -> 1.4 ms.
#pragma once

#include <cstdint>
#include <functional>

namespace pd::engine {

// The calling thread's involuntary context switches so far (getrusage RUSAGE_THREAD's
// ru_nivcsw); -1 when unavailable.
int64_t ThreadInvoluntarySwitches();

class YieldAfterPreemption {
 public:
  // `involuntary_switches`: the calling thread's count (ThreadInvoluntarySwitches in production,
  // a fake in tests; a negative value disables the yield); `yield`: sched_yield in production.
  YieldAfterPreemption(std::function<int64_t()> involuntary_switches, std::function<void()> yield);
  YieldAfterPreemption();  // the production functions

  // Yields when `delivered` (this step's outputs woke other threads) or when the count grew since
  // the previous call (or construction); returns whether it did.
  bool Check(bool delivered = false);
  int64_t yields() const { return yields_; }

 private:
  std::function<int64_t()> involuntary_switches_;
  std::function<void()> yield_;
  int64_t last_ = -1;
  int64_t yields_ = 0;
};

}  // namespace pd::engine
