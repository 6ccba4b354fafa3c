// `pdserve validate-sim`'s probes through a running `pdserve up` deployment: idle TTFT probes at
// three prompt lengths (with the prefill instance's compute-thread time), decode probes at batch
// 1 and 8, the bench client's and router's CPU per workload request, and co-run pairs (how much
// each instance's compute slows while the other computes). Their medians over several probe sets
// calibrate the latency model (SolveOverheads).
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "bench/client.h"
#include "common/status.h"
#include "planner/latency_model.h"
#include "planner/validate.h"
#include "planner/validate_sim.h"

namespace pd::planner {

// A thread's CPU time from the kernel's scheduler statistics (/proc/PID/task/TID/schedstat).
struct CpuTimes {
  double run_s = 0.0;   // on a CPU
  double wait_s = 0.0;  // runnable, waiting on a run queue
};
// Per thread of process `pid`; NotFound when the process is gone or has no schedstat.
using ThreadCpuTimes = std::map<pid_t, CpuTimes>;
Result<ThreadCpuTimes> ProcessThreadCpuTimes(pid_t pid);
// Run and wait time between two readings of the thread that ran longest (an instance's compute
// thread, on its core and waiting for it); zero with no thread.
CpuTimes BusiestThreadTimes(const ThreadCpuTimes& before, const ThreadCpuTimes& after);

// The processes of the deployment `pdserve up` (pid `up`, which also runs the router) started.
struct Deployment {
  pid_t up = -1, prefill = -1, decode = -1;
};
// Its children by their `--role`; NotFound when `up` has no prefill or decode child.
Result<Deployment> FindInstances(pid_t up);

struct ProbeSet {
  std::vector<IdleProbe> ttft;      // prompts of 16, input_len and 2 input_len tokens
  std::vector<DecodeProbe> decode;  // batch 1 (mean prompt), then 8 (16-token prompts)
  double client_cpu_s = 0;          // the bench client's and router's CPU per decode probe
  // Per co-run pair, busy over alone compute CPU: the decode instance's while the prefill one
  // computes, and the prefill instance's while the decode one does.
  std::vector<double> corun_decode, corun_prefill;
};
// `set` salts the probes' prompts (each set its own).
Result<ProbeSet> RunProbes(const ValidateSimOptions& o, const StepCoeffs& model,
                           const Deployment& dep, int set);

// The calibration from probe sets: each probe's median over the sets, the co-run pairs pooled.
struct ProbeCalibration {
  RealOverheads overheads;
  double idle_ttft_s = 0, idle_tpot_s = 0, batch_tpot_s = 0;  // mean prompt; batch 1; batch 8
  double client_cpu_s = 0;  // the bench client's and router's CPU per request of the workload
};
Result<ProbeCalibration> CombineProbes(const std::vector<ProbeSet>& sets);

}  // namespace pd::planner
