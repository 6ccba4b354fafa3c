#include "engine/idle_poll.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

namespace pd::engine {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool ComputeCpusAreDedicated(const std::vector<int>& compute_cpus,
                             const std::vector<int>& io_cpus) {
  if (compute_cpus.empty() || io_cpus.empty()) return false;
  for (int c : compute_cpus) {
    if (std::find(io_cpus.begin(), io_cpus.end(), c) != io_cpus.end()) return false;
  }
  return true;
}

IdlePollResult PollForFlag(const std::atomic<bool>& flag, const IdlePollOptions& options,
                           const std::function<int64_t()>& now_ns) {
  IdlePollResult r;
  if (flag.load(std::memory_order_acquire)) {
    r.flag_seen = true;
    return r;
  }
  if (options.budget_ns <= 0) return r;
  const int checks = options.checks_per_clock_read > 0 ? options.checks_per_clock_read : 1;
  const int64_t start = now_ns();
  ++r.clock_reads;
  int64_t last_yield = start;
  while (true) {
    for (int i = 0; i < checks; ++i) {
      if (flag.load(std::memory_order_acquire)) {
        r.flag_seen = true;
        return r;
      }
      CpuRelax();
    }
    const int64_t now = now_ns();
    ++r.clock_reads;
    if (now - start >= options.budget_ns) break;
    if (options.yield_every_ns > 0 && now - last_yield >= options.yield_every_ns) {
      sched_yield();
      ++r.yields;
      last_yield = now;
    }
  }
  r.flag_seen = flag.load(std::memory_order_acquire);
  return r;
}

}  // namespace pd::engine
