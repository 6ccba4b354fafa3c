#include "planner/paired_rounds.h"

#include <cmath>
#include <string>

#include "planner/validate_stats.h"

namespace pd::planner {
namespace {

Status CheckWindow(const RunWindow& w, const char* what, size_t i) {
  if (!std::isfinite(w.begin_s) || !std::isfinite(w.end_s) || w.end_s < w.begin_s) {
    return InvalidArgument(std::string(what) + " " + std::to_string(i) +
                           ": window not finite or ending before it begins");
  }
  return OkStatus();
}

}  // namespace

Result<std::vector<size_t>> PairRunsWithRounds(std::span<const RunWindow> runs,
                                               std::span<const RunWindow> rounds) {
  for (size_t i = 0; i < runs.size(); ++i) RETURN_IF_ERROR(CheckWindow(runs[i], "run", i));
  for (size_t i = 0; i < rounds.size(); ++i) RETURN_IF_ERROR(CheckWindow(rounds[i], "round", i));
  std::vector<size_t> out;
  std::vector<bool> taken(runs.size(), false);
  for (size_t k = 0; k < rounds.size(); ++k) {
    bool found = false;
    size_t best = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].end_s > rounds[k].begin_s) continue;
      if (!found || runs[i].end_s > runs[best].end_s) best = i;
      found = true;
    }
    if (!found) {
      return FailedPrecondition("round " + std::to_string(k) + ": no calibration run before it");
    }
    if (taken[best]) {
      return FailedPrecondition("round " + std::to_string(k) + ": calibration run " +
                                std::to_string(best) + " is another round's");
    }
    taken[best] = true;
    out.push_back(best);
  }
  return out;
}

Result<std::vector<std::optional<size_t>>> RunsAfterRounds(std::span<const RunWindow> runs,
                                                           std::span<const RunWindow> rounds) {
  for (size_t i = 0; i < runs.size(); ++i) RETURN_IF_ERROR(CheckWindow(runs[i], "run", i));
  for (size_t i = 0; i < rounds.size(); ++i) RETURN_IF_ERROR(CheckWindow(rounds[i], "round", i));
  std::vector<std::optional<size_t>> out;
  for (const RunWindow& round : rounds) {
    std::optional<size_t> first;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].begin_s < round.end_s) continue;
      if (!first || runs[i].begin_s < runs[*first].begin_s) first = i;
    }
    out.push_back(first);
  }
  return out;
}

Result<PairedComparison> ComparePaired(double rate, std::span<const Summary> simulated,
                                       std::span<const Summary> measured) {
  if (simulated.empty() || simulated.size() != measured.size()) {
    return InvalidArgument("paired: " + std::to_string(simulated.size()) + " simulations for " +
                           std::to_string(measured.size()) + " rounds");
  }
  PairedComparison out;
  out.row = {rate, MedianSummary(simulated), MedianSummary(measured)};
  for (size_t k = 0; k < simulated.size(); ++k) {
    out.rounds.push_back({rate, simulated[k], measured[k]});
  }
  return out;
}

Result<std::vector<ComparisonRow>> RoundsAgainstTheOthers(double rate,
                                                          std::span<const Summary> rounds) {
  if (rounds.size() < 2) {
    return InvalidArgument("rounds against the others: " + std::to_string(rounds.size()) +
                           " round(s), at least 2 needed");
  }
  std::vector<ComparisonRow> out;
  for (size_t k = 0; k < rounds.size(); ++k) {
    std::vector<Summary> others;
    for (size_t j = 0; j < rounds.size(); ++j) {
      if (j != k) others.push_back(rounds[j]);
    }
    out.push_back({rate, MedianSummary(others), rounds[k]});
  }
  return out;
}

int CellsWithin(std::span<const ComparisonRow> rows, double tolerance) {
  int n = 0;
  for (const ComparisonRow& r : rows) {
    const Summary& s = r.simulated;
    const Summary& m = r.measured;
    for (double d : {RelDiff(s.attainment, m.attainment), RelDiff(s.ttft_p50_s, m.ttft_p50_s),
                     RelDiff(s.ttft_p90_s, m.ttft_p90_s), RelDiff(s.tpot_p50_s, m.tpot_p50_s),
                     RelDiff(s.tpot_p90_s, m.tpot_p90_s)}) {
      if (std::fabs(d) <= tolerance) ++n;
    }
  }
  return n;
}

}  // namespace pd::planner
