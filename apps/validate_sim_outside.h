// `pdserve validate-sim`'s latency outside the engines (issue #7), from the instances' traces:
// per request of the uncompared load run (300 requests at the highest compared rate, another
// seed), the bench client's measured TTFT less the traced engines' part of the same request
// (prefill queue wait, prefill step, KV hand-over, first decode step; planner/ttft_parts.h). The
// idle probes put the rest at 1.4-1.6 ms. An earlier reading of ~4 ms under load was mostly a
// tracing artefact (the prefill side traced a request's arrival after its step had begun); taken
// from the messenger's admission it is ~2.3 ms p50 / ~4.2 ms p90 under load (02:19 run). The
// calibrated simulation draws each request's outside latency from the load run's
// sample (a rule fixed before any compared round; the rounds' own figures are printed beside it
// but not used). Without --trace, or when too few requests join, the idle constant stays.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/validate_sim_calibration.h"
#include "apps/validate_sim_flags.h"
#include "apps/validate_sim_report.h"
#include "common/file_util.h"
#include "common/status.h"
#include "common/trace.h"
#include "planner/metrics.h"
#include "planner/ttft_parts.h"
#include "planner/validate.h"

namespace pd::apps::validate_sim {

// A bench run's per-request client side: the i-th TTFT of its JSON is the i-th arrival's when no
// request failed (the JSON lists the successful ones only; with a failure, none is returned).
// A request's span (first token to last) is planner::MeasuredFromBenchJson's (the sum of its
// "itls"); -1 for every request when that cannot read the JSON.
inline Result<std::vector<planner::ClientRequest>> ClientRequestsOf(
    const nlohmann::json& bench, const std::vector<double>& arrivals) {
  if (bench.value("failed", 0) > 0) return std::vector<planner::ClientRequest>{};
  if (!bench.contains("ttfts") || !bench.contains("input_lens") || !bench["ttfts"].is_array() ||
      !bench["input_lens"].is_array() || bench["ttfts"].size() != arrivals.size() ||
      bench["input_lens"].size() != arrivals.size()) {
    return InvalidArgument("bench result: 'ttfts' and 'input_lens' do not match the arrivals");
  }
  const auto measured = planner::MeasuredFromBenchJson(bench, "bench result");
  std::vector<planner::ClientRequest> out;
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const auto& t = bench["ttfts"][i];
    const auto& l = bench["input_lens"][i];
    if (!t.is_number() || !l.is_number_integer()) continue;
    const double span = measured.ok() ? (*measured)[i].finish_s - (*measured)[i].first_token_s : -1;
    out.push_back({arrivals[i], l.get<int>(), t.get<double>(), span});
  }
  return out;
}

// The traced requests sent within [begin_s, end_s] (a run's window on the traces' clock).
inline std::vector<planner::TracedRequest> TracedIn(const std::vector<planner::TracedRequest>& all,
                                                    double begin_s, double end_s) {
  std::vector<planner::TracedRequest> out;
  for (const auto& r : all) {
    if (r.sent_s >= begin_s && r.sent_s <= end_s) out.push_back(r);
  }
  return out;
}

struct OutsideJoin {
  std::vector<double> outside_s, ttft_s, front_s, wait_s, step_s, handover_s, decode_s, engines_s;
  std::vector<double> inbound_s;  // OutsideSample::inbound_s
  // OutsideSample::tail_s, in step with outside_s when every joined request had one; else empty
  // (tails_missing says how many had none).
  std::vector<double> tail_s;
  size_t tails_missing = 0;
};
inline Result<OutsideJoin> JoinRun(const std::vector<planner::ClientRequest>& client,
                                   const std::vector<planner::TracedRequest>& traced) {
  ASSIGN_OR_RETURN(const auto joined, planner::JoinOutsideLatency(client, traced));
  OutsideJoin j;
  for (const planner::OutsideSample& s : joined) {
    const planner::TracedRequest& r = traced[s.traced];
    j.outside_s.push_back(s.outside_s);
    j.inbound_s.push_back(s.inbound_s);
    j.ttft_s.push_back(client[s.client].ttft_s);
    j.front_s.push_back(r.front_s());
    j.wait_s.push_back(r.wait_s());
    j.step_s.push_back(r.step_s());
    j.handover_s.push_back(r.handover_s());
    j.decode_s.push_back(r.decode_s());
    j.engines_s.push_back(r.engines_s());
    if (std::isfinite(s.tail_s)) {
      j.tail_s.push_back(s.tail_s);
    } else {
      ++j.tails_missing;
    }
  }
  if (j.tails_missing > 0) j.tail_s.clear();
  return j;
}

inline std::string P50P90(const std::vector<double>& v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.2f / %.2f", planner::Percentile(v, 0.5) * 1e3,
                planner::Percentile(v, 0.9) * 1e3);
  return b;
}

// "mean m, p10 a, p50 b, p90 c ms" of a join's tails, or why there are none.
inline std::string TailSummary(const OutsideJoin& j) {
  if (j.tail_s.empty()) {
    return std::to_string(j.tails_missing) + " joined requests without both spans: none";
  }
  double sum = 0;
  for (double v : j.tail_s) sum += v;
  char b[128];
  std::snprintf(b, sizeof(b), "mean %.3f, p10 %.3f, p50 %.3f, p90 %.3f ms",
                sum / static_cast<double>(j.tail_s.size()) * 1e3,
                planner::Percentile(j.tail_s, 0.1) * 1e3, planner::Percentile(j.tail_s, 0.5) * 1e3,
                planner::Percentile(j.tail_s, 0.9) * 1e3);
  return b;
}

inline void PrintJoin(const char* what, const OutsideJoin& j, size_t requests) {
  std::printf(
      "  %s: %zu of %zu requests joined; p50 / p90 ms: outside %s | measured TTFT %s = front %s "
      "(in outside) + prefill wait %s + prefill step %s + hand-over %s + first decode step %s "
      "(engines %s); last token's way out less the first's: %s\n",
      what, j.outside_s.size(), requests, P50P90(j.outside_s).c_str(), P50P90(j.ttft_s).c_str(),
      P50P90(j.front_s).c_str(), P50P90(j.wait_s).c_str(), P50P90(j.step_s).c_str(),
      P50P90(j.handover_s).c_str(), P50P90(j.decode_s).c_str(), P50P90(j.engines_s).c_str(),
      TailSummary(j).c_str());
}

// "p50 a, p90 b, p99 c ms (of 1000 draws)" of the delays on the way in that `outside` draws
// (OutsideLatency::InboundFor), or "none" without them.
inline std::string WayInSummary(const planner::OutsideLatency& outside) {
  if (!outside.has_inbound()) return "none";
  std::vector<double> in;
  for (int64_t id = 0; id < 1000; ++id) in.push_back(outside.InboundFor(id));
  char b[96];
  std::snprintf(b, sizeof(b), "p50 %.2f, p90 %.2f, p99 %.2f ms (of 1000 draws)",
                planner::Percentile(in, 0.5) * 1e3, planner::Percentile(in, 0.9) * 1e3,
                planner::Percentile(in, 0.99) * 1e3);
  return b;
}

// The instances' traced requests (planner::TracedRequestsFromTraces on --trace's files), or why
// not (`texts`: ReadTraceTexts).
inline Result<std::vector<planner::TracedRequest>> ReadTracedRequests(
    const Result<TraceTexts>& texts) {
  if (!texts.ok()) return texts.status();
  return planner::TracedRequestsFromTraces(texts->prefill, texts->decode);
}

// At least this share of the load run's requests must join for its sample to replace the idle
// constant (fewer: the trace's event cap cut the load run, or the join failed).
inline constexpr double kMinJoinedShare = 0.5;

// Sets cal->outside from the load run's traced requests (`load`: the client side, `load_begin_s`
// / `load_end_s` its window) and prints it beside the idle figure, with the rounds' own figures
// per rate (not used). Keeps the idle constant, saying why, when that cannot be done.
// `all`: the instances' traced requests (ReadTracedRequests), or why not.
inline void CalibrateOutside(const ValidateFlags& f,
                             const std::vector<planner::ClientRequest>& load, double load_begin_s,
                             double load_end_s, const std::vector<RateReport>& reports,
                             const Result<std::vector<planner::TracedRequest>>& all,
                             Calibration* cal) {
  std::printf(
      "\nlatency outside the engines per request (measured TTFT less the traced prefill wait, "
      "prefill step, hand-over and first decode step): idle probes %.2f ms (fixed_s)\n",
      cal->overheads.fixed_s * 1e3);
  auto keep_idle = [&](const std::string& why) {
    std::printf("  the calibrated simulation keeps the idle constant: %s\n", why.c_str());
  };
  if (f.trace.empty()) return keep_idle("no --trace");
  if (!all.ok()) return keep_idle(all.status().ToString());
  if (load.empty()) return keep_idle("the load run had a failed request (no per-request join)");
  auto j = JoinRun(load, TracedIn(*all, load_begin_s, load_end_s));
  if (!j.ok()) return keep_idle(j.status().ToString());
  PrintJoin("load run", *j, load.size());
  if (j->outside_s.size() < kMinJoinedShare * load.size()) {
    return keep_idle("under half of the load run's requests joined");
  }
  auto sampled =
      planner::OutsideLatency::SampledWithInbound(j->outside_s, j->inbound_s, f.seed, j->tail_s);
  if (!sampled.ok()) return keep_idle(sampled.status().ToString());
  cal->outside = *sampled;
  cal->outside_rule = "drawn per request from the load run's";
  std::printf(
      "  the calibrated simulation draws each request's from the load run's %zu: p10 %.2f, p50 "
      "%.2f, p90 %.2f, mean %.2f ms (idle %.2f)\n",
      cal->outside.num_samples(), cal->outside.Quantile(0.1) * 1e3,
      cal->outside.Quantile(0.5) * 1e3, cal->outside.Quantile(0.9) * 1e3, cal->outside.Mean() * 1e3,
      cal->overheads.fixed_s * 1e3);
  std::printf(
      "  and with it that request's delay on the way in over the quickest (p5) request's: %s\n",
      WayInSummary(cal->outside).c_str());
  for (const RateReport& r : reports) {  // the compared rounds' own: printed, never used
    OutsideJoin pooled;
    size_t requests = 0;
    for (const RoundResult& rr : r.rounds) {
      auto rj = JoinRun(rr.client, TracedIn(*all, rr.begin_s, rr.end_s));
      requests += rr.client.size();
      if (!rj.ok()) continue;
      for (auto [to, from] : {std::pair{&pooled.outside_s, &rj->outside_s},
                              {&pooled.ttft_s, &rj->ttft_s},
                              {&pooled.front_s, &rj->front_s},
                              {&pooled.wait_s, &rj->wait_s},
                              {&pooled.step_s, &rj->step_s},
                              {&pooled.handover_s, &rj->handover_s},
                              {&pooled.decode_s, &rj->decode_s},
                              {&pooled.engines_s, &rj->engines_s},
                              {&pooled.tail_s, &rj->tail_s}}) {
        to->insert(to->end(), from->begin(), from->end());
      }
      pooled.tails_missing += rj->tails_missing;
    }
    char what[96];
    std::snprintf(what, sizeof(what), "rounds at %.3g req/s (not used)", r.raw.rate);
    PrintJoin(what, pooled, requests);
  }
}

// Fewer of the load run's traced requests than this and the hand-over stays at the step's end.
inline constexpr size_t kMinKvReadyRequests = 50;

// Sets cal->overheads.kv_ready_fraction (how far into its prefill step a prompt's KV is whole at
// the decode instance: planner::KvReadyFraction) from the load run's traced requests (uncompared,
// before every compared round) and prints the rounds' own beside it (not used). The traced ready
// point includes the KV transfer, so the probes' transfer time per token is then dropped.
// Without traces the hand-over stays at the step's end, saying why.
inline void CalibrateKvReady(const ValidateFlags& f, double load_begin_s, double load_end_s,
                             const std::vector<RateReport>& reports,
                             const Result<std::vector<planner::TracedRequest>>& all,
                             Calibration* cal) {
  std::printf(
      "\nthe KV hand-over (a prompt's KV whole at the decode instance, as a share of the "
      "prefill step that computed it; the step's end is 1):\n");
  auto keep_end = [](const std::string& why) {
    std::printf("  the calibrated simulation hands over at the step's end: %s\n", why.c_str());
  };
  if (f.trace.empty()) return keep_end("no --trace");
  if (!all.ok()) return keep_end(all.status().ToString());
  auto load =
      planner::KvReadyFraction(TracedIn(*all, load_begin_s, load_end_s), kMinKvReadyRequests);
  if (!load.ok()) return keep_end(load.status().ToString());
  cal->overheads.kv_ready_fraction = *load;
  std::printf(
      "  load run: %.3f (median of its traced requests), used; the probes' transfer time "
      "per token (%.4f ms) is dropped: the traced ready point includes the transfer\n",
      *load, cal->overheads.transfer_s_per_token * 1e3);
  cal->overheads.transfer_s_per_token = 0;
  for (const RateReport& r : reports) {  // the compared rounds' own: printed, never used
    std::vector<planner::TracedRequest> in;
    for (const RoundResult& rr : r.rounds) {
      const auto part = TracedIn(*all, rr.begin_s, rr.end_s);
      in.insert(in.end(), part.begin(), part.end());
    }
    const auto got = planner::KvReadyFraction(in, 1);
    if (got.ok()) std::printf("  rounds at %.3g req/s (not used): %.3f\n", r.raw.rate, *got);
  }
}

}  // namespace pd::apps::validate_sim
