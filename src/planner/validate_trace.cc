#include "planner/validate_trace.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "planner/metrics.h"

namespace pd::planner {

std::vector<TracedRequest> TracedRequests(const std::vector<TraceEvent>& prefill,
                                          const std::vector<TraceEvent>& decode) {
  // The prefill side: when each request arrived, the first and last step its KV came from.
  std::map<std::string, double> got;
  std::map<std::string, std::pair<int64_t, int64_t>> steps_of;
  std::map<int64_t, std::pair<double, double>> steps;  // step -> begin, end
  for (const TraceEvent& e : prefill) {
    const double ts = static_cast<double>(e.ts_ns) * 1e-9;
    if (e.name == "prefill request" || (e.name == "transfer" && e.ph == 'X')) {
      auto [it, fresh] = got.emplace(TraceArgText(e, "request"), ts);
      if (!fresh) it->second = std::min(it->second, ts);
    } else if (e.name == "post writes" && TraceArgInt(e, "step")) {
      const int64_t step = *TraceArgInt(e, "step");
      auto [it, fresh] = steps_of.emplace(TraceArgText(e, "request"), std::make_pair(step, step));
      it->second = {std::min(it->second.first, step), std::max(it->second.second, step)};
    } else if (e.name == "step" && e.cat == "engine" && TraceArgInt(e, "step")) {
      steps[*TraceArgInt(e, "step")] = {ts, ts + static_cast<double>(e.dur_ns) * 1e-9};
    }
  }
  std::map<std::string, TracedRequest> sent;
  std::map<std::string, std::string> by_engine_id;           // engine request id -> messenger's
  std::map<std::string, std::pair<double, double>> written;  // engine id -> first, last write
  std::vector<std::pair<double, double>> decode_steps;
  for (const TraceEvent& e : decode) {
    const double ts = static_cast<double>(e.ts_ns) * 1e-9;
    if (e.name == "prefill request sent") {
      TracedRequest r;
      r.sent_s = ts;
      r.prompt_tokens = static_cast<int>(TraceArgInt(e, "tokens").value_or(-1)) + 1;
      r.kv_ready_s = -1;
      const std::string id = TraceArgText(e, "request");  // the messenger's
      sent.emplace(id, r);                                // the first attempt's
      if (!TraceArgText(e, "engine_request").empty())
        by_engine_id.emplace(TraceArgText(e, "engine_request"), id);
    } else if (e.name == "first token written" || e.name == "last token written") {
      auto [it, fresh] = written.emplace(TraceArgText(e, "request"), std::make_pair(-1.0, -1.0));
      (e.name == "first token written" ? it->second.first : it->second.second) = ts;
    } else if (e.name == "kv ready") {
      auto it = sent.find(TraceArgText(e, "request"));
      if (it != sent.end()) it->second.kv_ready_s = ts;
    } else if (e.name == "step" && e.cat == "engine") {
      decode_steps.emplace_back(ts, ts + static_cast<double>(e.dur_ns) * 1e-9);
    }
  }
  std::sort(decode_steps.begin(), decode_steps.end());
  for (const auto& [engine_id, w] : written) {
    const auto id = by_engine_id.find(engine_id);
    const auto it = id == by_engine_id.end() ? sent.end() : sent.find(id->second);
    if (it == sent.end()) continue;
    it->second.first_written_s = w.first;
    it->second.last_written_s = w.second;
  }
  std::vector<TracedRequest> out;
  for (auto& [id, r] : sent) {
    const auto g = got.find(id);
    const auto st = steps_of.find(id);
    if (g == got.end() || st == steps_of.end() || r.kv_ready_s < 0) continue;
    const auto first = steps.find(st->second.first);
    const auto last = steps.find(st->second.second);
    const auto next = std::lower_bound(decode_steps.begin(), decode_steps.end(),
                                       std::make_pair(r.kv_ready_s, -1e300));
    if (first == steps.end() || last == steps.end() || next == decode_steps.end()) continue;
    r.got_s = g->second;
    r.step_begin_s = first->second.first;
    r.step_end_s = last->second.second;
    r.first_step_end_s = next->second;
    out.push_back(r);
  }
  std::sort(out.begin(), out.end(),
            [](const TracedRequest& a, const TracedRequest& b) { return a.sent_s < b.sent_s; });
  return out;
}

Result<double> KvReadyFraction(std::span<const TracedRequest> traced, size_t min_requests) {
  std::vector<double> fractions;
  for (const TracedRequest& r : traced) {
    const double step_s = r.step_end_s - r.step_begin_s;
    if (!(step_s > 0)) continue;
    const double f = (r.kv_ready_s - r.step_begin_s) / step_s;
    if (std::isfinite(f) && f > 0) fractions.push_back(std::min(f, 1.0));
  }
  if (fractions.empty() || fractions.size() < min_requests) {
    return FailedPrecondition("KV ready fraction: " + std::to_string(fractions.size()) +
                              " traced requests, under the " + std::to_string(min_requests) +
                              " needed");
  }
  return Percentile(std::move(fractions), 0.5);
}

namespace {

constexpr double kJoinBinS = 0.002, kJoinMaxSkewS = 0.010;

// The middle of the densest kJoinBinS-wide window of offsets.
double DensestOffset(std::vector<double> offsets) {
  std::sort(offsets.begin(), offsets.end());
  size_t best_lo = 0, best_n = 0;
  for (size_t lo = 0, hi = 0; lo < offsets.size(); ++lo) {
    hi = std::max(hi, lo);
    while (hi < offsets.size() && offsets[hi] - offsets[lo] <= kJoinBinS) ++hi;
    if (hi - lo > best_n) {
      best_n = hi - lo;
      best_lo = lo;
    }
  }
  return offsets[best_lo + (best_n - 1) / 2];
}

}  // namespace

Result<OutsideSamples> JoinOutsideLatency(std::span<const ClientRequest> client,
                                          std::span<const TracedRequest> traced) {
  std::map<int, std::vector<size_t>> by_len;  // prompt length -> traced indices
  for (size_t j = 0; j < traced.size(); ++j) by_len[traced[j].prompt_tokens].push_back(j);
  std::vector<double> offsets;
  for (const ClientRequest& c : client) {
    const auto it = by_len.find(c.prompt_tokens);
    if (it == by_len.end()) continue;
    for (size_t j : it->second) offsets.push_back(traced[j].sent_s - c.arrival_s);
  }
  if (offsets.empty()) return InvalidArgument("outside latency: no prompt length in common");
  const double t0 = DensestOffset(std::move(offsets));
  std::vector<bool> used(traced.size(), false);
  OutsideSamples out;
  bool all_tails = true;
  for (const ClientRequest& c : client) {
    const auto it = by_len.find(c.prompt_tokens);
    if (it == by_len.end() || !std::isfinite(c.ttft_s) || c.ttft_s < 0) continue;
    size_t best = traced.size();
    double best_skew = kJoinMaxSkewS;
    for (size_t j : it->second) {
      const double skew = std::abs(traced[j].sent_s - c.arrival_s - t0);
      if (!used[j] && skew <= best_skew) {
        best = j;
        best_skew = skew;
      }
    }
    if (best == traced.size()) continue;
    used[best] = true;
    const TracedRequest& t = traced[best];
    out.outside_s.push_back(c.ttft_s - t.engines_s());
    out.inbound_s.push_back(t.arrived_s() - c.arrival_s - t0);
    const bool written = t.first_written_s >= 0 && t.last_written_s >= t.first_written_s;
    all_tails = all_tails && written && c.span_s >= 0;
    if (all_tails) out.tail_s.push_back(c.span_s - (t.last_written_s - t.first_written_s));
  }
  if (out.outside_s.empty()) return InvalidArgument("outside latency: no request joined");
  if (!all_tails) out.tail_s.clear();
  return out;
}

OutsideLatency OutsideLatency::Constant(double seconds) {
  OutsideLatency o;
  o.outside_s_ = {std::max(0.0, seconds)};
  return o;
}

Result<OutsideLatency> OutsideLatency::Sampled(const OutsideSamples& s, uint64_t seed) {
  const size_t n = s.outside_s.size();
  if (n == 0) return InvalidArgument("outside latency: no samples");
  for (const std::vector<double>* v : {&s.outside_s, &s.inbound_s, &s.tail_s}) {
    if (!v->empty() && v->size() != n) return InvalidArgument("outside latency: lists differ");
    for (double x : *v) {
      if (!std::isfinite(x)) return InvalidArgument("outside latency: a value is not finite");
    }
  }
  OutsideLatency o;
  o.seed_ = seed;
  o.outside_s_.clear();
  for (double x : s.outside_s) o.outside_s_.push_back(std::max(0.0, x));
  if (!s.inbound_s.empty()) {
    std::vector<double> sorted = s.inbound_s;
    const auto p5 = sorted.begin() + static_cast<std::ptrdiff_t>(0.05 * n);
    std::nth_element(sorted.begin(), p5, sorted.end());
    for (double x : s.inbound_s) o.inbound_s_.push_back(std::max(0.0, x - *p5));
  }
  o.tail_s_ = s.tail_s;
  return o;
}

size_t OutsideLatency::Draw(int64_t request_id) const {
  // SplitMix64 of (seed, id).
  uint64_t z = seed_ + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(request_id) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) % outside_s_.size();
}

double OutsideLatency::For(int64_t id) const { return outside_s_[Draw(id)]; }
double OutsideLatency::InboundFor(int64_t id) const {
  return inbound_s_.empty() ? 0.0 : inbound_s_[Draw(id)];
}
double OutsideLatency::TailFor(int64_t id) const {
  return tail_s_.empty() ? 0.0 : tail_s_[Draw(id)];
}

Result<std::vector<StepRecord>> EngineSteps(const std::vector<TraceEvent>& trace) {
  std::vector<StepRecord> out;
  for (const TraceEvent& e : trace) {
    if (e.name != "step" || e.cat != "engine" || e.ph != 'X') continue;
    const auto decodes = TraceArgInt(e, "decodes"),
               prefill_tokens = TraceArgInt(e, "prefill_tokens");
    if (!decodes || !prefill_tokens) {
      return InvalidArgument("trace: a step event lacks decodes or prefill_tokens");
    }
    out.push_back({static_cast<double>(e.ts_ns) * 1e-9, static_cast<double>(e.dur_ns) * 1e-9,
                   static_cast<int>(*decodes), *prefill_tokens, false});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const StepRecord& a, const StepRecord& b) { return a.start_s < b.start_s; });
  return out;
}

void MarkCorun(std::span<StepRecord> steps, std::span<const StepRecord> other) {
  size_t j = 0;  // the first step of `other` that may still be running
  for (StepRecord& s : steps) {
    while (j < other.size() && other[j].start_s + other[j].duration_s <= s.start_s) ++j;
    s.corun = false;
    for (size_t k = j; k < other.size() && other[k].start_s <= s.start_s; ++k) {
      if (other[k].start_s + other[k].duration_s > s.start_s) {
        s.corun = true;
        break;
      }
    }
  }
}

std::vector<StepRecord> StepsOfInstance(const SimResult& sim, int instance) {
  std::vector<StepRecord> out;
  for (const SimStep& s : sim.steps) {
    if (s.instance == instance) {
      out.push_back({s.start_s, s.duration_s, s.decode_seqs, s.prefill_tokens, s.corun});
    }
  }
  return out;
}

}  // namespace pd::planner
