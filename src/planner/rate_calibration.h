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

#include <array>
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
// 04:48). `left_out_s`: real busy time left out of the total (the arrival work the simulation
// places itself: PrefillArrivalWork::total_s). FailedPrecondition under `min_steps` real steps,
// with no simulated prefill time, or when less than half the real time is left.
Result<double> PrefillBusyStretch(std::span<const StepRecord> real, std::span<const StepRecord> sim,
                                  int64_t min_steps, double left_out_s = 0.0);

// The work a request brings a prefill instance's core when it comes while a step runs
// (InstanceConfig::arrival_work_s), from one traced run's prefill steps (`steps`, start order)
// and requests: a step is held when a request that a later step computed reached the instance
// during it (TracedRequest::got_s in [start, end): its "transfer" or "prefill request", as the
// messenger took it; a request computed by the step it came in is the step's own). Each step's
// time is put against `model`'s time for its tokens (as PrefillStepFactors takes them); per
// co-run mark, the free steps' total over their model total is the mark's ratio, and `held_s`
// is the held steps' time beyond that ratio, summed, over the requests that came during them.
// A longer step catches more requests by chance, so held steps run longer even when a request
// costs nothing: `chance_s` is the same figure expected of requests that came at random at the
// run's rate (each step free with probability exp(-rate x its time): its ratio and excess
// weighted so, over rate x its time requests), and `work_s` = held_s - chance_s, or 0 when
// less. Why: the prefill instance is pinned whole to one core, so a request's hop ends on that
// core's messenger and fabric threads, which take it from the running step, the one the request
// then queues behind. A traced run (2026-12-01 06:38): steps a request came during ran 0.59 /
// 0.30 / 0.16 ms longer than the free ones at 17 / 34 / 52 req/s. Six runs (08:34-09:20): work_s
// 0-1.08 ms a calibration run, a rate's median 0.08-0.54; chance_s mostly -0.29 to +0.16 (the
// model's misfit by prompt length weighs in too), up to +1.5 in a slow spell, which held_s
// then follows. Spread over every step as a stretch, that work slows prompts at low load that met
// none of it and leaves the queued ones short. validate-sim prints the simulation with it beside
// the rule used, not used (apps/validate_sim_rate_cal.h, WithArrivalWork).
// FailedPrecondition under `min_steps` held or free steps.
//
// Three measures of the work are weighed beside the rule used (Work): `work_s` as above
// (kLessChance); `held_s` alone, or 0 when less (kHeld: the chance part came out negative at 60%
// load, where the model's misfit by prompt length weighs in, which raised work_s there); and
// the same as work_s against this run's own fit a + b·t + c·Σt² over its free steps in place of
// `model` (kOwnFit: the misfit by prompt length taken out of both parts; unset when the fit
// fails).
enum class ArrivalMeasure { kLessChance, kHeld, kOwnFit };
inline constexpr size_t kArrivalMeasures = 3;
template <typename T>
using PerArrivalMeasure = std::array<T, kArrivalMeasures>;
inline constexpr PerArrivalMeasure<ArrivalMeasure> kAllArrivalMeasures = {
    ArrivalMeasure::kLessChance, ArrivalMeasure::kHeld, ArrivalMeasure::kOwnFit};
// How each measure is named in validate-sim's output and JSON ("arrival_work", "held_work",
// "own_fit_work").
const char* ArrivalMeasureKey(ArrivalMeasure m);
struct PrefillArrivalWork {
  double work_s = 0.0;     // per request, >= 0
  double held_s = 0.0;     // the held steps' excess per request
  double chance_s = 0.0;   // the excess by chance, per request
  int64_t held_steps = 0;  // steps during which a request came
  int64_t free_steps = 0;  // steps during which none came
  int64_t arrivals = 0;    // requests that came during a step
  // held_s and chance_s against the run's own fit of its free steps; unset when it failed.
  std::optional<double> fit_held_s, fit_chance_s;
  // The work per request by `m` (>= 0); unset for kOwnFit without a fit.
  std::optional<double> Work(ArrivalMeasure m) const;
  // Work(m) over every request that came during a step: the busy time the simulation places.
  std::optional<double> total_s(ArrivalMeasure m = ArrivalMeasure::kLessChance) const {
    const std::optional<double> w = Work(m);
    if (!w) return std::nullopt;
    return *w * static_cast<double>(arrivals);
  }
};
Result<PrefillArrivalWork> MeasurePrefillArrivalWork(std::span<const StepRecord> steps,
                                                     std::span<const TracedRequest> traced,
                                                     const StepCoeffs& model, int64_t min_steps);

// The prefill engine's loop between back-to-back steps (InstanceConfig::loop_gap_s): the mean of
// next step's start less this step's end over the consecutive steps (`steps`: start order, those
// with prompt tokens counted) where the next one had work waiting as this one ended: a request it
// computed (`traced`, matched to its step by TracedRequest::step_begin_s) had reached the
// instance (arrived_s) by then. Gaps over `max_gap_s` are left out (an engine waiting for its
// core, not its loop). A traced run (2026-11-30 18:53): 0.25 ms at p50, 0.45 at p90, 0.75 at
// p99 over 2,446 such gaps, where an idle engine started 0.027 ms after a request came; a
// prompt queued behind k others paid k of them, which the simulation left out (its TTFT of
// requests it queued ran 0.2-1.6 ms short at the median). FailedPrecondition under `min_gaps`.
Result<double> PrefillLoopGap(std::span<const StepRecord> steps,
                              std::span<const TracedRequest> traced, double max_gap_s,
                              int64_t min_gaps);

// One traced calibration run's figures; a part it could not give is unset (or empty).
struct CalibrationRunFactors {
  double rate = 0.0;
  // PrefillBusyStretch on this run over the whole traced busy time: unset when too few steps
  // were traced. prefill_stretch_left_out[m]: the same with the arrival work by measure m
  // (prefill_arrival_work_s[m]) left out of it, which goes with that work (printed beside, not
  // used); unset when that work was not measured.
  std::optional<double> prefill_stretch;
  PerArrivalMeasure<std::optional<double>> prefill_stretch_left_out;
  // MeasurePrefillArrivalWork on this run: PrefillArrivalWork::Work by each measure, and the
  // whole measure (its parts printed beside); unset when too few steps were traced.
  PerArrivalMeasure<std::optional<double>> prefill_arrival_work_s;
  std::optional<PrefillArrivalWork> prefill_arrival;
  // PrefillLoopGap on this run: unset when too few gaps were traced.
  std::optional<double> prefill_loop_gap_s;
  // The bench client's and router's CPU under load, in the probes' split (LoadedClientCpuCost).
  std::optional<ClientCpuCost> client_cpu;
  // DecodeFactorsUnderLoad on this run: unset when too few steps were traced.
  // Of the per-step part, and of the per-sequence part (DecodeLoadFactors' split; equal unsplit).
  std::optional<double> decode_stretch, decode_seq_stretch;
  // The same fit's unsplit stretch (DecodeLoadFactors::stretch: the alone steps' time against the
  // simulation's), by which the runs are ordered; unset: decode_stretch orders this run.
  std::optional<double> decode_alone_stretch;
  // The rows that fit was made over (SummarizeDecodeSteps of the traced and of the simulated
  // steps) and the simulated step's per-step part it split at; empty / 0 when not kept.
  std::vector<BatchStepStats> decode_real_rows, decode_sim_rows;
  double decode_fixed_s = 0.0;
  std::optional<double> decode_corun;
  // Per request, the latency outside the engines (measured TTFT less the traced engines' part);
  // empty when too few requests joined. inbound_s: the same requests' ways in
  // (OutsideSample::inbound_s), in step with outside_s, or empty; tail_s: their last token's way
  // out less their first's (OutsideSample::tail_s), in step with outside_s, or empty.
  std::vector<double> outside_s, inbound_s, tail_s;
  // The decode and prefill instances' steps' factors (DecodeStepFactors, PrefillStepFactors),
  // in start order; empty when too few steps counted.
  std::vector<double> decode_step_factors, prefill_step_factors;
  // The prefill instance's traced steps in the run's window and the unstretched simulation's
  // steps of the same requests (PrefillChunkFactors); empty when not traced.
  std::vector<StepRecord> prefill_real_steps, prefill_sim_steps;
};

// DecodeBatchFactors over one run's kept rows against that run's own split (decode_stretch,
// decode_seq_stretch): the paired rule's variant. Empty when the run kept no rows or no split.
std::vector<double> RunDecodeBatchFactors(const CalibrationRunFactors& run);

// Per rate, from its calibration runs: each factor the median over the runs that gave it
// (UpperMedian; the client's cost ordered by its cost of a request of `output_tokens` tokens,
// the outside latency by each run's sample mean, the decode stretch by each run's unsplit
// stretch, and the median run's cost / sample / per-step and per-sequence pair taken whole,
// since a cost's two parts, a sample's spread and a split's two factors belong together). The
// split's two factors are fitted together and trade against each other (the runs of one rate
// gave per step x0.52-0.98 with per sequence x1.52-1.03): their medians taken apart paired
// x0.94 with x1.28 (2026-11-30 17:40), slower at every batch size than any of the runs, and
// the simulated TPOT p50 / p90 at 60% load ran +17% / +23%. The step factors are every
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
  std::optional<double> prefill_loop_gap_s;  // the median over the runs that gave one
  // Each the median over the runs that gave one, per measure of the arrival work.
  PerArrivalMeasure<std::optional<double>> prefill_arrival_work_s, prefill_stretch_left_out;
  PerArrivalMeasure<int> arrival_work_runs{}, left_out_runs{};
  // The split fitted over every run's rows together (MergeDecodeStepStats; DecodeFactorsUnderLoad
  // on them), scaled to the taken run's unsplit stretch: per step and per sequence. Unset when
  // fewer than two runs kept rows, their per-step parts differ, or the pooled steps do not split.
  // One 100-request run's split put the per-sequence factor anywhere in x1.05-1.75 (stop 16);
  // a 300-request load run's stayed within x1.19-1.21.
  std::optional<double> pooled_decode_stretch, pooled_decode_seq_stretch;
  int pooled_split_runs = 0;
  // The unsplit level the pooled split is scaled to (the taken run's DecodeLevel); 0 without one.
  double pooled_split_level = 0.0;
  // DecodeBatchFactors over the same rows against that split (before its scaling: a shape by
  // batch size, not a level); empty with no pooled split.
  std::vector<double> pooled_decode_batch_factors;
  // PrefillChunkFactors over every run's prefill steps together (kMinSplitRowSteps steps a
  // count); empty when they give none. Printed and simulated beside the rule used.
  std::vector<double> prefill_chunk_factors;
  std::vector<double> outside_s, inbound_s, tail_s;  // inbound_s, tail_s: the same run's, or empty
  std::vector<double> decode_step_factors, prefill_step_factors;
  int client_runs = 0, prefill_runs = 0, stretch_runs = 0, corun_runs = 0, outside_runs = 0,
      step_factor_runs = 0, prefill_factor_runs = 0, loop_gap_runs = 0;
  // Which run's cost / sample / decode stretch pair was taken.
  std::optional<size_t> client_run, outside_run, decode_run;
};
// InvalidArgument when `runs` is empty, their rates differ, or a figure is not finite.
Result<RateCalibration> CombineCalibrationRuns(std::span<const CalibrationRunFactors> runs,
                                               double output_tokens);

// A run's unsplit decode stretch (decode_alone_stretch, or decode_stretch where the run gave no
// split), by which CombineCalibrationRuns orders the runs; unset without a decode stretch.
std::optional<double> DecodeLevel(const CalibrationRunFactors& run);

// The decode split of a round under the paired rule's variants (validate-sim prints them beside
// the rule used): the rate's pooled split (`rc`) scaled from its level to `level`, per step and
// per sequence. Unset when `rc` has no pooled split; InvalidArgument when `level` is not
// positive and finite. Why: one run's own split scatters (per sequence x0.81-1.68 over one
// rate's runs, stop 29), and a round paired with a run split x0.68 / x1.72 simulated its decode
// steps 10-35% longer than the real ones (batch 1 to 4); the split over the rate's runs together
// holds their shape, the run its level.
struct DecodeSplit {
  double step = 1.0, seq = 1.0;
};
Result<std::optional<DecodeSplit>> PooledSplitAtLevel(const RateCalibration& rc, double level);

// A round's decode level bracketed by the calibration runs before and after it (the mean of
// their DecodeLevel): the host drifts by +-20% over 5-10 s, so one run before a round gives the
// round's level only on the mean. The run before's alone when `after` is null or gave none;
// unset when the run before gave none.
std::optional<double> BracketedDecodeLevel(const CalibrationRunFactors& before,
                                           const CalibrationRunFactors* after);

}  // namespace pd::planner
