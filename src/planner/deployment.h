// A concrete deployment to simulate: instance counts, roles and parallelism, from a plan JSON,
// from DistServe's trace names, or from command-line flags.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "planner/search.h"

namespace pd::planner {

struct DeploymentSpec {
  bool disaggregated = false;
  bool chunked_prefill = false;  // colocated only
  ParallelConfig colocated, prefill, decode;
  int num_colocated = 1, num_prefill = 1, num_decode = 1;
  bool same_node = false;  // all instances on one node (KV over NVLink); else packed by devices
  std::string Describe() const;
};

// "TPxPP" or "TP" (PP 1), e.g. "2x1".
Result<ParallelConfig> ParseParallel(const std::string& text);
// The "plan" (or a given key's) object of a pdserve-plan-v1 JSON.
Result<DeploymentSpec> ParsePlanJson(const std::string& json_text, const std::string& source);
// DistServe's trace names: "vllm-N-RATE" is one colocated TP1 instance; "distserve-cTPPP-dTPPP-…"
// a prefill and a decode instance on one node; plain "distserve-N-RATE" does not record its
// configuration and is taken as c21d11 (`assumed` is set).
Result<DeploymentSpec> DeploymentFromTraceName(const std::string& name, bool* assumed);
// The trace name in what a user typed: a name, or a path to the workloads/ file. Only a final
// ".json" is taken off, never another dot: "distserve-c21d11-300-4.5" names a rate of 4.5.
std::string TraceNameOf(const std::string& name_or_path);

// What `pdserve up --plan FILE` can start on this machine: one process per instance, prefill and
// decode roles only, no pipeline parallelism.
struct LocalPlan {
  int num_prefill = 1;
  int num_decode = 1;
  int prefill_tp = 1;
  int decode_tp = 1;
  int threads = 0;  // compute threads per instance from the plan's "threads" (0: not given)
};
struct LocalLimits {
  int cores = 0;           // CPU cores of this machine (0: unknown, not checked)
  bool engine_tp = false;  // `serve` takes --tensor-parallel-size
  bool pin_cores = false;  // one core per instance: then instances must not outnumber cores
};
// Validates a pdserve-plan-v1 "plan" for a local deployment. InvalidArgument, saying why and what
// to do instead, for a colocated plan, PP > 1, TP > 1 without engine TP, a non-positive
// "threads", or (pinned) more instances than cores.
Result<LocalPlan> LocalPlanFromJson(const std::string& json_text, const std::string& source,
                                    const LocalLimits& limits);

Result<std::vector<InstanceConfig>> BuildInstances(const PlannerInputs& in,
                                                   const DeploymentSpec& spec);

}  // namespace pd::planner
