// The simulator against the real system (`pdserve validate-sim`): the measured side read from a
// `pdserve bench` result, the fixed costs of the real system solved from idle probes, and the
// side-by-side table.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/metrics.h"

namespace pd::planner {

// Per-request results from a bench result JSON (vLLM's field names: "ttfts", "itls",
// "output_lens", "failed"): TTFT as measured, TPOT as the mean gap after the first token. Failed
// requests come back `failed`. InvalidArgument when the fields are missing or disagree in length.
Result<std::vector<RequestResult>> MeasuredFromBenchJson(const nlohmann::json& bench,
                                                         const std::string& source);

// Idle probes (one request at a time) against what the latency model predicts for them.
struct IdleProbe {
  int prompt_len = 0;
  double measured_ttft_s = 0.0;
  double modelled_ttft_s = 0.0;  // prefill step + the decode step of the last prompt token
};

// What the real system adds to the latency model, solved from the probes:
//   measured − modelled TTFT = fixed_s + prompt_len · per_token_s
// per_token_s: the least-squares slope (>= 0); fixed_s: what is left at the shortest prompt (>= 0),
// where the latency model's relative error weighs least.
// fixed_s: HTTP, router and hand-over messages; per_token_s: the KV transfer's bytes over the
// loopback fabric. decode_step_ms: per decode step beyond the runner's forward pass (scheduling,
// sampling, streaming), from an idle multi-token probe.
struct RealOverheads {
  double fixed_s = 0.0;
  double per_token_s = 0.0;
  double decode_step_ms = 0.0;
};
// At least one probe; with probes of one prompt length only, per_token_s is 0.
Result<RealOverheads> SolveOverheads(const std::vector<IdleProbe>& probes, double measured_tpot_s,
                                     double modelled_tpot_s);

struct ComparisonRow {
  double rate = 0.0;
  Summary simulated, measured;
};
// Relative difference (sim − real) / real; 0 when both are 0.
double RelDiff(double simulated, double measured);
// The side-by-side table: per rate, attainment and p50/p90 TTFT/TPOT, simulated vs measured
// with the relative difference.
std::string FormatComparison(const std::vector<ComparisonRow>& rows);
nlohmann::json ComparisonToJson(const std::vector<ComparisonRow>& rows);

}  // namespace pd::planner
