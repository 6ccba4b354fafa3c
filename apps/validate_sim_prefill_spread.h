// `pdserve validate-sim`'s prefill steps' spread around the latency model (issue #7), from the
// load run's traces.
//
// Why: the simulator's prefill step for a given shape is a constant, while the real steps vary
// (the 02:42 load run: traced step over the calibrated model for the same prompts, p10 x0.80, p90
// x1.18, max x2.67), and queueing amplifies a service time's variance (M/G/1: the mean wait grows
// with E[S^2]). The 02:42 run's TTFT p90 was 10-12% low at 20% and 40% of capacity, its p50s
// within 3%. The rule, fixed before the compared rounds: each traced prefill step of the
// uncompared load run (its shape: the prompts the traced requests say it computed, whole; the
// prefill co-run factor where a decode step was running as it began) over the calibrated model
// at the load run's rate; those ratios over their median (so the median step stays the model's
// and the p50s do not move) are the sample. The calibrated simulation draws each prefill step's
// factor from it by the step's first request id, and since one draw over 300 requests is noisy
// (offline on the 02:42 run, the TTFT p90 at 60% ranged 57-84 ms over 40 draws), every calibrated
// figure is the median over kSpreadDraws draws (SimulateRateDrawn). Without --trace, or with
// fewer than kMinSpreadSteps traced steps, the steps stay constant.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/validate_sim_calibration.h"
#include "apps/validate_sim_flags.h"
#include "apps/validate_sim_simulate.h"
#include "common/file_util.h"
#include "common/status.h"
#include "planner/step_stats.h"
#include "planner/ttft_parts.h"

namespace pd::apps::validate_sim {

inline constexpr size_t kMinSpreadSteps = 100;  // traced prefill steps of the load run

// Whether one of `steps` (start order, not overlapping: one instance's) was running at `t`.
inline bool RunningAt(const std::vector<planner::StepRecord>& steps, double t) {
  auto it = std::upper_bound(steps.begin(), steps.end(), t,
                             [](double x, const planner::StepRecord& s) { return x < s.start_s; });
  if (it == steps.begin()) return false;
  --it;
  return t < it->start_s + it->duration_s;
}

// The spread (sorted, median 1) of the load run's traced prefill steps around the calibrated
// model; `raw_median` gets the ratios' median before the division.
inline Result<std::vector<double>> MeasurePrefillSpread(const ValidateFlags& f,
                                                        const planner::StepCoeffs& coeffs,
                                                        int64_t kv_tokens, const LoadRunCpu& load,
                                                        const Calibration& cal) {
  ASSIGN_OR_RETURN(const std::string dec, ReadFileToString(TracePathFor(f.trace, "decode0")));
  ASSIGN_OR_RETURN(const std::string pre, ReadFileToString(TracePathFor(f.trace, "prefill0")));
  ASSIGN_OR_RETURN(auto traced, planner::TracedRequestsFromTraces(pre, dec));
  // Decode steps begun up to a second before the window may still run as a prefill step begins.
  ASSIGN_OR_RETURN(auto decode_steps,
                   planner::EngineStepsFromTrace(dec, load.begin_s - 1.0, load.end_s));
  ASSIGN_OR_RETURN(auto insts, CalibratedAt(f, coeffs, cal, kv_tokens, load.rate));
  const planner::InstanceConfig& prefill = insts[0];
  auto model = [&](const planner::StepShape& shape, double begin_s) {
    const double corun = RunningAt(decode_steps, begin_s) ? prefill.corun_slowdown : 1.0;
    return planner::PipelineTimes(prefill.coeffs, shape, 1).step_s * corun;
  };
  return planner::PrefillStepSpread(traced, load.begin_s, load.end_s, model, kMinSpreadSteps);
}

// Sets cal->prefill_spread from the load run's traces and prints its p10/p50/p90 (as ratios of
// the calibrated model); keeps the constant steps, saying why, when that cannot be done.
inline void CalibratePrefillSpread(const ValidateFlags& f, const planner::StepCoeffs& coeffs,
                                   int64_t kv_tokens, const LoadRunCpu& load, Calibration* cal) {
  std::printf("\nprefill steps' spread (the load run's traces, not compared): ");
  if (f.trace.empty()) {
    std::printf("no --trace; the simulated prefill step stays the model's for its shape\n");
    return;
  }
  auto m = MeasurePrefillSpread(f, coeffs, kv_tokens, load, *cal);
  if (!m.ok()) {
    std::printf("%s; the simulated prefill step stays the model's for its shape\n",
                m.status().ToString().c_str());
    return;
  }
  cal->prefill_spread = *m;
  auto q = [&](double p) { return planner::Percentile(*m, p); };
  std::printf(
      "%zu steps, traced / calibrated model for the same prompts over their median: p10 x%.3f, "
      "p50 x%.3f, p90 x%.3f, max x%.3f; each simulated prefill step draws its factor from them "
      "(by its first request), every calibrated figure the median of %d draws\n",
      m->size(), q(0.1), q(0.5), q(0.9), m->back(), kSpreadDraws);
}

}  // namespace pd::apps::validate_sim
