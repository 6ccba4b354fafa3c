// `pdserve validate-sim`'s calibration: the simulated deployment built from the latency model,
// the idle probes' overheads and one traced calibration run's figures, and the figures one such
// run gives (its traced steps and requests against a simulation of the same requests whose steps
// are not stretched).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "planner/latency_model.h"
#include "planner/simulator.h"
#include "planner/validate.h"
#include "planner/validate_trace.h"

namespace pd::planner {

inline constexpr double kMaxLoopGapS = 2e-3;  // a longer gap is the engine waiting for work

// Everything the simulated side takes. The prefill steps are stretched by prefill_stretch; the
// decode steps' per-step part (the model's constant and the probes' per-step cost) by
// decode_step_stretch and the rest by decode_seq_stretch.
struct Calibration {
  RealOverheads overheads;  // the probes' (corun_*, kv_ready_fraction as measured)
  double prefill_stretch = 1.0, decode_step_stretch = 1.0, decode_seq_stretch = 1.0;
  std::shared_ptr<const StepCalibration> prefill, decode;  // loop gap; step factors
  OutsideLatency outside;
};

// The two instances as `pdserve up` runs them (engine policy, KV capacity) with `cal` applied.
std::vector<InstanceConfig> CalibratedInstances(const StepCoeffs& model, const Calibration& cal,
                                                const SchedPolicy& policy);
// The KV link: the probes' transfer time per token as its bandwidth (none: instantaneous).
ClusterLinks CalibratedLinks(double kv_bytes_per_token, const RealOverheads& o);

// The simulator (pdserve's engine scheduler, its hand-over) on `sent`: each request reaches the
// instances its drawn way in later, and its first token and end come its drawn outside latency
// later (its end also its tail). Steps recorded when `record_steps`.
Result<SimResult> SimulateCalibrated(std::span<const InstanceConfig> insts,
                                     const ClusterLinks& links, std::span<const SimRequest> sent,
                                     const OutsideLatency& outside, bool record_steps = false);

// The decode-only steps under load against the unstretched simulation of the same requests, per
// batch size: `stretch`, the real alone steps (and the loop gap after them, at most kMaxLoopGapS)
// over the simulated alone ones, pooled by the real counts; `corun`, the real co-run steps over
// the alone ones of their batch size. With `sim_fixed_s` (the simulated step's per-step part), the
// stretch is split by least squares over the batch sizes with kMinSplitRowSteps real alone steps
// into step_stretch x that part + seq_stretch x the rest; unsplit (under two such sizes, or a
// factor outside [0.5, 2]) both are `stretch`. FailedPrecondition under `min_steps` real alone
// steps.
inline constexpr int64_t kMinSplitRowSteps = 20;
struct DecodeLoadFactors {
  double stretch = 1.0, corun = 1.0;
  int64_t alone_steps = 0, corun_steps = 0;
  double step_stretch = 1.0, seq_stretch = 1.0;
};
Result<DecodeLoadFactors> DecodeFactorsUnderLoad(std::span<const StepRecord> real,
                                                 std::span<const StepRecord> sim, int64_t min_steps,
                                                 double sim_fixed_s);

// The decode instance's slowness step by step (StepCalibration::step_factors): each decode-only
// step followed by another decode step with no KV becoming ready between them (sequences waited
// for it) gives its time plus the loop after it over its class's mean (batch size and co-run
// mark; mean step + mean gap of at most kMaxLoopGapS), in start order.
std::vector<double> DecodeStepFactors(std::span<const StepRecord> steps,
                                      std::span<const double> kv_ready_s);

// The traced prefill steps' total time over the simulated ones' (steps with prompt tokens).
// FailedPrecondition under `min_steps` traced steps or with no simulated time.
Result<double> PrefillBusyStretch(std::span<const StepRecord> real, std::span<const StepRecord> sim,
                                  int64_t min_steps);

// The prefill engine's loop between back-to-back steps: the mean gap (at most kMaxLoopGapS) from
// a prompt step's end to the next one's start where a request that next step computed had
// arrived by then. FailedPrecondition under `min_gaps` such gaps.
Result<double> PrefillLoopGap(std::span<const StepRecord> steps,
                              std::span<const TracedRequest> traced, int64_t min_gaps);

// A traced calibration run: its steps (in its window, co-run marked), its traced requests and
// the bench client's side of them.
struct TracedRun {
  std::vector<StepRecord> prefill_steps, decode_steps;
  std::vector<TracedRequest> requests;
  std::vector<ClientRequest> client;
};
// What one run gives; a figure it could not give stays unset (empty).
struct RunCalibration {
  std::optional<double> prefill_stretch, prefill_loop_gap_s, kv_ready_fraction;
  std::optional<DecodeLoadFactors> decode;
  std::vector<double> decode_step_factors;
  OutsideSamples outside;
};
// `unstretched`: the run's requests simulated with `probes` (stretches 1, no step calibration),
// steps recorded; `sim_fixed_s`: its decode step's per-step part.
RunCalibration CalibrateRun(const TracedRun& run, const SimResult& unstretched, double sim_fixed_s);

// `probes` with each figure `run` gave put in (the outside latency drawn with `seed`); with
// `corun` the run's decode co-run factor too (clamped to [1, 4]). A traced hand-over point
// includes the KV transfer, so the transfer time per token is then dropped.
Calibration WithRun(const Calibration& probes, const RunCalibration& run, bool corun,
                    uint64_t seed);

}  // namespace pd::planner
