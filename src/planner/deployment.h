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

Result<std::vector<InstanceConfig>> BuildInstances(const PlannerInputs& in,
                                                   const DeploymentSpec& spec);

}  // namespace pd::planner
