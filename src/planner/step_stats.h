// Engine steps, simulated or read from a real instance's `--trace` file, summarised per batch
// size: how many steps ran with b sequences decoding, how long they took alone and while the
// other instance on the machine was mid-step, and how long the engine loop took between a step's
// end and the next step's start. `pdserve validate-sim --trace FILE` prints the real decode
// instance's steps beside the calibrated simulation's, so a TPOT difference can be traced to the
// batch sizes (the scheduler), the step times (the latency model) or the loop between steps.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/simulator.h"

namespace pd::planner {

struct StepRecord {
  double start_s = 0.0;
  double duration_s = 0.0;
  int decode_seqs = 0;
  int64_t prefill_tokens = 0;
  bool corun = false;      // the other instance was mid-step as this one started
  int prefill_chunks = 0;  // prompts (or their chunks) the step computed
};

// The engine's "step" events (category "engine", args "decodes" and "prefill_tokens") of a
// Chrome trace-event file (`pdserve serve --trace`), in start order, between begin_s and end_s
// (seconds on the trace's clock, steady-clock; a step counts when it starts in the window).
// InvalidArgument when the text is not such a file or a step lacks its arguments.
Result<std::vector<StepRecord>> EngineStepsFromTrace(const std::string& json_text, double begin_s,
                                                     double end_s);

// Sets each step's `corun`: whether a step of `other` (start order) was running as it started
// (the simulator's rule for its co-run factor).
void MarkCorun(std::span<StepRecord> steps, std::span<const StepRecord> other);

// The steps instance `instance` of a simulation took (SimOptions::record_steps).
std::vector<StepRecord> StepsOfInstance(const SimResult& sim, int instance);

// Per number of decoding sequences (steps with a prefill chunk left out: a decode instance runs
// none): the step count, the mean step time overall, alone and while the other instance was
// mid-step, and the mean loop gap (the next step's start minus this one's end) over the gaps of
// at most `max_gap_s` (longer ones are the engine waiting for work). A row per batch size from
// 1 to `max_batch`, larger batches pooled in the last row; empty rows have count 0.
struct BatchStepStats {
  int batch = 0;  // decoding sequences (the last row: this many or more)
  int64_t count = 0, corun_count = 0, gap_count = 0;
  double mean_s = 0.0, mean_alone_s = 0.0, mean_corun_s = 0.0, mean_gap_s = 0.0;
};
std::vector<BatchStepStats> SummarizeDecodeSteps(std::span<const StepRecord> steps, int max_batch,
                                                 double max_gap_s);
// Two SummarizeDecodeSteps tables of other steps as one: per batch size the counts added and
// each mean weighted by its own count (alone steps, co-run steps, gaps). The longer table's rows
// beyond the shorter's are kept; InvalidArgument when a row's batch differs from its index + 1.
Result<std::vector<BatchStepStats>> MergeDecodeStepStats(std::span<const BatchStepStats> a,
                                                         std::span<const BatchStepStats> b);

// The decode instance's steps under load against a simulation of the same requests whose decode
// steps are not stretched (issue #7, from the uncompared load run): `stretch`, how much longer the
// real decode-only steps that ran alone took, the engine loop after them included (the simulated
// step holds that loop: its per-step and per-sequence costs come from the probes' TPOT), than the
// simulated ones that ran alone; `corun`, how much longer the real ones took (loop included) when
// a prefill step was running as they started than alone. Each pools the batch sizes weighted by
// the real side's step counts of that kind; `real` and `sim` are SummarizeDecodeSteps rows (row
// b-1: b sequences) with the same max_batch. A row counts for `stretch` when both sides have alone
// steps, for `corun` when the real side has both kinds; with no co-run step `corun` stays 1 and
// `corun_steps` 0. FailedPrecondition when fewer than `min_steps` real alone steps count.
//
// With `sim_step_fixed_s` > 0 (the simulated step's part that every decode step pays whatever its
// batch: the model's constant), the stretch is also split in two: step_stretch × that part +
// seq_stretch × the rest of the simulated alone step (its per-sequence part), fitted to the real
// alone steps (loop included) per batch size by least squares weighted by the real counts, over
// the batch sizes with at least kMinSplitRowSteps real alone steps. A single factor fitted the
// steps of one sequence, which most steps are, and left larger batches short: a traced run had
// the real steps + loop 0.20 ms longer per extra sequence where the simulation put 0.16, at every
// rate. Unsplit (`split` false: fewer than two such batch sizes, or a factor outside [0.5, 2]),
// both are `stretch`.
struct DecodeLoadFactors {
  double stretch = 1.0;
  double corun = 1.0;
  int64_t alone_steps = 0;  // real steps behind `stretch`
  int64_t corun_steps = 0;  // real steps behind `corun`
  bool split = false;
  double step_stretch = 1.0, seq_stretch = 1.0;
};
inline constexpr int64_t kMinSplitRowSteps = 20;
Result<DecodeLoadFactors> DecodeFactorsUnderLoad(std::span<const BatchStepStats> real,
                                                 std::span<const BatchStepStats> sim,
                                                 int64_t min_steps, double sim_step_fixed_s = 0.0);

// What a decode model linear in the batch misses: per number of decoding sequences b (element
// b-1), the real alone steps' mean (engine loop included) over the split's simulated one,
// step_stretch × `fixed_s` + seq_stretch × (the unstretched simulated alone step − `fixed_s`)
// (DecodeFactorsUnderLoad's split: equal stretches when unsplit), for
// InstanceConfig::decode_batch_factors. `real` and `sim` as DecodeFactorsUnderLoad takes them.
// A batch size with fewer than `min_row_steps` real alone steps, or no simulated one, takes the
// factor of the largest smaller batch size that has one; the vector ends at the largest batch
// size that has one (the simulator holds its factor beyond). Weighted by the real counts, the
// factors of a least-squares split average 1 (its residuals sum to 0 with a per-step part), so
// they reshape the steps by batch size and move their total little. Empty when batch 1 has too
// few steps, `fixed_s` is negative, or a stretch is not positive and finite.
//
// Why: stop 26's traced rounds (a Zen 3 host, 2026-12-01) had the engine's decode step (+ loop)
// concave in the batch, 0.7-1.1 ms more for the second sequence and 0.4-0.8 ms for each further
// one, where the split, fitted mostly on the batches of one and two sequences that most steps
// are, added 0.9-1.4 ms for every one: the simulated steps of 3-6 sequences ran 15-40% longer
// than the real ones at every rate of four runs, and the simulated TPOT p90 was high
// (+3.4 / +4.9 / +8.5% on average at 20 / 40 / 60% load).
std::vector<double> DecodeBatchFactors(std::span<const BatchStepStats> real,
                                       std::span<const BatchStepStats> sim, double fixed_s,
                                       double step_stretch, double seq_stretch,
                                       int64_t min_row_steps);

// A decode instance's host slowness step by step, from its traced steps (start order) and the
// times its prompts' KV became ready (`kv_ready_s`, any order), for InstanceConfig::step_factors.
// A step counts when sequences waited for the step after it: it decodes and has no prefill chunk,
// the next one decodes too, and no KV became ready between the two (else the engine may have
// been idle, waiting for that prompt). Its factor is its time with the loop after it (to the next
// step's start) over the mean of its class (the same batch size and co-run mark), that mean being
// the class's mean step plus its mean loop gap over the gaps of at most `max_gap_s`, as
// SummarizeDecodeSteps and DecodeFactorsUnderLoad count them. So a class's factors average 1 over
// its short-gap steps, and a longer gap, the engine waiting for its core while sequences waited
// (which no latency model and no stretch holds), stays in its step's factor. In start order: a
// traced slow spell stays a run of large factors. Steps with no time (a factor of 0) are left
// out. Empty when no step counts.
std::vector<double> DecodeStepFactors(std::span<const StepRecord> steps,
                                      std::span<const double> kv_ready_s, double max_gap_s);

// A prefill instance's host slowness step by step, from its traced steps (start order), for
// InstanceConfig::step_factors: for each step that computed prompt tokens, its time over
// `model`'s time for them (a step of n chunks taken as n equal ones: the trace gives only the
// step's tokens), over the mean of that ratio among the steps of its co-run mark (the simulator
// applies its co-run factor apart, and the prefill stretch its mean). So each mark's factors
// average 1, and a traced slow spell stays a run of large factors. Steps the model gives no
// time are left out; empty when no step counts.
std::vector<double> PrefillStepFactors(std::span<const StepRecord> steps, const StepCoeffs& model);

// What a prefill model with one constant a step misses: per number of prompts (or chunks) c a
// step computed (element c-1), the real steps' mean time over the simulated ones' of c prompts,
// over the real steps' total time over the simulated ones' (the prefill stretch's busy ratio),
// for InstanceConfig::prefill_chunk_factors. `real` and `sim`: the traced and simulated steps of
// the same requests (steps without prompt tokens are left out; StepRecord::prefill_chunks). A
// count with fewer than `min_steps` real steps, or no simulated one, takes the factor of the
// largest smaller count that has one; the vector ends at the largest count that has one (the
// simulator holds its factor beyond). Weighted by the simulated busy time of each count, the
// factors average about 1, so they reshape the steps by prompt count and move the total little.
// Empty when one-prompt steps are too few, no larger count has its own factor (a level, which
// the stretch holds, and no shape), or either side has no time.
std::vector<double> PrefillChunkFactors(std::span<const StepRecord> real,
                                        std::span<const StepRecord> sim, int64_t min_steps);

// Real beside simulated, a line per batch size with steps on either side:
// "batch  real n  corun%  mean  alone  corun  gap | sim n  corun%  mean  alone  corun".
std::string FormatStepComparison(std::span<const BatchStepStats> real,
                                 std::span<const BatchStepStats> sim);

}  // namespace pd::planner
