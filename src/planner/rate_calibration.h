// The under-load calibration of `pdserve validate-sim`, per compared rate (issue #7). What the
// idle probes cannot see is measured under load by traced, uncompared calibration runs: the bench
// client's and router's CPU per request, the decode steps' stretch and co-run factor, and each
// request's latency outside the engines. One run at the highest rate, before the rounds, used to
// give all of it; when it caught one of this host's slow spells (a run at 03:22: decode steps
// x1.26 where the rounds ran at x1.0-1.05, prefill steps p90 x1.61 their model), every rate was
// simulated with that spell's figures. Now a short run at EACH compared rate precedes that rate's
// bench in every round (another seed than the rounds), and per rate each factor is the median
// over its runs: one run in a slow spell of three moves none of them.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "planner/latency_model.h"
#include "planner/step_stats.h"
#include "planner/ttft_parts.h"
#include "planner/validate_stats.h"

namespace pd::planner {

// The index of the upper median of `values` (the element UpperMedian returns; for an even count
// the upper of the two middle ones; among equal values the first). InvalidArgument when empty or
// a value is not finite.
Result<size_t> UpperMedianIndex(std::span<const double> values);

// How much longer an instance's prefill steps kept it busy under load than the calibrated
// simulation of the same requests with unstretched prefill steps: the traced steps' total time
// over the simulated steps' (both: the steps that computed prompt tokens, `real` those that began
// in the run's window). The total, not a per-step median: the queues grow with the busy share
// (rate x mean step), and the idle probes' prefill scale missed it by 7-50% in the rounds of two
// runs (traced prefill steps over the probes' model, p50 x1.07-1.21 at 03:22, x1.19-1.52 at
// 04:48). FailedPrecondition under `min_steps` real steps or with no simulated prefill time.
Result<double> PrefillBusyStretch(std::span<const StepRecord> real, std::span<const StepRecord> sim,
                                  int64_t min_steps);

// One traced calibration run's figures; a part it could not give is unset (or empty).
struct CalibrationRunFactors {
  double rate = 0.0;
  // PrefillBusyStretch on this run: unset when too few steps were traced.
  std::optional<double> prefill_stretch;
  // The bench client's and router's CPU under load, in the probes' split (LoadedClientCpuCost).
  std::optional<ClientCpuCost> client_cpu;
  // DecodeFactorsUnderLoad on this run: unset when too few steps were traced.
  // Of the per-step part, and of the per-sequence part (DecodeLoadFactors' split; equal unsplit).
  std::optional<double> decode_stretch, decode_seq_stretch;
  std::optional<double> decode_corun;
  // Per request, the latency outside the engines (measured TTFT less the traced engines' part);
  // empty when too few requests joined. inbound_s: the same requests' ways in
  // (OutsideSample::inbound_s), in step with outside_s, or empty.
  std::vector<double> outside_s, inbound_s;
  // The decode and prefill instances' steps' factors (DecodeStepFactors, PrefillStepFactors),
  // in start order; empty when too few steps counted.
  std::vector<double> decode_step_factors, prefill_step_factors;
};

// Per rate, from its calibration runs: each factor the median over the runs that gave it
// (UpperMedian; the client's cost ordered by its cost of a request of `output_tokens` tokens,
// the outside latency by each run's sample mean, and the median run's cost / sample taken whole,
// since a cost's two parts and a sample's spread belong together). The step factors are every
// run's sequence, one after another in run order: a round of the compared rate runs as many
// requests as the rate's calibration runs together, over as long, so the pooled sequence holds
// as much of the host's time as a round does, spells and all; one run's sequence, replayed three
// times over a round, would repeat its spells. Unset where no run gave it;
// `*_runs` says over how many runs each was taken.
struct RateCalibration {
  double rate = 0.0;
  int runs = 0;
  std::optional<ClientCpuCost> client_cpu;
  std::optional<double> prefill_stretch, decode_stretch, decode_seq_stretch, decode_corun;
  std::vector<double> outside_s, inbound_s;  // inbound_s: the same run's, or empty
  std::vector<double> decode_step_factors, prefill_step_factors;
  int client_runs = 0, prefill_runs = 0, stretch_runs = 0, corun_runs = 0, outside_runs = 0,
      step_factor_runs = 0, prefill_factor_runs = 0;
  std::optional<size_t> client_run, outside_run;  // which run's cost / sample was taken
};
// InvalidArgument when `runs` is empty, their rates differ, or a figure is not finite.
Result<RateCalibration> CombineCalibrationRuns(std::span<const CalibrationRunFactors> runs,
                                               double output_tokens);

}  // namespace pd::planner
