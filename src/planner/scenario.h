// The DeepSeek-R1 deployment comparison of docs/planner.md ("DeepSeek-R1 on H200 nodes"): one
// long-prompt chat workload simulated on colocated TP8 nodes, on 1 prefill : 3 decode TP8 nodes,
// and on data-parallel (DP8) decode nodes, each at the same request rate per decode node.
//
// A DP8 decode node is 8 decode instances of TP1, each a data-parallel attention rank with its
// own requests and latent KV, that share the node's MoE layers (MoeParallelism::dp = 8): each
// rank holds the non-expert weights and 1/8 of the routed experts, reads per step the experts
// that 8 times its own batch activates, and pays the expert-parallel all-to-all. The simulator
// steps the 8 ranks independently, where the real ranks step together (the slowest rank's
// batch sets the node's pace).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/metrics.h"
#include "planner/workload.h"

namespace pd::planner {

struct R1ScenarioOptions {
  std::string model = "deepseek-r1";
  std::string hardware = "h200-141gb";
  // Prompt and output lengths: uniform over [mean/2, 3·mean/2].
  int prompt_mean = 4096;
  int output_mean = 1024;
  double rate_per_decode_node = 1.0;  // req/s per decode node (colocated: per node)
  double duration_s = 300.0;          // arrival span of each simulation (Poisson arrivals)
  uint64_t seed = 1;
  Slo slo = {2.0, 0.02};  // attainment column: TTFT 2 s, 50 tokens/s per user
};

struct R1ScenarioRow {
  std::string deployment;
  int nodes = 0;
  double rate = 0.0;  // req/s offered to the whole deployment
  double rate_per_decode_node = 0.0;
  Summary summary;
};

// Uniform lengths around the means (`count` pairs, reproducible from `seed`).
std::vector<LengthPair> LongPromptChatLengths(int prompt_mean, int output_mean, int count,
                                              uint64_t seed);

// Simulates the four deployments (colocated TP8; 1P:3D TP8; 1P:3D with DP8 decode; 1P:1D with DP8
// decode at 1 req/s per DP rank) with pdserve's hand-over: the first token comes from the decode
// instance, after the KV transfer.
Result<std::vector<R1ScenarioRow>> RunR1Scenario(const R1ScenarioOptions& options);
// The rows as one table: tokens/s per user (1/TPOT) p50 and p90, TTFT p50 and p90.
std::string FormatR1Table(const std::vector<R1ScenarioRow>& rows, const R1ScenarioOptions& options);

}  // namespace pd::planner
