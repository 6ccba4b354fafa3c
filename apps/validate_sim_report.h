// `pdserve validate-sim`'s results: the measured rounds and simulations per rate, printed side
// by side and as JSON.
#pragma once

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/validate_sim_calibration.h"
#include "apps/validate_sim_flags.h"
#include "apps/validate_sim_up.h"
#include "common/file_util.h"
#include "common/trace.h"
#include "planner/paired_rounds.h"
#include "planner/rate_calibration.h"
#include "planner/simulator.h"
#include "planner/step_stats.h"
#include "planner/validate.h"
#include "planner/validate_stats.h"

namespace pd::apps::validate_sim {

// One bench run at one rate, measured.
struct RoundResult {
  planner::Summary measured;
  double client_router_cores = 0;  // measured during the run
  Stretches stretch;               // waiting for a core, measured during the run (not used)
  double begin_s = 0, end_s = 0;   // steady clock (the traces' clock), around the bench run
  // Per request: arrival, prompt length, measured TTFT (empty when a request failed: the bench's
  // JSON then no longer says which arrival each TTFT belongs to).
  std::vector<planner::ClientRequest> client;
  // Per request in arrival order, the bench's results (planner::MeasuredFromBenchJson: TTFT,
  // TPOT as the mean gap after the first token, output length); empty when a request failed, as
  // `client`.
  std::vector<planner::RequestResult> requests;
};

// Which rule's simulation is used (RateReport::calibrated): the paired one (true) or the
// per-rate median (false); the other is printed beside it, not used (apps/validate_sim_paired.h).
// Paired since stop 21: with 600-request rounds and 200-request calibration runs it came nearer
// the rounds over 32 runs on the same rounds (2026-11-30 18:17-22:36): 459 of 480 cells within
// 10% against 444, all 15 in 18 runs against 14; it gained most in the runs whose rounds spread
// (12 -> 15 twice, 13 -> 15 once), higher in 10 runs and lower by one cell in 4. (At Q12, with
// 100-request runs in a host phase whose rounds spread 89-167%, two runs had it one cell apart.)
inline constexpr bool kPairedRuleUsed = true;
inline const char* UsedRuleName() {
  return kPairedRuleUsed ? "paired: each round simulated with the calibration run just before it"
                         : "per-rate median: the median of each rate's calibration runs";
}

// Everything about one rate: the simulations beside the median of the bench rounds, and the
// spreads that say how much of a difference is noise.
struct RateReport {
  // raw: the latency model alone; calibrated: the rule used (kPairedRuleUsed).
  planner::ComparisonRow raw, calibrated;
  std::vector<RoundResult> rounds;
  planner::Spread machine;                  // over the bench rounds (the same requests each time)
  planner::Spread sampling;                 // the calibrated simulation over reseeded workloads
  std::vector<planner::SimStep> sim_steps;  // the calibrated simulation's, on the bench's requests
  std::vector<planner::RequestResult> sim_requests;  // the same simulation's (fixed_s included)
  double modelled_cores = 0;  // the bench client's and router's CPU the simulation assumes
  // The calibration at this rate (from its calibration runs; apps/validate_sim_rate_cal.h).
  nlohmann::json rate_calibration;
  // The per-rate-median rule: one simulation with the median over this rate's calibration runs.
  planner::ComparisonRow per_rate_median;
  // The paired rule (apps/validate_sim_paired.h): each round simulated with its own calibration
  // run's factors; `paired_runs[k]`: the calibration run that round k took.
  std::optional<planner::PairedComparison> paired;
  std::vector<size_t> paired_runs;
  // The paired rule on the same rounds without each request's last token's way out less its
  // first's (OutsideLatency::TailFor) at its end, printed beside it; unset when no calibration
  // run measured the tails.
  std::optional<planner::PairedComparison> paired_without_tail;
  // The paired rule on the same rounds with the prefill arrival work by each measure
  // (WithArrivalWork: the same simulation for a round whose calibration run measured none),
  // printed beside it.
  planner::PerArrivalMeasure<std::optional<planner::PairedComparison>> paired_with_arrival_work;
  // The paired rule on the same rounds with the decode batch factors (WithDecodeBatchFactors): each
  // round's calibration run's own (planner::RunDecodeBatchFactors), and the rate's over its runs
  // together (RateCalibration::pooled_decode_batch_factors); the same simulation for a round
  // without them. Printed beside it.
  std::optional<planner::PairedComparison> paired_with_batch_factors,
      paired_with_pooled_batch_factors;
  // The paired rule on the same rounds without the decode instance's step factors (each round's
  // run's traced slowness, replayed in order: InstanceConfig::step_factors), printed beside it.
  // Stop 27's runs on a Zen 3 host: the per-rate simulation's TPOT p90 came out 11-26% high with
  // them and -8 to +11% without (docs/planner.md).
  std::optional<planner::PairedComparison> paired_without_step_factors;
  // The paired rule on the same rounds with the prefill chunk factors over the rate's runs
  // together (WithPrefillChunkFactors; the same simulation where none were measured), printed
  // beside it.
  std::optional<planner::PairedComparison> paired_with_chunk_factors;
  // The paired rule on the same rounds with the rate's pooled decode split
  // (RateCalibration::pooled_decode_stretch) in place of each round's run's own, at that run's
  // level, and at the mean level of the runs before and after the round
  // (planner::PooledSplitAtLevel, BracketedDecodeLevel). A round without a pooled split takes the
  // rule used's simulation.
  std::optional<planner::PairedComparison> paired_with_pooled_split, paired_with_bracketed_split;
  // The per-rate-median rule's simulation with the prefill instance's step factors too, and
  // without any (Calibration::prefill_step_factors, decode_step_factors), printed beside it;
  // unset when none were measured.
  std::optional<planner::Summary> with_prefill_factors, without_step_factors;
  // The per-rate-median rule's simulation without each request's delay on the way in
  // (SimulateRate's inbound_hop), printed beside it; unset when no sample carried it.
  std::optional<planner::Summary> without_inbound_hop;
  // The per-rate-median rule's simulation with the median calibration run's own decode split
  // instead of the split over the rate's runs together, printed beside it; unset when the runs
  // gave no pooled split.
  std::optional<planner::Summary> own_split;
  // The per-rate-median rule's simulation without the prefill instance's loop gap
  // (Calibration::prefill_loop_gap_s), printed beside it; unset when none was measured.
  std::optional<planner::Summary> without_loop_gap;
  // The per-rate-median rule's simulation without the tails (paired_without_tail), printed
  // beside it; unset when none were measured.
  std::optional<planner::Summary> without_tail;
  // The per-rate-median rule's simulation with the prefill arrival work by each measure
  // (WithArrivalWork), printed beside it; unset when none was measured.
  planner::PerArrivalMeasure<std::optional<planner::Summary>> with_arrival_work;
  // The per-rate-median rule's simulation with the decode batch factors over the rate's runs
  // together (RateCalibration::pooled_decode_batch_factors), printed beside it, and its steps;
  // unset / empty when none were measured.
  std::optional<planner::Summary> with_batch_factors;
  std::vector<planner::SimStep> batch_factor_steps;
};

inline nlohmann::json OverheadsJson(const Calibration& cal) {
  const planner::RealOverheads& o = cal.overheads;
  return {
      {"fixed_s", o.fixed_s},
      {"prefill_scale", o.prefill_scale},
      {"transfer_s_per_token", o.transfer_s_per_token},
      {"kv_ready_fraction", o.kv_ready_fraction},
      {"decode_fixed_ms", o.decode_fixed_ms},
      {"decode_seq_ms", o.decode_seq_ms},
      {"corun_prefill", o.corun_prefill},
      {"corun_decode", o.corun_decode},
      {"client_router_cpu_s_per_request", cal.client_cpu.per_request_s},
      {"client_router_cpu_s_per_token", cal.client_cpu.per_token_s},
      {"client_router_cpu_loaded_s",
       {cal.StretchCpu().per_request_s, cal.StretchCpu().per_token_s}},
      {"prefill_own_cpu_s", {cal.prefill_own_cpu.per_request_s, cal.prefill_own_cpu.per_token_s}},
      {"decode_own_cpu_s", {cal.decode_own_cpu.per_request_s, cal.decode_own_cpu.per_token_s}},
      {"probe_stretch", {{"prefill", cal.stretch.prefill}, {"decode", cal.stretch.decode}}},
      {"decode_under_load", cal.decode_load
                                ? nlohmann::json{{"stretch", cal.decode_load->stretch},
                                                 {"rate", cal.decode_load->rate},
                                                 {"corun_probes", cal.decode_load->corun_probes},
                                                 {"seq_stretch", cal.decode_load->seq_stretch}}
                                : nlohmann::json(nullptr)},
      {"prefill_under_load", cal.prefill_load
                                 ? nlohmann::json{{"stretch", cal.prefill_load->stretch},
                                                  {"rate", cal.prefill_load->rate}}
                                 : nlohmann::json(nullptr)},
      {"outside_latency",
       {{"rule", cal.outside_rule},
        {"idle_fixed_s", o.fixed_s},
        {"samples", cal.outside.num_samples()},
        {"p10_s", cal.outside.Quantile(0.1)},
        {"p50_s", cal.outside.Quantile(0.5)},
        {"p90_s", cal.outside.Quantile(0.9)},
        {"mean_s", cal.outside.Mean()}}}};
}

inline nlohmann::json SpreadJson(const planner::Spread& s) {
  nlohmann::json j{{"attainment", s.attainment},
                   {"ttft_p50", s.ttft_p50},
                   {"ttft_p90", s.ttft_p90},
                   {"tpot_p50", s.tpot_p50},
                   {"tpot_p90", s.tpot_p90}};
  if (s.other_attainment >= 0) j["other_attainment"] = s.other_attainment;
  return j;
}

inline void PrintReports(const ValidateFlags& f, const ValidateSlo& slo, const Calibration& cal,
                         const std::vector<RateReport>& reports, const std::string& rate_rule) {
  std::printf(
      "\n%s, 1 prefill + 1 decode, %d thread(s) each%s; random dataset %d/%d tokens (range "
      "%.2g), Poisson, seed %llu; SLO TTFT %.1f ms, TPOT %.2f ms (%s; the other rule, %s: TPOT "
      "%.2f ms, its attainment printed beside, not compared); %s; measured = the median of %d "
      "bench rounds per rate (rates interleaved, the same requests each round)\n",
      f.model.c_str(), f.threads, f.pin_cores ? ", pinned" : "", f.input_len, f.output_len,
      f.range_ratio, static_cast<unsigned long long>(f.seed), slo.ttft_s * 1e3, slo.tpot_s * 1e3,
      slo.rule.c_str(), slo.other_rule.c_str(), slo.other.tpot_s * 1e3, rate_rule.c_str(),
      f.rounds);
  std::vector<planner::ComparisonRow> raw, calibrated;
  for (const RateReport& r : reports) {
    raw.push_back(r.raw);
    calibrated.push_back(r.calibrated);
  }
  std::printf("\nthe latency model alone (the profile, nothing calibrated):\n%s",
              planner::FormatComparison(raw).c_str());
  const planner::RealOverheads& o = cal.overheads;
  std::printf(
      "\ncalibrated through this deployment by the probes (prefill x%.3f, idle fixed %.2f ms, "
      "outside the engines %s: p50 %.2f p90 %.2f ms, decode "
      "+%.3f ms/step +%.3f ms/seq, co-run prefill x%.3f decode x%.3f, client + router %.3f "
      "ms/request + %.4f ms/token of CPU taken from %d cores, measured under load by the single "
      "load run; the sequential probes measured %.3f + %.4f; the simulation below takes each "
      "rate's under-load figures from its calibration runs instead, printed above; rule used: "
      "%s):\n%s",
      o.prefill_scale, o.fixed_s * 1e3, cal.outside_rule.c_str(), cal.outside.Quantile(0.5) * 1e3,
      cal.outside.Quantile(0.9) * 1e3, o.decode_fixed_ms, o.decode_seq_ms, o.corun_prefill,
      o.corun_decode, cal.StretchCpu().per_request_s * 1e3, cal.StretchCpu().per_token_s * 1e3,
      MachineCores(), cal.client_cpu.per_request_s * 1e3, cal.client_cpu.per_token_s * 1e3,
      UsedRuleName(), planner::FormatComparison(calibrated).c_str());
  std::printf(
      "\nnoise, (max - min) / median per metric: machine = over the %d bench rounds (the same "
      "requests); sampling = the calibrated simulation over %d reseeded workloads of the same "
      "size\n",
      f.rounds, f.sampling_seeds);
  for (const RateReport& r : reports) {
    std::printf("  rate %.3g (%d requests): machine %s; sampling %s\n", r.raw.rate,
                r.raw.measured.num_requests, planner::FormatSpread(r.machine).c_str(),
                planner::FormatSpread(r.sampling).c_str());
    for (size_t k = 0; k < r.rounds.size(); ++k) {
      const RoundResult& rr = r.rounds[k];
      const planner::Summary& m = rr.measured;
      std::printf(
          "    round %zu: att %.1f%%, TTFT p50 %.2f p90 %.2f ms, TPOT p50 %.3f p90 %.3f ms; "
          "client + router %.3f cores (modelled %.3f); waited for a core: prefill x%.3f, decode "
          "x%.3f\n",
          k + 1, 100 * m.attainment, m.ttft_p50_s * 1e3, m.ttft_p90_s * 1e3, m.tpot_p50_s * 1e3,
          m.tpot_p90_s * 1e3, rr.client_router_cores, r.modelled_cores, rr.stretch.prefill,
          rr.stretch.decode);
    }
  }
}

// Issue 7's tolerance: a cell is within when |sim/real - 1| <= 10%.
inline constexpr double kCellTolerance = 0.10;

// Per round, cells within kCellTolerance (5 a round, `of` in all): each round against its own
// paired simulation, against its rate's per-rate-median simulation, and against the median of
// its rate's other rounds (planner::RoundsAgainstTheOthers: the machine against itself).
struct PerRoundCells {
  int paired = 0, per_rate_median = 0, others = 0, of = 0;
};
inline PerRoundCells CountPerRoundCells(const std::vector<RateReport>& reports) {
  std::vector<planner::ComparisonRow> own, median, others;
  for (const RateReport& r : reports) {
    std::vector<planner::Summary> measured;
    for (const RoundResult& rr : r.rounds) {
      measured.push_back(rr.measured);
      median.push_back({r.raw.rate, r.per_rate_median.simulated, rr.measured});
    }
    if (r.paired) own.insert(own.end(), r.paired->rounds.begin(), r.paired->rounds.end());
    auto against = planner::RoundsAgainstTheOthers(r.raw.rate, measured);
    if (against.ok()) others.insert(others.end(), against->begin(), against->end());
  }
  return {planner::CellsWithin(own, kCellTolerance), planner::CellsWithin(median, kCellTolerance),
          planner::CellsWithin(others, kCellTolerance), 5 * static_cast<int>(median.size())};
}

inline nlohmann::json ReportJson(const ValidateFlags& f, const ValidateSlo& slo,
                                 const Calibration& cal, const std::vector<RateReport>& reports) {
  std::vector<planner::ComparisonRow> raw, calibrated, per_rate_median, paired;
  nlohmann::json paired_rounds = nlohmann::json::array();
  nlohmann::json noise = nlohmann::json::array();
  nlohmann::json per_rate = nlohmann::json::array();
  for (const RateReport& r : reports) {
    raw.push_back(r.raw);
    calibrated.push_back(r.calibrated);
    per_rate_median.push_back(r.per_rate_median);
    if (r.paired) {
      paired.push_back(r.paired->row);
      paired_rounds.push_back({{"rate", r.raw.rate},
                               {"calibration_run_of_round", r.paired_runs},
                               {"rounds", planner::ComparisonToJson(r.paired->rounds)}});
      if (r.paired_without_tail) {
        paired_rounds.back()["rounds_without_tail"] =
            planner::ComparisonToJson(r.paired_without_tail->rounds);
      }
      for (const planner::ArrivalMeasure m : planner::kAllArrivalMeasures) {
        const auto& w = r.paired_with_arrival_work[static_cast<size_t>(m)];
        if (!w) continue;
        paired_rounds.back()[std::string("rounds_with_") + planner::ArrivalMeasureKey(m)] =
            planner::ComparisonToJson(w->rounds);
      }
      for (const auto& [key, which] :
           {std::pair{"rounds_with_batch_factors", &r.paired_with_batch_factors},
            std::pair{"rounds_with_pooled_batch_factors", &r.paired_with_pooled_batch_factors},
            std::pair{"rounds_without_step_factors", &r.paired_without_step_factors},
            std::pair{"rounds_with_prefill_chunk_factors", &r.paired_with_chunk_factors},
            std::pair{"rounds_with_pooled_split", &r.paired_with_pooled_split},
            std::pair{"rounds_with_bracketed_split", &r.paired_with_bracketed_split}}) {
        if (*which) paired_rounds.back()[key] = planner::ComparisonToJson((*which)->rounds);
      }
    }
    per_rate.push_back(r.rate_calibration);
    nlohmann::json rounds = nlohmann::json::array();
    for (const RoundResult& rr : r.rounds) {
      // Per request, in arrival order.
      nlohmann::json ttfts = nlohmann::json::array(), tpots = nlohmann::json::array(),
                     outputs = nlohmann::json::array();
      for (const planner::ClientRequest& c : rr.client) ttfts.push_back(c.ttft_s);
      for (const planner::RequestResult& q : rr.requests) {
        tpots.push_back(q.tpot_s());
        outputs.push_back(q.output_len);
      }
      rounds.push_back({{"attainment", rr.measured.attainment},
                        {"ttft_p50_s", rr.measured.ttft_p50_s},
                        {"ttft_p90_s", rr.measured.ttft_p90_s},
                        {"tpot_p50_s", rr.measured.tpot_p50_s},
                        {"tpot_p90_s", rr.measured.tpot_p90_s},
                        {"client_router_cores", rr.client_router_cores},
                        {"request_ttft_s", ttfts},
                        {"request_tpot_s", tpots},
                        {"request_output_tokens", outputs}});
    }
    // The per-rate-median rule's simulation's requests (the same seeded ones as the rounds', in
    // the same order; under the paired rule each round has its own simulation, not kept here),
    // for per-request comparison with the rounds' request_ttft_s and request_tpot_s; arrival_s
    // is when a request reached the instances (sent, plus its drawn delay on the way in).
    nlohmann::json sim = {
        {"arrival_s", nlohmann::json::array()},      {"prompt_tokens", nlohmann::json::array()},
        {"ttft_s", nlohmann::json::array()},         {"tpot_s", nlohmann::json::array()},
        {"prefill_done_s", nlohmann::json::array()}, {"kv_arrived_s", nlohmann::json::array()},
        {"output_tokens", nlohmann::json::array()}};
    for (const planner::RequestResult& q : r.sim_requests) {
      sim["arrival_s"].push_back(q.arrival_s);
      sim["prompt_tokens"].push_back(q.prompt_len);
      sim["ttft_s"].push_back(q.ttft_s());
      sim["tpot_s"].push_back(q.tpot_s());
      sim["prefill_done_s"].push_back(q.prefill_done_s);
      sim["kv_arrived_s"].push_back(q.kv_arrived_s);
      sim["output_tokens"].push_back(q.output_len);
    }
    noise.push_back({{"rate", r.raw.rate},
                     {"machine", SpreadJson(r.machine)},
                     {"sampling", SpreadJson(r.sampling)},
                     {"modelled_client_router_cores", r.modelled_cores},
                     {"rounds", rounds},
                     {"simulated_requests", sim}});
  }
  const PerRoundCells cells = CountPerRoundCells(reports);
  return {{"model", f.model},
          {"threads", f.threads},
          {"slo",
           {{"ttft_s", slo.ttft_s},
            {"tpot_s", slo.tpot_s},
            {"rule", slo.rule},
            {"other", {{"ttft_s", slo.other.ttft_s}, {"tpot_s", slo.other.tpot_s}}},
            {"other_rule", slo.other_rule}}},
          {"calibration", OverheadsJson(cal)},
          {"calibration_per_rate", per_rate},
          {"rule_used", kPairedRuleUsed ? "paired" : "per_rate_median"},
          {"rows", planner::ComparisonToJson(calibrated)},
          {"rows_per_rate_median", planner::ComparisonToJson(per_rate_median)},
          {"rows_paired", planner::ComparisonToJson(paired)},
          {"paired_rounds", paired_rounds},
          {"per_round_cells_within_10pct",
           {{"of", cells.of},
            {"paired", cells.paired},
            {"per_rate_median", cells.per_rate_median},
            {"rounds_against_the_others", cells.others}}},
          {"rows_uncalibrated", planner::ComparisonToJson(raw)},
          {"noise", noise}};
}

// With --trace: the calibrated simulation's TTFT parts per request (p50 / p90, ms): waiting at the
// prefill instance, its step, the hand-over (KV transfer), the decode instance until the first
// token (its queue and step, with fixed_s); and the rounds' windows on the traces' clock, for
// comparing with the real parts from the traces (bench/planner/ttft_parts.py).
inline void PrintSimTtftParts(const RateReport& r) {
  std::vector<double> wait, step, handover, decode;
  std::vector<double> step_end, step_len;
  for (const planner::SimStep& s : r.sim_steps) {
    if (s.instance != 0) continue;
    step_end.push_back(s.start_s + s.duration_s);
    step_len.push_back(s.duration_s);
  }
  for (const planner::RequestResult& q : r.sim_requests) {
    if (q.prefill_done_s < 0 || q.kv_arrived_s < 0 || q.first_token_s < 0) continue;
    double len = 0;  // the prefill step that ended when this prompt's did
    for (size_t i = 0; i < step_end.size(); ++i) {
      if (std::abs(step_end[i] - q.prefill_done_s) < 1e-9) len = step_len[i];
    }
    step.push_back(len);
    wait.push_back(q.prefill_done_s - q.arrival_s - len);
    handover.push_back(q.kv_arrived_s - q.prefill_done_s);
    decode.push_back(q.first_token_s - q.kv_arrived_s);
  }
  auto pp = [](const std::vector<double>& v) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.2f / %.2f", planner::Percentile(v, 0.5) * 1e3,
                  planner::Percentile(v, 0.9) * 1e3);
    return std::string(b);
  };
  std::printf(
      "simulated TTFT parts at %.3g req/s (p50 / p90 ms): prefill wait %s, prefill step %s, "
      "hand-over %s, decode to first token (with fixed) %s\n",
      r.raw.rate, pp(wait).c_str(), pp(step).c_str(), pp(handover).c_str(), pp(decode).c_str());
  for (const RoundResult& rr : r.rounds) {
    std::printf("round window %.3g req/s: %.6f %.6f\n", r.raw.rate, rr.begin_s, rr.end_s);
  }
}

// The instances' trace files (`pdserve up --trace`), read once: both parsers below take them.
// FailedPrecondition without --trace.
struct TraceTexts {
  std::string prefill, decode;
};
inline Result<TraceTexts> ReadTraceTexts(const ValidateFlags& f) {
  if (f.trace.empty()) return FailedPrecondition("no --trace");
  TraceTexts t;
  for (const auto& [name, text] : {std::pair{"prefill", &t.prefill}, {"decode", &t.decode}}) {
    const std::string path = TracePathFor(f.trace, std::string(name) + "0");
    ASSIGN_OR_RETURN(*text, ReadFileToString(path));
    const std::optional<uint64_t> dropped = TraceDroppedEvents(*text);
    if (dropped && *dropped == 0) continue;
    // The runs after the last kept event lack their traced figures and fall back to the load
    // run's: said on the report's own output, not only in the up log.
    const std::string what =
        dropped ? std::to_string(*dropped) + " events dropped (its cap was reached)"
                : std::string("no dropped-event count at its end (cut short?)");
    std::printf(
        "WARNING: the %s instance's trace %s: %s; the runs after its last event are "
        "calibrated without their traces\n",
        name, path.c_str(), what.c_str());
    std::fprintf(stderr, "validate-sim: the %s instance's trace: %s\n", name, what.c_str());
  }
  return t;
}

// The instances' traced engine steps, whole (each run takes its window with InWindow): parsed
// once, as each trace holds every run (~75 MB for the decode instance).
struct TracedSteps {
  std::vector<planner::StepRecord> decode;   // `corun` marked against the prefill steps
  std::vector<planner::StepRecord> prefill;  // `corun` marked against the decode steps
};
inline Result<TracedSteps> ReadTracedSteps(const TraceTexts& texts) {
  TracedSteps t;
  constexpr double kAll = 1e300;
  ASSIGN_OR_RETURN(t.decode, planner::EngineStepsFromTrace(texts.decode, -kAll, kAll));
  ASSIGN_OR_RETURN(t.prefill, planner::EngineStepsFromTrace(texts.prefill, -kAll, kAll));
  planner::MarkCorun(t.decode, t.prefill);
  planner::MarkCorun(t.prefill, t.decode);
  return t;
}
// The steps that started within [begin_s, end_s].
inline std::vector<planner::StepRecord> InWindow(const std::vector<planner::StepRecord>& steps,
                                                 double begin_s, double end_s) {
  std::vector<planner::StepRecord> out;
  for (const planner::StepRecord& s : steps) {
    if (s.start_s >= begin_s && s.start_s <= end_s) out.push_back(s);
  }
  return out;
}

// With --trace: per rate, the real decode instance's steps in the bench rounds (their windows on
// the traces' clock, pooled) beside the calibrated simulation's, per batch size; a step is
// "corun" when a prefill step was running as it started (the simulator's co-run rule).
inline constexpr int kStepTableBatches = 8;
inline constexpr double kMaxLoopGapS = 2e-3;  // a longer gap is the engine waiting for work
inline void PrintStepComparisons(const std::vector<RateReport>& reports, const TracedSteps& steps) {
  std::printf(
      "\ndecode steps by batch size, real (--trace, the bench rounds) vs the calibrated "
      "simulation (decode-only steps; corun = a prefill step running as it started; gap = the "
      "engine loop between a step and the next, gaps over %.0f ms left out):\n",
      kMaxLoopGapS * 1e3);
  for (const RateReport& r : reports) {
    std::vector<planner::StepRecord> real;
    for (const RoundResult& rr : r.rounds) {
      const auto d = InWindow(steps.decode, rr.begin_s, rr.end_s);
      real.insert(real.end(), d.begin(), d.end());
    }
    planner::SimResult sim;
    sim.steps = r.sim_steps;
    const auto sim_steps = planner::StepsOfInstance(sim, 1);
    const auto real_rows = planner::SummarizeDecodeSteps(real, kStepTableBatches, kMaxLoopGapS);
    const auto sim_rows = planner::SummarizeDecodeSteps(sim_steps, kStepTableBatches, kMaxLoopGapS);
    std::printf("rate %.3g req/s:\n%s", r.raw.rate,
                planner::FormatStepComparison(real_rows, sim_rows).c_str());
    if (!r.batch_factor_steps.empty()) {
      sim.steps = r.batch_factor_steps;
      const auto shaped = planner::SummarizeDecodeSteps(planner::StepsOfInstance(sim, 1),
                                                        kStepTableBatches, kMaxLoopGapS);
      std::printf("the same with the decode batch factors (not used):\n%s",
                  planner::FormatStepComparison(real_rows, shaped).c_str());
    }
    PrintSimTtftParts(r);
  }
}

}  // namespace pd::apps::validate_sim
