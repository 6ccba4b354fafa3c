// Polling for work before sleeping, for a thread that owns a dedicated core.
//
// A thread that sleeps on a condition variable is woken through the kernel; when its core has gone
// idle meanwhile, the core itself must be woken too. On the KVM guests pdserve is measured on
// (haltpoll.guest_halt_poll_ns=0) an idle vCPU halts and wakes through the host: 70-120 us
// between the notify and the thread running, against ~0.5 us for a thread spinning on a flag. A
// loop whose core nothing else uses can therefore spin for a while on an atomic "work arrived"
// flag before it sleeps: PollForFlag. It executes a pause instruction between checks (no memory
// traffic but the flag's line) and gives the core away now and then (sched_yield), so that a
// thread woken onto the same core is not kept waiting behind the spin.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

namespace pd::engine {

struct IdlePollOptions {
  int64_t budget_ns = 0;            // spin at most this long (<= 0: return at once)
  int checks_per_clock_read = 64;   // flag checks (one pause each) between two reads of the clock
  int64_t yield_every_ns = 50'000;  // sched_yield() at most this often (<= 0: never)
};

struct IdlePollResult {
  bool flag_seen = false;  // the flag was set before the budget ran out
  int64_t clock_reads = 0;
  int64_t yields = 0;
};

// Spins until `flag` reads true (acquire) or `now_ns()` has moved budget_ns past its first
// reading. now_ns is any monotonic nanosecond clock (SteadyNowNs in production, a fake in tests).
IdlePollResult PollForFlag(const std::atomic<bool>& flag, const IdlePollOptions& options,
                           const std::function<int64_t()>& now_ns);

int64_t SteadyNowNs();  // CLOCK_MONOTONIC, as std::chrono::steady_clock

// Whether a loop pinned to compute_cpus has them to itself as far as this process is concerned:
// both lists given (an empty one means "any CPU") and no CPU in both. Idle polling is only for
// such loops: spinning on a core that I/O threads share would take their cycles.
bool ComputeCpusAreDedicated(const std::vector<int>& compute_cpus, const std::vector<int>& io_cpus);

}  // namespace pd::engine
