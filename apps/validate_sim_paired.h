// `pdserve validate-sim`'s paired rule (issue #7; planner/paired_rounds.h): each compared round
// simulated with the factors of the calibration run of its rate taken just before it (the same
// rate, the same round; never data from the round itself), and per metric the median over the
// rounds of the simulated figure beside the median over the rounds of the measured one. Printed
// beside the per-rate-median rule (one simulation per rate with the median over its calibration
// runs) on the same rounds, with each round's pair and the cells within 10% under each rule;
// kPairedRuleUsed (apps/validate_sim_report.h) says which one is used. The simulated side holds
// no noise of its own: every simulation runs the rounds' requests (the same seed) and draws the
// outside latency with the same seed; only the calibration differs between rounds.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "apps/validate_sim_calibration.h"
#include "apps/validate_sim_flags.h"
#include "apps/validate_sim_rate_cal.h"
#include "apps/validate_sim_report.h"
#include "apps/validate_sim_simulate.h"
#include "planner/paired_rounds.h"
#include "planner/rate_calibration.h"

namespace pd::apps::validate_sim {

// Fills r->paired: each of r's rounds simulated (`n` requests, the rounds' seed) with the
// calibration `single` overlaid by the figures of the one calibration run (`runs`, their windows
// in `windows`) that ended last before the round began (planner::PairRunsWithRounds).
// `rate_cal`: the rate's runs combined (planner::CombineCalibrationRuns), whose decode batch
// factors, prefill chunk factors and pooled decode split over the runs together each feed a
// variant.
inline Status SimulatePaired(const ValidateFlags& f, const bench::DatasetSpec& spec,
                             const ValidateSlo& slo, const planner::StepCoeffs& coeffs,
                             int64_t kv_tokens, const planner::ClusterLinks& links,
                             const std::vector<planner::CalibrationRunFactors>& runs,
                             const std::vector<planner::RunWindow>& windows,
                             const Calibration& single, const planner::RateCalibration& rate_cal,
                             int n, RateReport* r) {
  const std::vector<double>& pooled_batch_factors = rate_cal.pooled_decode_batch_factors;
  const std::vector<double>& chunk_factors = rate_cal.prefill_chunk_factors;
  std::vector<planner::RunWindow> rounds;
  for (const RoundResult& rr : r->rounds) rounds.push_back({rr.begin_s, rr.end_s});
  if (windows.size() != runs.size()) return InvalidArgument("paired: a run without its window");
  ASSIGN_OR_RETURN(r->paired_runs, planner::PairRunsWithRounds(windows, rounds));
  ASSIGN_OR_RETURN(const auto runs_after, planner::RunsAfterRounds(windows, rounds));
  ASSIGN_OR_RETURN(const auto reqs, BenchRequests(spec, n, r->raw.rate, f.seed));
  std::vector<planner::Summary> simulated, measured, without_tail, with_batch, with_pooled_batch,
      without_factors, with_chunks, with_pooled_split, with_bracketed_split;
  planner::PerArrivalMeasure<std::vector<planner::Summary>> with_work;
  for (size_t k = 0; k < r->paired_runs.size(); ++k) {
    const std::vector<planner::CalibrationRunFactors> one = {runs[r->paired_runs[k]]};
    ASSIGN_OR_RETURN(const planner::RateCalibration rc,
                     planner::CombineCalibrationRuns(one, f.output_len));
    ASSIGN_OR_RETURN(const Calibration cal, ApplyRateCalibration(f, rc, single));
    ASSIGN_OR_RETURN(auto insts, CalibratedAt(f, coeffs, cal, kv_tokens, r->raw.rate));
    ASSIGN_OR_RETURN(planner::Summary s,
                     SimulateRate(insts, CalibratedLinks(links, cal), reqs, slo, cal.outside));
    simulated.push_back(s);
    measured.push_back(r->rounds[k].measured);
    if (cal.outside.has_tail()) {
      ASSIGN_OR_RETURN(planner::Summary w, SimulateRate(insts, CalibratedLinks(links, cal), reqs,
                                                        slo, cal.outside.WithoutTail()));
      without_tail.push_back(w);
    }
    // Without the decode instance's step factors (the run's traced slowness replayed in order).
    ASSIGN_OR_RETURN(planner::Summary p,
                     SimulateRate(WithoutStepFactors(insts), CalibratedLinks(links, cal), reqs, slo,
                                  cal.outside));
    without_factors.push_back(p);
    // The batch factors, the run's own and the rate's; a round without them takes the rule
    // used's simulation.
    const std::vector<double> own_factors = planner::RunDecodeBatchFactors(one[0]);
    for (const auto& [factors, into] : {std::pair{&own_factors, &with_batch},
                                        std::pair{&pooled_batch_factors, &with_pooled_batch}}) {
      if (factors->empty()) {
        into->push_back(s);
        continue;
      }
      ASSIGN_OR_RETURN(planner::Summary b,
                       SimulateRate(WithDecodeBatchFactors(insts, *factors),
                                    CalibratedLinks(links, cal), reqs, slo, cal.outside));
      into->push_back(b);
    }
    // The rate's pooled decode split at the round's run's level, and at the mean level of the
    // runs before and after the round; no pooled split or level: the rule used's simulation.
    // A round without a run after it takes its own run's level: the same simulation, reused.
    const auto at_pooled_split = [&](std::optional<double> level) -> Result<planner::Summary> {
      std::optional<planner::DecodeSplit> split;
      if (level && cal.decode_load) {
        ASSIGN_OR_RETURN(split, planner::PooledSplitAtLevel(rate_cal, *level));
      }
      if (!split) return s;
      Calibration moved = cal;
      moved.decode_load->stretch = split->step;
      moved.decode_load->seq_stretch = split->seq;
      ASSIGN_OR_RETURN(auto split_insts, CalibratedAt(f, coeffs, moved, kv_tokens, r->raw.rate));
      return SimulateRate(split_insts, CalibratedLinks(links, moved), reqs, slo, moved.outside);
    };
    const std::optional<double> own_level = planner::DecodeLevel(one[0]);
    const std::optional<double> bracketed_level =
        planner::BracketedDecodeLevel(one[0], runs_after[k] ? &runs[*runs_after[k]] : nullptr);
    ASSIGN_OR_RETURN(const planner::Summary at_own, at_pooled_split(own_level));
    with_pooled_split.push_back(at_own);
    if (bracketed_level == own_level) {
      with_bracketed_split.push_back(at_own);
    } else {
      ASSIGN_OR_RETURN(planner::Summary bracketed, at_pooled_split(bracketed_level));
      with_bracketed_split.push_back(bracketed);
    }
    // The prefill chunk factors over the rate's runs; none measured: the rule used's simulation.
    if (chunk_factors.empty()) {
      with_chunks.push_back(s);
    } else {
      ASSIGN_OR_RETURN(planner::Summary c,
                       SimulateRate(WithPrefillChunkFactors(insts, chunk_factors),
                                    CalibratedLinks(links, cal), reqs, slo, cal.outside));
      with_chunks.push_back(c);
    }
    // Every round; one whose calibration run measured no work takes the rule used's simulation.
    for (const planner::ArrivalMeasure m : planner::kAllArrivalMeasures) {
      auto& into = with_work[static_cast<size_t>(m)];
      if (!HasArrivalWork(cal, m)) {
        into.push_back(s);
        continue;
      }
      ASSIGN_OR_RETURN(auto worked,
                       CalibratedAt(f, coeffs, WithArrivalWork(cal, m), kv_tokens, r->raw.rate));
      ASSIGN_OR_RETURN(planner::Summary w,
                       SimulateRate(worked, CalibratedLinks(links, cal), reqs, slo, cal.outside));
      into.push_back(w);
    }
  }
  ASSIGN_OR_RETURN(r->paired, planner::ComparePaired(r->raw.rate, simulated, measured));
  if (without_tail.size() == simulated.size()) {
    ASSIGN_OR_RETURN(r->paired_without_tail,
                     planner::ComparePaired(r->raw.rate, without_tail, measured));
  }
  ASSIGN_OR_RETURN(r->paired_with_batch_factors,
                   planner::ComparePaired(r->raw.rate, with_batch, measured));
  ASSIGN_OR_RETURN(r->paired_with_pooled_batch_factors,
                   planner::ComparePaired(r->raw.rate, with_pooled_batch, measured));
  ASSIGN_OR_RETURN(r->paired_without_step_factors,
                   planner::ComparePaired(r->raw.rate, without_factors, measured));
  ASSIGN_OR_RETURN(r->paired_with_chunk_factors,
                   planner::ComparePaired(r->raw.rate, with_chunks, measured));
  ASSIGN_OR_RETURN(r->paired_with_pooled_split,
                   planner::ComparePaired(r->raw.rate, with_pooled_split, measured));
  ASSIGN_OR_RETURN(r->paired_with_bracketed_split,
                   planner::ComparePaired(r->raw.rate, with_bracketed_split, measured));
  for (size_t m = 0; m < planner::kArrivalMeasures; ++m) {
    ASSIGN_OR_RETURN(r->paired_with_arrival_work[m],
                     planner::ComparePaired(r->raw.rate, with_work[m], measured));
  }
  return OkStatus();
}

inline std::string PairCell(double sim, double real, double scale, const char* format) {
  char v[32], w[32], b[96];
  std::snprintf(v, sizeof(v), format, sim * scale);
  std::snprintf(w, sizeof(w), format, real * scale);
  std::snprintf(b, sizeof(b), "%s / %s (%+.1f%%)", v, w, 100 * planner::RelDiff(sim, real));
  return b;
}

// The rule not used beside the used one (same rounds), each round's pair, and the cells within
// 10% under each rule.
inline void PrintPaired(const std::vector<RateReport>& reports) {
  std::vector<planner::ComparisonRow> other, per_rate, paired;
  for (const RateReport& r : reports) {
    per_rate.push_back(r.per_rate_median);
    if (!r.paired) continue;
    paired.push_back(r.paired->row);
    other.push_back(kPairedRuleUsed ? r.per_rate_median : r.paired->row);
  }
  if (paired.size() != reports.size()) {
    std::printf("\nthe paired rule: not simulated at every rate (see the log)\n");
    return;
  }
  std::printf("\n%s (not used; the same rounds):\n%s",
              kPairedRuleUsed
                  ? "the per-rate-median rule: one simulation per rate with the median of its "
                    "calibration runs' figures"
                  : "the paired rule: each round simulated with the calibration run taken "
                    "just before it, the median over rounds of each simulated figure vs of "
                    "each measured one",
              planner::FormatComparison(other).c_str());
  std::printf("paired, per round: simulated / measured (sim/real - 1):\n");
  for (const RateReport& r : reports) {
    for (size_t k = 0; k < r.paired->rounds.size(); ++k) {
      const planner::Summary& s = r.paired->rounds[k].simulated;
      const planner::Summary& m = r.paired->rounds[k].measured;
      std::printf(
          "  %-6.3g round %zu (calibration run %zu): att %s, TTFT p50 %s p90 %s ms, TPOT p50 %s "
          "p90 %s ms\n",
          r.raw.rate, k + 1, r.paired_runs[k] + 1,
          PairCell(s.attainment, m.attainment, 100, "%.1f").c_str(),
          PairCell(s.ttft_p50_s, m.ttft_p50_s, 1e3, "%.2f").c_str(),
          PairCell(s.ttft_p90_s, m.ttft_p90_s, 1e3, "%.2f").c_str(),
          PairCell(s.tpot_p50_s, m.tpot_p50_s, 1e3, "%.3f").c_str(),
          PairCell(s.tpot_p90_s, m.tpot_p90_s, 1e3, "%.3f").c_str());
    }
  }
  std::printf(
      "cells within %.0f%% of %zu: per-rate median %d, paired %d (used: %s)\n",
      100 * kCellTolerance, 5 * reports.size(), planner::CellsWithin(per_rate, kCellTolerance),
      planner::CellsWithin(paired, kCellTolerance), kPairedRuleUsed ? "paired" : "per-rate median");
  // The paired rule without the tails, and with the prefill arrival work by each measure, on
  // the same rounds.
  const auto print_paired = [&](const std::string& label, const auto& which) {
    std::vector<planner::ComparisonRow> variant, variant_rounds, used_rounds;
    for (const RateReport& r : reports) {
      const std::optional<planner::PairedComparison>& got = which(r);
      if (!got) continue;
      variant.push_back(got->row);
      variant_rounds.insert(variant_rounds.end(), got->rounds.begin(), got->rounds.end());
      used_rounds.insert(used_rounds.end(), r.paired->rounds.begin(), r.paired->rounds.end());
    }
    if (variant.size() != reports.size()) return;
    std::printf("paired, %s (not used):\n%s", label.c_str(),
                planner::FormatComparison(variant).c_str());
    std::printf(
        "cells within %.0f%% of %zu so (not used): %d; per round, of %zu: %d against %d with "
        "the rule used\n",
        100 * kCellTolerance, 5 * reports.size(), planner::CellsWithin(variant, kCellTolerance),
        5 * variant_rounds.size(), planner::CellsWithin(variant_rounds, kCellTolerance),
        planner::CellsWithin(used_rounds, kCellTolerance));
  };
  for (const auto& [label, member] :
       {std::pair{"without the last token's way out less the first's at each request's end",
                  &RateReport::paired_without_tail},
        std::pair{"with the decode batch factors, each round's calibration run's own",
                  &RateReport::paired_with_batch_factors},
        std::pair{"with the decode batch factors over the rate's runs together",
                  &RateReport::paired_with_pooled_batch_factors},
        std::pair{"without the decode step factors", &RateReport::paired_without_step_factors},
        std::pair{"with the prefill chunk factors over the rate's runs together",
                  &RateReport::paired_with_chunk_factors},
        std::pair{"with the decode split over the rate's runs together, at each round's run's "
                  "level",
                  &RateReport::paired_with_pooled_split},
        std::pair{"with the same split at the mean level of the runs before and after each round",
                  &RateReport::paired_with_bracketed_split}}) {
    print_paired(
        label, [member = member](const RateReport& r) -> const auto& { return r.*member; });
  }
  for (const planner::ArrivalMeasure m : planner::kAllArrivalMeasures) {
    print_paired(
        std::string("with the prefill arrival work, ") + planner::ArrivalMeasureKey(m) +
            " (and the prefill stretch with it left out of the busy time)",
        [m](const RateReport& r) -> const auto& {
          return r.paired_with_arrival_work[static_cast<size_t>(m)];
        });
  }
  // The step factors' share: the per-rate-median rule with the prefill instance's too, and
  // without any; and the other variants printed beside it.
  const auto print_plain = [&](const std::string& label, const auto& which) {
    std::vector<planner::ComparisonRow> plain;
    for (const RateReport& r : reports) {
      const std::optional<planner::Summary>& got = which(r);
      if (!got) continue;
      const planner::Summary& s = *got;
      const planner::Summary& m = r.per_rate_median.measured;
      plain.push_back({r.raw.rate, s, m});
      std::printf("  %-6.3g %s: att %s, TTFT p50 %s p90 %s ms, TPOT p50 %s p90 %s ms\n", r.raw.rate,
                  label.c_str(), PairCell(s.attainment, m.attainment, 100, "%.1f").c_str(),
                  PairCell(s.ttft_p50_s, m.ttft_p50_s, 1e3, "%.2f").c_str(),
                  PairCell(s.ttft_p90_s, m.ttft_p90_s, 1e3, "%.2f").c_str(),
                  PairCell(s.tpot_p50_s, m.tpot_p50_s, 1e3, "%.3f").c_str(),
                  PairCell(s.tpot_p90_s, m.tpot_p90_s, 1e3, "%.3f").c_str());
    }
    if (!plain.empty()) {
      std::printf("cells within %.0f%% of %zu %s (not used): %d\n", 100 * kCellTolerance,
                  5 * plain.size(), label.c_str(), planner::CellsWithin(plain, kCellTolerance));
    }
  };
  for (const auto& [label, member] :
       {std::pair{"with the prefill step factors too", &RateReport::with_prefill_factors},
        std::pair{"without any step factors", &RateReport::without_step_factors},
        std::pair{"without the way in drawn per request", &RateReport::without_inbound_hop},
        std::pair{"with the median run's own decode split", &RateReport::own_split},
        std::pair{"without the prefill loop gap", &RateReport::without_loop_gap},
        std::pair{"without the last token's way out less the first's", &RateReport::without_tail},
        std::pair{"with the decode batch factors over the rate's runs together",
                  &RateReport::with_batch_factors}}) {
    print_plain(
        label, [member = member](const RateReport& r) -> const auto& { return r.*member; });
  }
  for (const planner::ArrivalMeasure m : planner::kAllArrivalMeasures) {
    print_plain(
        std::string("with the prefill arrival work, ") + planner::ArrivalMeasureKey(m),
        [m](const RateReport& r) -> const auto& {
          return r.with_arrival_work[static_cast<size_t>(m)];
        });
  }
  // Whether the pairing tracks the rounds' spells, and how near the machine comes to itself.
  const PerRoundCells c = CountPerRoundCells(reports);
  std::printf(
      "per round, cells within %.0f%% of %d: each round against its own paired simulation %d, "
      "against the per-rate median's simulation %d, against the median of its rate's other "
      "rounds (the machine against itself) %d\n",
      100 * kCellTolerance, c.of, c.paired, c.per_rate_median, c.others);
}

}  // namespace pd::apps::validate_sim
