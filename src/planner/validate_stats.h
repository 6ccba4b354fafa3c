// `pdserve validate-sim`'s statistics: the median of repeated bench rounds, how far repeated
// rounds (machine noise) or reseeded workloads (sampling noise) spread a metric, and the CPU the
// bench client and router take from the instances' cores.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/metrics.h"

namespace pd::planner {

// The middle value of `v` (the upper one of the two for an even count); 0 for none.
double UpperMedian(std::vector<double> v);

// The capacity that fixes the compared rates, from the capacities calibrated from each of the
// probe sets taken before any round (at least 2; `pdserve validate-sim` takes 3): their median,
// the lower of the two middle ones for an even count (a fast spell of the machine must not raise
// the rates; one set caught in one put a run's rates 25% higher). InvalidArgument for fewer than
// 2 sets or a capacity that is not positive and finite.
Result<double> SteadyCapacity(std::vector<double> per_set);

// Metric by metric, the median of `rounds` (the upper median for an even count, like the probes'
// medians); num_requests and num_failed from the round with the median attainment;
// other_attainment -1 unless every round has one. An empty span gives an empty Summary.
Summary MedianSummary(std::span<const Summary> rounds);

// (max − min) / median of each compared metric over `rounds`; 0 for a metric whose median is 0.
struct Spread {
  double attainment = 0.0, ttft_p50 = 0.0, ttft_p90 = 0.0, tpot_p50 = 0.0, tpot_p90 = 0.0;
  double other_attainment = -1.0;  // -1 unless every round has one
};
Spread RelativeSpread(std::span<const Summary> rounds);
// "att 4% | TTFT p50 3% p90 9% | TPOT p50 2% p90 6%"
std::string FormatSpread(const Spread& s);

// CPU seconds the bench client and router spend on one request: a fixed part (HTTP, routing,
// the hand-over's control messages) and a part per output token (each streamed token crosses
// the router and the client).
struct ClientCpuCost {
  double per_request_s = 0.0;
  double per_token_s = 0.0;
  double Seconds(double output_tokens) const { return per_request_s + per_token_s * output_tokens; }
};
// From two probe sets: requests of `tokens_a` output tokens cost `cpu_a` CPU seconds each,
// requests of `tokens_b` cost `cpu_b`. Both parts are kept non-negative (a negative slope means
// the per-token part was lost in the noise: it becomes 0 and the fixed part the mean).
// InvalidArgument when the token counts are equal or not positive, or a cost is negative.
Result<ClientCpuCost> SolveClientCpuCost(double tokens_a, double cpu_a, double tokens_b,
                                         double cpu_b);

// The same cost as measured under load: `cpu_s` CPU seconds over a bench run of `requests`
// requests of `mean_output_tokens` output tokens on average (concurrent requests cost the client
// and router more than the probes' one at a time). Split like the probes' `probe` cost: both its
// parts scaled by one factor, so that a mean request costs what was measured; all of it per
// request when the probes measured nothing. InvalidArgument when requests < 1, or cpu_s or
// mean_output_tokens is negative.
Result<ClientCpuCost> LoadedClientCpuCost(const ClientCpuCost& probe, double cpu_s, int requests,
                                          double mean_output_tokens);

// The step-time stretch of an instance while other work shares its core at `rate` requests/s of
// `mean_output_tokens` tokens: the bench client and router, unpinned, take `shared` from every one
// of the machine's `cores` cores alike; the instance's own HTTP, fabric and messenger threads,
// pinned with it, take `own` from its core alone. The share u = rate · (shared / cores + own) of
// the core goes to them, so a step of t seconds of CPU takes t / (1 − u). u is capped at 0.9
// (beyond it the client cannot keep up anyway). InvalidArgument for a negative rate or fewer than
// one core.
Result<double> BackgroundCpuStretch(const ClientCpuCost& shared, double rate,
                                    double mean_output_tokens, int cores,
                                    const ClientCpuCost& own = {});

// The step-time stretch at `rate` of an instance whose steps were measured `measured` times the
// unstretched model's at `measured_rate` (a traced run: DecodeFactorsUnderLoad): the share of its
// core u = 1 − 1/measured that other work took there grows with the rate, u · rate /
// measured_rate (capped at 0.9 as BackgroundCpuStretch; a negative share, steps faster than the
// model, scales alike), and the stretch is 1 / (1 − u): `measured` at `measured_rate`, 1 at rate
// 0. InvalidArgument unless measured > 0, measured_rate > 0 and rate >= 0.
Result<double> StretchAtRate(double measured, double measured_rate, double rate);

// A co-run factor (InstanceConfig::corun_slowdown) from interleaved alone/busy pairs of the same
// work's cost (an instance's compute-thread CPU time alone, and while the other instance
// computes): the median of the pairs' busy/alone ratios, held in [1, 4] (below 1 is noise).
// Pairs with a non-positive side are skipped; 1 when none is left or the spans differ in length.
double CorunFactor(std::span<const double> alone, std::span<const double> busy);

// The rate at which an instance is busy all the time: each request holds it for `work_s` of CPU,
// stretched by BackgroundCpuStretch while other work takes `background_s` of its core per request
// (rate · work_s / (1 − rate · background_s) = 1, so rate = 1 / (work_s + background_s)).
// InvalidArgument unless work_s > 0 and background_s >= 0.
Result<double> SaturationRate(double work_s, double background_s);

}  // namespace pd::planner
