// How much CPU contention stretched a process's work, read from the kernel's scheduler statistics
// (/proc/PID/task/TID/schedstat: nanoseconds on a CPU, nanoseconds runnable but waiting for one).
// `pdserve validate-sim` uses it to measure what the simulator cannot know: how much of each
// instance's time went to waiting for a core that other processes (the bench client, the router,
// anything else on the machine) held.
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
// The step-time stretch between two readings: (run + wait) / run, 1 when nothing ran.
double Stretch(const CpuTimes& before, const CpuTimes& after);
// The stretch of the threads that did the work between two readings of one process: those whose
// run time grew by at least `busy_share` of the busiest thread's (an instance's compute threads,
// not its mostly idle HTTP and fabric threads, whose short runs wait proportionally longer).
double BusyThreadsStretch(const ThreadCpuTimes& before, const ThreadCpuTimes& after,
                          double busy_share = 0.25);
// Run time between two readings of every thread but the busiest (an instance's compute thread):
// what its HTTP, fabric and messenger threads took from its cores. 0 with no thread.
double OtherThreadsRunSeconds(const ThreadCpuTimes& before, const ThreadCpuTimes& after);
// Run time between two readings of the busiest thread alone (0 with no thread).
double BusiestThreadRunSeconds(const ThreadCpuTimes& before, const ThreadCpuTimes& after);
// Run and wait time between two readings of the thread that ran longest (zero with no thread):
// an instance's compute thread, on its core and runnable but waiting for it.
CpuTimes BusiestThreadTimes(const ThreadCpuTimes& before, const ThreadCpuTimes& after);
// CPU seconds (user + system) process `pid` has used so far (/proc/PID/stat); 0 when unreadable.
double ProcessCpuSeconds(pid_t pid);
// Live processes whose parent is `ppid`, with their NUL-separated argv.
struct ChildProcess {
  pid_t pid = 0;
  std::string cmdline;
};
std::vector<ChildProcess> ChildrenOf(pid_t ppid);

}  // namespace pd::planner
