// `pdserve validate-sim`'s arithmetic: the overheads the idle probes fit onto the latency model
// and the paired comparison of simulated and measured bench rounds.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/metrics.h"

namespace pd::planner {

// The upper median (for an even count the upper of the two middle values); 0 when empty.
double UpperMedian(std::vector<double> v);

// Per-request results from a bench result JSON ("ttfts", "itls", "output_lens", "failed"):
// TTFT as measured, TPOT as the mean gap after the first token. InvalidArgument when the fields
// are missing or disagree in length.
Result<std::vector<RequestResult>> MeasuredFromBenchJson(const nlohmann::json& bench,
                                                         const std::string& source);

// An idle TTFT probe (one request at a time through the deployment) against the latency model.
struct IdleProbe {
  int prompt_len = 0;
  double measured_ttft_s = 0.0;
  double modelled_ttft_s = 0.0;     // prefill step + the decode step of the last prompt token
  double modelled_prefill_s = 0.0;  // the prefill step alone
  // How long the prompt held the prefill instance's compute thread (on its core or waiting for
  // it: its own threads, pinned with it, send the KV during the step); schedstat.
  double measured_prefill_cpu_s = 0.0;
};
// `batch` requests decoding together: their mean TPOT against the modelled decode step.
struct DecodeProbe {
  int batch = 1;
  double measured_tpot_s = 0.0;
  double modelled_tpot_s = 0.0;
};

// What the deployment adds to (or scales in) the latency model:
//   measured TPOT - modelled step = decode_fixed_ms + batch * decode_seq_ms
//   prefill_scale = sum(cpu * m) / sum(m^2) over the TTFT probes (m: the modelled prefill step)
//   measured TTFT - calibrated first decode step - prefill_scale * m
//       = fixed_s + transfer_s_per_token * prompt_len
// Each fit by least squares with non-negative terms; one batch size puts all in decode_seq_ms,
// one prompt length all in fixed_s. corun_* and kv_ready_fraction are set by other measurements.
inline constexpr double kMinPrefillScale = 0.25;
struct RealOverheads {
  double fixed_s = 0.0;  // HTTP, router and hand-over messages
  double prefill_scale = 1.0;
  double decode_fixed_ms = 0.0, decode_seq_ms = 0.0;  // sampling, detokenising, streaming
  double corun_prefill = 1.0, corun_decode = 1.0;     // InstanceConfig::corun_slowdown
  double transfer_s_per_token = 0.0;                  // the KV transfer
  double kv_ready_fraction = 1.0;                     // InstanceConfig::kv_ready_fraction
};
// InvalidArgument without probes of either kind, a batch < 1, or a TTFT probe without its
// measured compute time.
Result<RealOverheads> SolveOverheads(const std::vector<IdleProbe>& probes,
                                     const std::vector<DecodeProbe>& decode_probes);

// The co-run factor: the median of the pairs' busy/alone ratios, clamped to [1, 4] (1 without).
double CorunFactor(std::vector<double> ratios);

// Per metric, the median over the rounds (UpperMedian).
Summary MedianSummary(std::span<const Summary> rounds);
// How far the rounds of one rate spread: per compared metric (max - min) / median.
Summary RelativeSpread(std::span<const Summary> rounds);

struct ComparisonRow {
  double rate = 0.0;
  Summary simulated, measured;
};
double RelDiff(double simulated, double measured);  // sim/real - 1; 0 when both are 0
std::string FormatComparison(std::span<const ComparisonRow> rows);
nlohmann::json ComparisonToJson(std::span<const ComparisonRow> rows);
// Cells of `rows` (attainment, TTFT p50/p90, TPOT p50/p90) with |sim/real - 1| <= tolerance.
int CellsWithin(std::span<const ComparisonRow> rows, double tolerance);

}  // namespace pd::planner
