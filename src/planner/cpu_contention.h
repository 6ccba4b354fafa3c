// The CPU time of processes and their threads from the kernel's scheduler statistics
// (/proc/PID/task/TID/schedstat: nanoseconds on a CPU, nanoseconds runnable but waiting for one),
// and a process's children: how `pdserve validate-sim` measures the instances it runs.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace pd::planner {

struct CpuTimes {
  double run_s = 0.0;   // on a CPU
  double wait_s = 0.0;  // runnable, waiting on a run queue
};

// One schedstat line ("RUN_NS WAIT_NS SLICES"). InvalidArgument when it is not one.
Result<CpuTimes> ParseSchedstat(const std::string& text);
// Per thread (by thread id) of process `pid`. NotFound when the process is gone or the kernel has
// no schedstat.
using ThreadCpuTimes = std::map<pid_t, CpuTimes>;
Result<ThreadCpuTimes> ProcessThreadCpuTimes(pid_t pid);
// Summed over every thread of process `pid` (threads that exited are not counted).
Result<CpuTimes> ProcessCpuTimes(pid_t pid);
// Run and wait time between two readings of the thread that ran longest (zero with no thread):
// an instance's compute thread, on its core and runnable but waiting for it.
CpuTimes BusiestThreadTimes(const ThreadCpuTimes& before, const ThreadCpuTimes& after);
// Live processes whose parent is `ppid`, with their NUL-separated argv.
struct ChildProcess {
  pid_t pid = 0;
  std::string cmdline;
};
std::vector<ChildProcess> ChildrenOf(pid_t ppid);

}  // namespace pd::planner
