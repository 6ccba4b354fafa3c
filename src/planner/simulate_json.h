// `pdserve simulate --json`: the simulator's results as one JSON document, schema
// "pdserve-simulate-v1", for plots (bench/plot.py) beside `pdserve bench`'s rate documents.
//
//   SimulatedRates r = ...;  // the deployment, its summary at each rate, the goodput
//   std::fputs(SimulatedRatesToJson(r, setup.inputs).c_str(), stdout);
//
// Both modes name the model, hardware, SLO (milliseconds, as the bench writes it) and
// attainment target. Attainments have the bench's shape: {"ttft", "tpot", "both"}, shares of all
// requests.
//   mode "rates":  "deployment", "latency_model", "num_requests" (per rate, at least),
//                  "rates": [{request_rate, attainment, p50/p90 TTFT and TPOT ms, ...}],
//                  "goodput": {"goodput": req/s} or null when the search found none.
//   mode "traces": "traces": [{name, system, deployment, assumed, request_rate, num_requests,
//                  "simulated": {...}, "measured": {...}}] (DistServe's recorded A100 runs).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "planner/metrics.h"
#include "planner/search.h"
#include "planner/trace_replay.h"

namespace pd::planner {

struct SimulatedRate {
  double rate = 0.0;  // req/s
  Summary summary;
};

struct SimulatedRates {
  std::string deployment;  // DeploymentSpec::Describe()
  bool disaggregated = false;
  std::string latency_model;  // LatencyModel::Describe()
  std::vector<SimulatedRate> rates;
  std::optional<double> goodput;  // req/s at the attainment target; nullopt: not found
};

std::string SimulatedRatesToJson(const SimulatedRates& r, const PlannerInputs& in);
std::string ReplaysToJson(const std::vector<TraceReplay>& rows, const PlannerInputs& in);

}  // namespace pd::planner
