// Workloads for the simulator: request lengths, arrival processes and recorded traces.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/metrics.h"

namespace pd::planner {

struct SimRequest {
  int64_t id = 0;
  double arrival_s = 0.0;
  int prompt_len = 0;
  int output_len = 0;  // generated tokens, >= 1
};

struct LengthPair {
  int prompt_len = 0;
  int output_len = 0;
};

// "prompt_len,output_len" CSV with a header (DistServe's sharegpt-opt13b-lengths.csv).
Result<std::vector<LengthPair>> LoadLengthsCsv(const std::string& path);
Result<std::vector<LengthPair>> ParseLengthsCsv(const std::string& text, const std::string& source);

// A trace: [{"prompt_len", "output_len", "start_time"}] (DistServe's workloads/NAME.json).
Result<std::vector<SimRequest>> ParseTraceJson(const std::string& text, const std::string& source);
Result<std::vector<SimRequest>> LoadTraceJson(const std::string& path);

struct ArrivalOptions {
  int num_requests = 500;
  double cv =
      1.0;  // coefficient of variation of inter-arrival gaps: 1 = Poisson (gamma, shape 1/cv²)
  uint64_t seed = 1;
};

// Requests at unit rate (1 req/s): lengths drawn uniformly (with replacement) from `lengths`,
// gamma inter-arrival gaps. Scale with AtRate: the same draws serve every rate, so a search over
// rates compares like with like.
std::vector<SimRequest> MakeUnitRateWorkload(std::span<const LengthPair> lengths,
                                             const ArrivalOptions& options);
std::vector<SimRequest> AtRate(std::span<const SimRequest> unit_rate, double rate);

// What a real system measured for a trace (DistServe's measured/NAME.json), in trace order of
// issue time.
struct MeasuredRequest {
  int prompt_len = 0;
  int output_len = 0;
  double issue_s = 0.0;
  double ttft_s = 0.0;
  double tpot_s = 0.0;
};
Result<std::vector<MeasuredRequest>> ParseMeasuredJson(const std::string& text,
                                                       const std::string& source);
Result<std::vector<MeasuredRequest>> LoadMeasuredJson(const std::string& path);
// The measurements as the simulator's results, to summarise beside a replay: first token at
// TTFT, last at TTFT + TPOT per further token.
std::vector<RequestResult> MeasuredResults(std::span<const MeasuredRequest> measured);

}  // namespace pd::planner
