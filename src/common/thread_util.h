// Thread names and CPU affinity.
// - SetCurrentThreadName names the calling thread for `top -H`, `ps -L`, perf and debuggers
//   ("pd-engine", "pd-fabric", ...). Linux keeps 15 bytes of a name; longer names are cut there.
// - ParseCpuList reads a CPU list as taskset and /sys write them ("0", "0-3", "0,2,4-5").
// - PinCurrentThread / CurrentThreadCpus set and read the calling thread's affinity; threads it
//   starts afterwards inherit it.
#pragma once

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

}  // namespace pd
