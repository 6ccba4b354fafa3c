// Replays DistServe's recorded A100 runs (data/distserve/real-a100-opt13b-sharegpt: a workloads/
// trace and the measured/ file of what the real system did with it) on the cluster simulator, with
// the deployment read off the trace's name and the recorded systems' own schedulers (vLLM v0's;
// DistServe's context stage and decoding loop), and sets the two side by side.
//
//   ASSIGN_OR_RETURN(std::vector<std::string> names, MatchTraces(dir, "vllm-*"));
//   for (const std::string& n : names) rows.push_back(ReplayTrace(setup, dir, n).value());
//   std::fputs(FormatReplayTable(rows).c_str(), stdout);
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "planner/deployment.h"
#include "planner/metrics.h"
#include "planner/setup.h"

namespace pd::planner {

struct TraceReplay {
  std::string name;
  std::string system;  // "vllm", "c21d11", "c21d12", or "distserve" (configuration not recorded)
  DeploymentSpec spec;
  bool assumed = false;  // the name does not record the configuration: c21d11 was assumed
  double rate = 0.0;     // requests per second, from the name
  size_t num_requests = 0;
  Summary simulated, measured;
};

// The traces in `distserve_dir`'s workloads/ whose names match `pattern`: "all", a name, or a
// shell glob ("distserve-c21d12-*"), sorted. NotFound when none matches.
Result<std::vector<std::string>> MatchTraces(const std::string& distserve_dir,
                                             const std::string& pattern);

// Simulates trace `name` (TraceNameOf applies) with `setup`'s latency models and SLO, and
// summarises the measured file under the same SLO.
Result<TraceReplay> ReplayTrace(const PlannerSetup& setup, const std::string& distserve_dir,
                                const std::string& name);

// A row per trace (system, rate, attainment and TTFT/TPOT p50/p90 simulated and measured, the
// attainment difference in points), then per system the median and the worst difference.
std::string FormatReplayTable(const std::vector<TraceReplay>& rows);

}  // namespace pd::planner
