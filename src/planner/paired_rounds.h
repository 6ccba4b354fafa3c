// `pdserve validate-sim`'s paired rule (issue #7): each compared bench round simulated with the
// factors of the calibration run taken just before it (the same rate, the same round; never data
// from the round itself), then per metric the median over the rounds of the simulated figure set
// beside the median over the rounds of the measured one. Why: the per-rate median of the
// calibration runs feeds one simulation, but single rounds fall into the host's slow spells (a run
// at 05:09, 20% load: two rounds at prefill p50 x1.37/x1.42 the model where the rate's
// calibration runs gave x1.20-1.32); a round's own calibration run, minutes apart at most, is
// likelier to share its spell than the median of three spread over the whole run.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "planner/metrics.h"
#include "planner/validate.h"

namespace pd::planner {

// A run's window on the traces' clock (seconds): a calibration run's or a compared round's.
struct RunWindow {
  double begin_s = 0.0, end_s = 0.0;
};

// For each compared round of one rate (in any order), the index of that rate's calibration run
// that ended last at or before the round began. InvalidArgument on a window that is not finite
// or ends before it begins; FailedPrecondition when a round has no run before it, or when two
// rounds would take the same run (each round must have its own, taken just before it: a shared
// one means a round's own run is missing).
Result<std::vector<size_t>> PairRunsWithRounds(std::span<const RunWindow> runs,
                                               std::span<const RunWindow> rounds);

// For each compared round of one rate (in any order), the index of that rate's calibration run
// that began first at or after the round ended, or none when no run did (the last round): the
// run after a round, which with PairRunsWithRounds' run before it brackets the round (a variant
// of the paired rule, printed beside it). InvalidArgument on a window that is not finite or ends
// before it begins.
Result<std::vector<std::optional<size_t>>> RunsAfterRounds(std::span<const RunWindow> runs,
                                                           std::span<const RunWindow> rounds);

// One rate under the paired rule: per round, its simulation beside its measurement, and per
// metric the median over the rounds of the simulated figures beside that of the measured ones
// (MedianSummary on each side).
struct PairedComparison {
  ComparisonRow row;
  std::vector<ComparisonRow> rounds;
};
// `simulated[k]` is round k's simulation, `measured[k]` its measurement. InvalidArgument when the
// two differ in size or are empty.
Result<PairedComparison> ComparePaired(double rate, std::span<const Summary> simulated,
                                       std::span<const Summary> measured);

// The machine against itself, for one rate: per round k, the median of the other rounds
// (MedianSummary) as `simulated` beside round k as `measured`. What the rounds give when one is
// held against the rest is as close as any model can be expected to come to a single round.
// InvalidArgument with fewer than two rounds.
Result<std::vector<ComparisonRow>> RoundsAgainstTheOthers(double rate,
                                                          std::span<const Summary> rounds);

// Cells of `rows` (5 per row: attainment, TTFT p50/p90, TPOT p50/p90) whose |sim/real - 1| is
// at most `tolerance` (0.10: issue 7's 10%).
int CellsWithin(std::span<const ComparisonRow> rows, double tolerance);

}  // namespace pd::planner
