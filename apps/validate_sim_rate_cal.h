// `pdserve validate-sim`'s under-load calibration per compared rate (issue #7): in every round,
// just before each rate's compared bench run, a traced calibration run of CalRunPrompts
// requests at that rate (another seed than the rounds, a new one per round; not compared).
// Per rate, each figure the calibrated simulation takes from running under load is the median
// over that rate's runs (planner::CombineCalibrationRuns): the bench client's and router's CPU
// per request, the prefill steps' stretch (traced prefill busy time against the calibrated
// simulation of the same requests with unstretched prefill steps: planner::PrefillBusyStretch;
// it replaces the client's-CPU-share stretch, which put the prefill steps at x1.03-1.08 where the
// traced ones ran x1.1-1.5 the probes' model), the decode stretch and co-run factor (traced
// decode steps against the same simulation, as apps/validate_sim_decode_load.h), and the
// per-request latency outside the engines (the median run's sample, as
// apps/validate_sim_outside.h); and the decode instance's step factors
// (planner::DecodeStepFactors: each traced step over its class's mean, in start order; the
// rate's runs' sequences one after another), which the simulated decode instance replays step by
// step (InstanceConfig::step_factors). They carry the host's slow spells, which the means leave
// out: in a traced run the decode steps' time over their batch size's median, averaged over
// windows of 16-48 consecutive steps (a request's answer), spread p90/p50 1.14-1.30 in their
// order and 1.08-1.19 shuffled, and the real TPOT p90 ran 1.3-1.5x its p50 where the simulation
// without them gave 1.21. Over the final build's twelve runs (2026-11-30 10:53-11:51) TPOT p90
// was within 10% at 20 of 36 rates with them and at 17 without (median error 7.0% vs 11.8%). The
// prefill instance's (planner::PrefillStepFactors) are printed beside, not used: TTFT p90 was
// within 10% at 11 of 36 rates with them and at 16 with the decode ones alone, and near
// saturation a replayed spell took it to +55-121%. The prefill step spread per
// rate (each step drawn from the median run's spread around the runs' median step ratio) was
// printed beside it at 05:09 (8 of 15 cells vs 7) and dropped. ApplyRateCalibration also serves
// the paired rule (apps/validate_sim_paired.h), one run at a time.
//
// Why: the single load run (300 requests at the highest rate, before the rounds) gave all of it
// for every rate; at 03:22 it caught a slow spell (decode alone steps of batch 1 0.735 ms where
// the nine rounds ran 0.570-0.688, prefill steps p50 x1.21 / p90 x1.82 their model against
// x1.07-1.20 / x1.27-1.90, outside latency p90 7.6 ms against 4.3-5.6) and every rate was
// simulated with that spell: ~9 of 15 cells within 10%. A median over three runs spread over the
// run's length drops one such spell; a run at each rate measures each rate's own figures (the
// client's CPU per request and the decode batch mix differ by rate) instead of scaling the top
// rate's. The median run's outside sample, rather than the three pooled: a pooled sample keeps a
// third of a slow spell's tail. The rules are fixed here, before any compared round, and never
// look at a compared round. The single load run still runs: its figures stand in for any a
// rate's runs could not give and are printed beside the per-rate ones; its simulation, printed
// beside until Q12 (04:55: 10 vs 10 of 15 cells within 10%, 05:09, rounds spread 29-46%: 7 vs
// 1), no longer is.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/validate_sim_calibration.h"
#include "apps/validate_sim_decode_load.h"
#include "apps/validate_sim_flags.h"
#include "apps/validate_sim_outside.h"
#include "apps/validate_sim_report.h"
#include "planner/metrics.h"
#include "planner/rate_calibration.h"
#include "planner/ttft_parts.h"
#include "planner/validate_stats.h"

namespace pd::apps::validate_sim {

// 100 requests: three per rate add ~40 s at 20/40/60% of ~65 req/s (within quiet.sh's limit),
// and pooled they are one old load run's 300.
inline constexpr int kCalRunPrompts = 100;
// A calibration run's requests: kCalRunPrompts, or more when the rounds run more, so that a
// rate's runs together hold as many requests as a round (the step factors they give are replayed
// over a round, and repeat from the start when they run out).
inline int CalRunPrompts(const ValidateFlags& f) {
  return std::max(kCalRunPrompts, (f.max_prompts + f.rounds - 1) / std::max(1, f.rounds));
}
// The old load run's minimum step counts (500 alone, 200 co-run over 300 requests) per 100.
inline constexpr int64_t kMinCalRunSteps = 150;
inline constexpr int64_t kMinCalRunCorun = 60;
inline constexpr int64_t kMinCalRunPrefillSteps = 50;  // 100 requests took 60-100 prefill steps
// Back-to-back prefill steps for the loop gap (a 600-request round at 60% load had ~2,400).
inline constexpr int64_t kMinCalRunLoopGaps = 20;
// Prefill steps a request came during, and free ones, for the arrival work (a 120-request run at
// 20% load had ~25 of the first; ~20 at the least).
inline constexpr int64_t kMinCalRunArrivalSteps = 10;

// The seed of round `round`'s calibration runs: neither the rounds' (f.seed), the reseeded
// simulations' (f.seed + 1..sampling_seeds), the warm-up's nor the load run's.
inline uint64_t CalRunSeed(const ValidateFlags& f, int round) {
  return f.seed + 104729 + 1009ull * (round + 1);
}

// The prefill steps' stretch under load on one calibration run: its traced prefill steps against
// the calibrated simulation of its requests with unstretched prefill steps
// (planner::PrefillBusyStretch), over the whole traced busy time and, with `left_out_s[m]` (the
// arrival work by measure m, planner::PrefillArrivalWork::total_s), also over that time less
// it: the same simulation serves all.
struct PrefillUnderLoad {
  Result<double> whole = FailedPrecondition("not measured");
  planner::PerArrivalMeasure<std::optional<double>> left_out;
  // The traced steps in the run's window and the unstretched simulation's (PrefillChunkFactors).
  std::vector<planner::StepRecord> real, simulated;
};
inline Result<PrefillUnderLoad> MeasurePrefillUnderLoad(
    const ValidateFlags& f, const bench::DatasetSpec& spec, const planner::StepCoeffs& coeffs,
    int64_t kv_tokens, const planner::ClusterLinks& links, const ValidateSlo& slo,
    const LoadRunCpu& run, const Calibration& cal, const TracedSteps& steps,
    const planner::PerArrivalMeasure<std::optional<double>>& left_out_s) {
  Calibration unstretched = cal;
  unstretched.prefill_load = Calibration::DecodeUnderLoad{1.0, run.rate, 1.0};
  ASSIGN_OR_RETURN(planner::SimResult sim, SimulatedRunSteps(f, spec, coeffs, kv_tokens, links, slo,
                                                             run, cal, unstretched));
  PrefillUnderLoad out;
  out.real = InWindow(steps.prefill, run.begin_s, run.end_s);
  out.simulated = planner::StepsOfInstance(sim, 0);
  out.whole = planner::PrefillBusyStretch(out.real, out.simulated, kMinCalRunPrefillSteps);
  for (size_t m = 0; m < planner::kArrivalMeasures; ++m) {
    if (!left_out_s[m]) continue;
    auto k = planner::PrefillBusyStretch(out.real, out.simulated, kMinCalRunPrefillSteps,
                                         *left_out_s[m]);
    if (k.ok()) out.left_out[m] = *k;
  }
  return out;
}

// One calibration run's figures (`probes`: the calibration from the probe sets alone).
inline planner::CalibrationRunFactors FactorsOfRun(
    const ValidateFlags& f, const bench::DatasetSpec& spec, const planner::StepCoeffs& coeffs,
    int64_t kv_tokens, const planner::ClusterLinks& links, const ValidateSlo& slo,
    const LoadRunCpu& run, const Calibration& probes, const Result<TracedSteps>& steps,
    const Result<std::vector<planner::TracedRequest>>& traced) {
  planner::CalibrationRunFactors out;
  out.rate = run.rate;
  auto cpu = planner::LoadedClientCpuCost(probes.client_cpu, run.cpu_s, run.requests,
                                          run.mean_output_tokens);
  if (cpu.ok()) out.client_cpu = *cpu;
  Calibration cal = probes;
  cal.client_cpu_loaded = out.client_cpu;
  if (steps.ok()) {
    // The arrival work (printed beside), with the stretch that leaves it out of the busy time.
    std::optional<planner::PrefillArrivalWork> work;
    if (traced.ok()) {
      auto w = planner::MeasurePrefillArrivalWork(InWindow(steps->prefill, run.begin_s, run.end_s),
                                                  *traced, coeffs, kMinCalRunArrivalSteps);
      if (w.ok()) work = *w;
    }
    planner::PerArrivalMeasure<std::optional<double>> left_out_s;
    for (const planner::ArrivalMeasure m : planner::kAllArrivalMeasures) {
      if (work) left_out_s[static_cast<size_t>(m)] = work->total_s(m);
    }
    auto p = MeasurePrefillUnderLoad(f, spec, coeffs, kv_tokens, links, slo, run, cal, *steps,
                                     left_out_s);
    if (p.ok() && p->whole.ok()) out.prefill_stretch = *p->whole;
    if (p.ok()) {
      out.prefill_real_steps = std::move(p->real);
      out.prefill_sim_steps = std::move(p->simulated);
      out.prefill_arrival = work;
      for (const planner::ArrivalMeasure m : planner::kAllArrivalMeasures) {
        const size_t k = static_cast<size_t>(m);
        if (!p->left_out[k]) continue;
        out.prefill_stretch_left_out[k] = p->left_out[k];
        out.prefill_arrival_work_s[k] = work->Work(m);
      }
    }
    DecodeRows rows;
    auto m = MeasureDecodeUnderLoad(f, spec, coeffs, kv_tokens, links, slo, run, cal, steps->decode,
                                    kMinCalRunSteps, &rows);
    if (m.ok()) {
      out.decode_real_rows = std::move(rows.real);
      out.decode_sim_rows = std::move(rows.sim);
      out.decode_fixed_s = rows.fixed_s;
      out.decode_stretch = m->step_stretch;
      out.decode_seq_stretch = m->seq_stretch;
      out.decode_alone_stretch = m->stretch;
      if (m->corun_steps >= kMinCalRunCorun) out.decode_corun = m->corun;
    }
  }
  if (steps.ok() && traced.ok()) {
    std::vector<double> ready;
    for (const planner::TracedRequest& r : *traced) ready.push_back(r.kv_ready_s);
    std::vector<double> k = planner::DecodeStepFactors(
        InWindow(steps->decode, run.begin_s, run.end_s), ready, kMaxLoopGapS);
    if (static_cast<int64_t>(k.size()) >= kMinCalRunSteps) out.decode_step_factors = std::move(k);
    const std::vector<planner::StepRecord> prefill =
        InWindow(steps->prefill, run.begin_s, run.end_s);
    std::vector<double> p = planner::PrefillStepFactors(prefill, coeffs);
    if (static_cast<int64_t>(p.size()) >= kMinCalRunPrefillSteps) {
      out.prefill_step_factors = std::move(p);
    }
    auto gap = planner::PrefillLoopGap(prefill, *traced, kMaxLoopGapS, kMinCalRunLoopGaps);
    if (gap.ok()) out.prefill_loop_gap_s = *gap;
  }
  if (traced.ok() && !run.client.empty()) {
    auto j = JoinRun(run.client, TracedIn(*traced, run.begin_s, run.end_s));
    if (j.ok() && j->outside_s.size() >= kMinJoinedShare * run.client.size()) {
      out.outside_s = j->outside_s;
      out.inbound_s = j->inbound_s;
      out.tail_s = j->tail_s;
    }
  }
  return out;
}

template <typename One>
std::string Each(const std::vector<planner::CalibrationRunFactors>& runs, One one) {
  std::string s;
  for (const auto& r : runs) s += (s.empty() ? "" : "/") + one(r);
  return s;
}
// Factors by count from 1: "1 x0.999, 2 x1.047".
inline std::string NumberedFactors(const std::vector<double>& factors) {
  std::string out;
  for (size_t k = 0; k < factors.size(); ++k) {
    char one[48];
    std::snprintf(one, sizeof(one), "%s%zu x%.3f", k ? ", " : "", k + 1, factors[k]);
    out += one;
  }
  return out;
}

inline std::string Fmt(const char* format, double v) {
  char b[32];
  std::snprintf(b, sizeof(b), format, v);
  return b;
}

inline double Mean(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m += x;
  return v.empty() ? 0.0 : m / v.size();
}
// A sequence of step factors, summarised (all 0 when empty); `spread` is the mean of |k - 1|.
struct FactorQuantiles {
  double mean = 0, spread = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  explicit FactorQuantiles(const std::vector<double>& k) {
    if (k.empty()) return;
    mean = Mean(k);
    for (double x : k) spread += std::abs(x - 1) / k.size();
    p50 = planner::Percentile(k, 0.5);
    p90 = planner::Percentile(k, 0.9);
    p99 = planner::Percentile(k, 0.99);
    max = *std::max_element(k.begin(), k.end());
  }
};
// "p50 a p90 b p99 c max d" of step factors, or "-" when none.
inline std::string FactorSummary(const std::vector<double>& k) {
  if (k.empty()) return "-";
  const FactorQuantiles q(k);
  char b[96];
  std::snprintf(b, sizeof(b), "p50 %.2f p90 %.2f p99 %.2f max %.1f", q.p50, q.p90, q.p99, q.max);
  return b;
}

// The per-rate figures: per run, their median, and the single load run's.
inline void PrintRateCalibration(const ValidateFlags& f,
                                 const std::vector<planner::CalibrationRunFactors>& runs,
                                 const planner::RateCalibration& rc, const Calibration& cal,
                                 const Calibration& single) {
  double single_prefill = 0.0;
  if (auto k =
          planner::BackgroundCpuStretch(single.StretchCpu(), rc.rate, f.output_len, MachineCores());
      k.ok()) {
    single_prefill = *k;
  }
  double single_stretch = 0.0;
  if (single.decode_load) {
    auto s = planner::StretchAtRate(single.decode_load->stretch, single.decode_load->rate, rc.rate);
    if (s.ok()) single_stretch = *s;
  }
  std::printf(
      "  %.3g req/s, %d runs: client + router CPU per request %s ms -> %.3f (single load run "
      "%.3f); prefill stretch %s -> x%.3f (%d runs; single: the client's CPU share x%.3f); "
      "decode stretch per step %s -> x%.3f (%d runs; single x%.3f scaled to this rate), per "
      "sequence %s -> x%.3f (run %d's pair: the median by the unsplit %s); co-run %s "
      "-> x%.3f (%d runs; single x%.3f); outside mean %s ms -> run %d's %zu: p50 %.2f p90 %.2f "
      "(single p50 %.2f p90 %.2f), its way in %s; decode step factors, mean %s -> the %d runs' "
      "%zu in turn: %s; "
      "prefill step factors, mean distance from 1 %s -> the %d runs' %zu in turn: %s\n",
      rc.rate, rc.runs,
      Each(runs,
           [&](const planner::CalibrationRunFactors& r) {
             return r.client_cpu ? Fmt("%.3f", r.client_cpu->Seconds(f.output_len) * 1e3) : "-";
           })
          .c_str(),
      cal.StretchCpu().Seconds(f.output_len) * 1e3, single.StretchCpu().Seconds(f.output_len) * 1e3,
      Each(runs,
           [](const planner::CalibrationRunFactors& r) {
             return r.prefill_stretch ? Fmt("x%.3f", *r.prefill_stretch) : "-";
           })
          .c_str(),
      cal.prefill_load ? cal.prefill_load->stretch : 0.0, rc.prefill_runs, single_prefill,
      Each(runs,
           [](const planner::CalibrationRunFactors& r) {
             return r.decode_stretch ? Fmt("x%.3f", *r.decode_stretch) : "-";
           })
          .c_str(),
      cal.decode_load ? cal.decode_load->stretch : 0.0, rc.stretch_runs, single_stretch,
      Each(runs,
           [](const planner::CalibrationRunFactors& r) {
             return r.decode_seq_stretch ? Fmt("x%.3f", *r.decode_seq_stretch) : "-";
           })
          .c_str(),
      cal.decode_load ? cal.decode_load->seq_stretch : 0.0,
      rc.decode_run ? static_cast<int>(*rc.decode_run) + 1 : 0,
      Each(runs,
           [](const planner::CalibrationRunFactors& r) {
             return r.decode_alone_stretch ? Fmt("x%.3f", *r.decode_alone_stretch) : "-";
           })
          .c_str(),
      Each(runs,
           [](const planner::CalibrationRunFactors& r) {
             return r.decode_corun ? Fmt("x%.3f", *r.decode_corun) : "-";
           })
          .c_str(),
      cal.overheads.corun_decode, rc.corun_runs, single.overheads.corun_decode,
      Each(runs,
           [](const planner::CalibrationRunFactors& r) {
             return r.outside_s.empty() ? std::string("-") : Fmt("%.2f", Mean(r.outside_s) * 1e3);
           })
          .c_str(),
      rc.outside_run ? static_cast<int>(*rc.outside_run) + 1 : 0, rc.outside_s.size(),
      cal.outside.Quantile(0.5) * 1e3, cal.outside.Quantile(0.9) * 1e3,
      single.outside.Quantile(0.5) * 1e3, single.outside.Quantile(0.9) * 1e3,
      WayInSummary(cal.outside).c_str(),
      Each(runs,
           [](const planner::CalibrationRunFactors& r) {
             return r.decode_step_factors.empty() ? std::string("-")
                                                  : Fmt("%.3f", Mean(r.decode_step_factors));
           })
          .c_str(),
      rc.step_factor_runs, rc.decode_step_factors.size(),
      FactorSummary(rc.decode_step_factors).c_str(),
      Each(runs,
           [](const planner::CalibrationRunFactors& r) {
             return r.prefill_step_factors.empty()
                        ? std::string("-")
                        : Fmt("%.3f", FactorQuantiles(r.prefill_step_factors).spread);
           })
          .c_str(),
      rc.prefill_factor_runs, rc.prefill_step_factors.size(),
      FactorSummary(rc.prefill_step_factors).c_str());
}

// `single` (the probes with the single load run's figures) with each figure `rc` gave replaced by
// it; a figure `rc` lacks stays the single load run's.
inline Result<Calibration> ApplyRateCalibration(const ValidateFlags& f,
                                                const planner::RateCalibration& rc,
                                                const Calibration& single) {
  Calibration cal = single;
  if (rc.client_cpu) cal.client_cpu_loaded = rc.client_cpu;
  if (rc.prefill_stretch) {
    cal.prefill_load = Calibration::DecodeUnderLoad{*rc.prefill_stretch, rc.rate, 1.0};
  }
  const double corun_probes =
      single.decode_load ? single.decode_load->corun_probes : single.overheads.corun_decode;
  if (rc.decode_stretch) {
    cal.decode_load =
        Calibration::DecodeUnderLoad{*rc.decode_stretch, rc.rate, corun_probes,
                                     rc.decode_seq_stretch.value_or(*rc.decode_stretch)};
  }
  if (rc.decode_corun && f.corun)
    cal.overheads.corun_decode = std::clamp(*rc.decode_corun, 1.0, 4.0);
  if (!rc.decode_step_factors.empty()) {
    cal.decode_step_factors = std::make_shared<const std::vector<double>>(rc.decode_step_factors);
  }
  if (!rc.prefill_step_factors.empty()) {
    cal.prefill_step_factors = std::make_shared<const std::vector<double>>(rc.prefill_step_factors);
  }
  if (rc.prefill_loop_gap_s) cal.prefill_loop_gap_s = *rc.prefill_loop_gap_s;
  cal.measured_arrival_work_s = rc.prefill_arrival_work_s;
  cal.prefill_stretch_left_out = rc.prefill_stretch_left_out;
  if (!rc.outside_s.empty()) {
    ASSIGN_OR_RETURN(cal.outside, planner::OutsideLatency::SampledWithInbound(
                                      rc.outside_s, rc.inbound_s, f.seed, rc.tail_s));
    cal.outside_rule = "drawn per request from this rate's median calibration run's";
  }
  return cal;
}

// `cal` with the prefill arrival work placed where it comes (printed beside the rule used): the
// simulated prefill instance's InstanceConfig::arrival_work_s the measured work, and its stretch
// the one with that work left out of the traced busy time. `cal` as it is when neither was
// measured (a run that measured no work gave no stretch without it).
//
// Why not used: over six runs (2026-12-01 08:34-09:20, bench/planner/sim_vs_real_runs.sh 6,
// this as the rule used and the rule without it beside on the same rounds) the cells within
// 10% were 76 of 90 either way (all 15 in 2 runs with it, 1 without), the rounds' cells 336
// against 343 of 450 without. It brought TTFT p90 nearer at 20% and 40% load (mean error -5.4%
// and -1.1% against -7.7% and -4.1%) and took TTFT farther at 60% (p50 +5.4% against +3.1%,
// p90 +6.7% against +3.4%): the measured work (a rate's median 0.08-0.54 ms a request, about as
// much at 60% load as at 20%) is too much where steps run back to back.
//
// Stop 26 weighs two more measures beside it (planner::ArrivalMeasure: kHeld, kOwnFit). Over
// four runs on a Zen 3 host with steps four times longer (2026-12-01 19:29-21:23), the three
// measures had 50 / 50 / 49 of 60 cells within 10% against the rule used's 49, and 194 / 193 /
// 194 rounds' cells of 300 against 190: a margin under one run's noise, so none is used.
inline bool HasArrivalWork(const Calibration& cal, planner::ArrivalMeasure m) {
  const size_t k = static_cast<size_t>(m);
  return cal.measured_arrival_work_s[k] && cal.prefill_stretch_left_out[k];
}
inline Calibration WithArrivalWork(Calibration cal, planner::ArrivalMeasure m) {
  if (!HasArrivalWork(cal, m)) return cal;
  const size_t k = static_cast<size_t>(m);
  cal.prefill_arrival_work_s = *cal.measured_arrival_work_s[k];
  if (cal.prefill_load) cal.prefill_load->stretch = *cal.prefill_stretch_left_out[k];
  return cal;
}

// The calibration at one rate: ApplyRateCalibration with the median over this rate's
// calibration runs (`rc`: planner::CombineCalibrationRuns of `runs`), its decode stretch split over
// the runs together where they give that (RateCalibration::pooled_decode_stretch). Prints the
// per-run figures and their medians beside the single load run's. `own_split` gets the same
// calibration with the median run's own split (not used; printed beside), or stays unset when the
// pooled split is not taken.
//
// Why the pooled split: one 100-request run's split scatters (per sequence x1.05-1.75 in stop
// 16; at one rate x0.95-1.35 in one run of 2026-11-30), and its per-sequence factor carries the
// larger batches, which decide TPOT p90 at 40-60% load. The split over the runs together stayed
// within x1.04-1.22. Printed beside the median run's own split over 18 runs (17:44-18:51): 251
// cells within 10% against 248, all 15 in 6 runs against 5.
inline Result<Calibration> CalibrationAtRate(
    const ValidateFlags& f, const std::vector<planner::CalibrationRunFactors>& runs,
    const planner::RateCalibration& rc, const Calibration& single, nlohmann::json* json,
    std::optional<Calibration>* own_split) {
  ASSIGN_OR_RETURN(Calibration cal, ApplyRateCalibration(f, rc, single));
  PrintRateCalibration(f, runs, rc, cal, single);
  own_split->reset();
  if (rc.pooled_decode_stretch && cal.decode_load) {
    *own_split = cal;
    cal.decode_load->stretch = *rc.pooled_decode_stretch;
    cal.decode_load->seq_stretch = *rc.pooled_decode_seq_stretch;
    std::printf(
        "    the decode split over the %d runs together, at the median run's level (used): per "
        "step x%.3f, per sequence x%.3f\n",
        rc.pooled_split_runs, *rc.pooled_decode_stretch, *rc.pooled_decode_seq_stretch);
  }
  cal.measured_batch_factors = rc.pooled_decode_batch_factors;
  if (!cal.measured_batch_factors.empty()) {
    std::printf(
        "    decode steps by batch size, real over the split, the %d runs together (not used): %s "
        "(larger batches as the last)\n",
        rc.pooled_split_runs, NumberedFactors(cal.measured_batch_factors).c_str());
  }
  cal.prefill_chunk_factors = rc.prefill_chunk_factors;
  if (!cal.prefill_chunk_factors.empty()) {
    std::printf(
        "    prefill steps by prompts computed, real over simulated over the busy ratio, the %d "
        "runs together (not used): %s (more prompts as the last)\n",
        rc.runs, NumberedFactors(cal.prefill_chunk_factors).c_str());
  }
  for (const auto& [m, how] :
       {std::pair{planner::ArrivalMeasure::kLessChance,
                  "the held steps' excess less what they caught by chance"},
        std::pair{planner::ArrivalMeasure::kHeld, "the held steps' excess"},
        std::pair{planner::ArrivalMeasure::kOwnFit,
                  "the same less chance, against the run's own fit of its free steps"}}) {
    const size_t k = static_cast<size_t>(m);
    const bool own_fit = m == planner::ArrivalMeasure::kOwnFit;
    std::printf(
        "    prefill arrival work per request that came during a step, %s (not used) %s ms -> "
        "%.3f (%d runs; %s: %s; the prefill stretch with it left out of the busy time: %s -> "
        "x%.3f)\n",
        planner::ArrivalMeasureKey(m),
        Each(runs,
             [&](const planner::CalibrationRunFactors& r) {
               return r.prefill_arrival_work_s[k] ? Fmt("%.3f", *r.prefill_arrival_work_s[k] * 1e3)
                                                  : "-";
             })
            .c_str(),
        cal.measured_arrival_work_s[k].value_or(0.0) * 1e3, rc.arrival_work_runs[k], how,
        Each(runs,
             [&](const planner::CalibrationRunFactors& r) {
               const auto& w = r.prefill_arrival;
               if (!w || (own_fit && !w->fit_held_s)) return std::string("-");
               return Fmt("%.3f", (own_fit ? *w->fit_held_s : w->held_s) * 1e3) + " less " +
                      Fmt("%.3f", (own_fit ? *w->fit_chance_s : w->chance_s) * 1e3);
             })
            .c_str(),
        Each(runs,
             [&](const planner::CalibrationRunFactors& r) {
               return r.prefill_stretch_left_out[k] ? Fmt("x%.3f", *r.prefill_stretch_left_out[k])
                                                    : "-";
             })
            .c_str(),
        cal.prefill_stretch_left_out[k].value_or(0.0));
  }
  std::printf("    prefill loop gap between back-to-back steps, mean %s ms -> %.3f (%d runs)\n",
              Each(runs,
                   [](const planner::CalibrationRunFactors& r) {
                     return r.prefill_loop_gap_s ? Fmt("%.3f", *r.prefill_loop_gap_s * 1e3) : "-";
                   })
                  .c_str(),
              cal.prefill_loop_gap_s * 1e3, rc.loop_gap_runs);
  *json = OverheadsJson(cal);
  (*json)["rate"] = rc.rate;
  (*json)["calibration_runs"] = rc.runs;
  (*json)["prefill_loop_gap_s"] = {{"mean_s", cal.prefill_loop_gap_s}, {"runs", rc.loop_gap_runs}};
  // The stop-25 key, as earlier runs' files have it: the measure weighed there.
  constexpr size_t kStop25 = static_cast<size_t>(planner::ArrivalMeasure::kLessChance);
  (*json)["prefill_arrival_work_s"] = {
      {"mean_s", cal.measured_arrival_work_s[kStop25].value_or(0.0)},
      {"runs", rc.arrival_work_runs[kStop25]},
      {"used", false}};
  for (const planner::ArrivalMeasure m : planner::kAllArrivalMeasures) {
    const size_t k = static_cast<size_t>(m);
    (*json)["prefill_arrival_work_by_measure_s"][planner::ArrivalMeasureKey(m)] = {
        {"work_s", cal.measured_arrival_work_s[k].value_or(0.0)},
        {"stretch_left_out", cal.prefill_stretch_left_out[k].value_or(0.0)},
        {"runs", rc.arrival_work_runs[k]}};
  }
  if (!cal.measured_batch_factors.empty()) {
    (*json)["decode_batch_factors"] = {
        {"used", false}, {"runs", rc.pooled_split_runs}, {"by_batch", cal.measured_batch_factors}};
  }
  if (!cal.prefill_chunk_factors.empty()) {
    (*json)["prefill_chunk_factors"] = {
        {"used", false}, {"runs", rc.runs}, {"by_prompts", cal.prefill_chunk_factors}};
  }
  for (const auto& [key, k, run] :
       {std::tuple{"decode_step_factors", &rc.decode_step_factors, rc.step_factor_runs},
        std::tuple{"prefill_step_factors", &rc.prefill_step_factors, rc.prefill_factor_runs}}) {
    if (k->empty()) continue;
    const FactorQuantiles q(*k);
    (*json)[key] = {{"runs", run},  {"steps", k->size()}, {"mean", q.mean}, {"p50", q.p50},
                    {"p90", q.p90}, {"p99", q.p99},       {"max", q.max}};
  }
  return cal;
}

}  // namespace pd::apps::validate_sim
