// Per-request latencies and SLO attainment.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pd::planner {

struct RequestResult {
  int64_t id = 0;
  int prompt_len = 0;
  int output_len = 0;
  double arrival_s = 0.0;
  double first_token_s = -1.0;  // -1: never produced
  double finish_s = -1.0;
  // Disaggregated with the first token on the decode instance (SimOptions::first_token_on_decode):
  // when the prefill step ended and when the KV reached the decode instance (-1: not yet).
  double prefill_done_s = -1.0;
  double kv_arrived_s = -1.0;
  bool failed = false;  // could not be served (e.g. larger than the KV cache)

  bool done() const { return !failed && finish_s >= 0; }
  double ttft_s() const { return first_token_s - arrival_s; }
  // Mean time per output token after the first (0 for a single-token output).
  double tpot_s() const {
    return output_len <= 1 ? 0.0 : (finish_s - first_token_s) / (output_len - 1);
  }
};

struct Slo {
  double ttft_s = 0.25;
  double tpot_s = 0.1;
};

// SLO attainment: a request counts when it finished and met BOTH targets.
bool MeetsSlo(const RequestResult& r, const Slo& slo);

struct Summary {
  int num_requests = 0;
  int num_failed = 0;
  double attainment = 0.0;  // both SLOs, share of all requests
  double ttft_attainment = 0.0;
  double tpot_attainment = 0.0;
  double ttft_p50_s = 0.0, ttft_p90_s = 0.0, ttft_mean_s = 0.0;
  double tpot_p50_s = 0.0, tpot_p90_s = 0.0, tpot_mean_s = 0.0;
};

Summary Summarize(std::span<const RequestResult> results, const Slo& slo);
// The share of `results` that finished and met both targets of `slo`; 0 when empty.
double Attainment(std::span<const RequestResult> results, const Slo& slo);
// Linear-interpolated percentile (q in [0, 1]) of unsorted values; 0 when empty.
double Percentile(std::vector<double> values, double q);

}  // namespace pd::planner
