// Thread names and CPU affinity.
// - SetCurrentThreadName names the calling thread for `top -H`, `ps -L`, perf and debuggers
//   ("pd-engine", "pd-fabric", ...). Linux keeps 15 bytes of a name; longer names are cut there.
// - ParseCpuList reads a CPU list as taskset and /sys write them ("0", "0-3", "0,2,4-5").
// - PinCurrentThread / CurrentThreadCpus set and read the calling thread's affinity; threads it
//   starts afterwards inherit it.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pd {

void SetCurrentThreadName(std::string_view name);

// CPUs in ascending order without repeats; InvalidArgument names what was wrong (empty list,
// a non-number, a reversed range, a CPU at or beyond 1024).
Result<std::vector<int>> ParseCpuList(std::string_view list);

Status PinCurrentThread(const std::vector<int>& cpus);
std::vector<int> CurrentThreadCpus();

// For threads that sleep most of the time and must run as soon as they are woken (HTTP, KV
// messenger threads): asks the kernel's fair scheduler (EEVDF, Linux 6.6+) for a short time slice
// (sched_setattr's sched_runtime, SCHED_OTHER, nice unchanged), so that on wake-up the thread
// preempts a CPU-bound thread with the default slice (about 1-3 ms) instead of waiting for that
// slice to end. Not always: such a thread that is itself preempted while still runnable, or woken
// when it has run ahead of the CPU-bound one in virtual time, is not eligible and waits until
// that thread's slice ends at a tick, which is why the engine loop yields after its steps
// (engine/preempt_yield.h). Best effort: kernels without custom slices ignore the value or refuse
// it (an error Status the caller may log and ignore). The default slice: kLatencySliceNs.
inline constexpr int64_t kLatencySliceNs = 100'000;
Status SetCurrentThreadLatencySensitive(int64_t slice_ns = kLatencySliceNs);
int64_t CurrentThreadSliceNs();  // the calling thread's sched_runtime (0: default), -1 on error

}  // namespace pd
