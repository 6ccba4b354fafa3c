#include "planner/ttft_parts.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "planner/metrics.h"

namespace pd::planner {
namespace {

using nlohmann::json;

Result<json> ParseTrace(const std::string& text, const char* which) {
  try {
    json doc = json::parse(text);
    if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
      return InvalidArgument(std::string(which) + " trace: no 'traceEvents' array");
    }
    return doc;
  } catch (const json::exception& e) {
    return InvalidArgument(std::string(which) + " trace: " + e.what());
  }
}

// Seconds on the traces' clock from an event's "ts" (microseconds).
double Ts(const json& e) { return e.value("ts", 0.0) * 1e-6; }
double End(const json& e) { return (e.value("ts", 0.0) + e.value("dur", 0.0)) * 1e-6; }

std::string RequestArg(const json& args) {
  if (!args.contains("request")) return "";
  const json& r = args["request"];
  return r.is_string() ? r.get<std::string>() : r.dump();
}

// The prefill side: when each request arrived, the first and last step its KV came from, and
// every step's span.
struct PrefillSide {
  std::map<std::string, double> got;
  std::map<std::string, std::pair<int64_t, int64_t>> steps_of;  // first, last step
  std::map<int64_t, std::pair<double, double>> steps;           // step -> begin, end
};

PrefillSide ReadPrefill(const json& doc) {
  PrefillSide p;
  for (const json& e : doc["traceEvents"]) {
    const std::string name = e.value("name", "");
    const json args = e.contains("args") ? e["args"] : json::object();
    if (name == "prefill request" || (name == "transfer" && e.value("ph", "") == "X")) {
      // The earlier of the two: "transfer" begins when the messenger admitted the request,
      // before it handed it to the engine and traced "prefill request".
      auto [it, fresh] = p.got.emplace(RequestArg(args), Ts(e));
      if (!fresh) it->second = std::min(it->second, Ts(e));
    } else if (name == "post writes" && args.contains("step") && args["step"].is_number()) {
      const int64_t step = args["step"].get<int64_t>();
      auto [it, fresh] = p.steps_of.emplace(RequestArg(args), std::make_pair(step, step));
      if (!fresh) {
        it->second.first = std::min(it->second.first, step);
        it->second.second = std::max(it->second.second, step);
      }
    } else if (name == "step" && e.value("cat", "") == "engine" && args.contains("step")) {
      p.steps[args["step"].get<int64_t>()] = {Ts(e), End(e)};
    }
  }
  return p;
}

}  // namespace

Result<std::vector<TracedRequest>> TracedRequestsFromTraces(const std::string& prefill_json,
                                                            const std::string& decode_json) {
  ASSIGN_OR_RETURN(const json pre, ParseTrace(prefill_json, "prefill"));
  ASSIGN_OR_RETURN(const json dec, ParseTrace(decode_json, "decode"));
  const PrefillSide p = ReadPrefill(pre);
  std::map<std::string, TracedRequest> sent;  // by id: sent_s, prompt_tokens, kv_ready_s
  std::vector<std::pair<double, double>> dsteps;
  std::map<std::string, std::string> by_engine_id;           // engine request id -> messenger's id
  std::map<std::string, std::pair<double, double>> written;  // engine id -> first, last write
  try {
    for (const json& e : dec["traceEvents"]) {
      const std::string name = e.value("name", "");
      const json args = e.contains("args") ? e["args"] : json::object();
      if (name == "prefill request sent") {
        TracedRequest r;
        r.id = RequestArg(args);
        r.sent_s = Ts(e);
        r.prompt_tokens = args.value("tokens", -1) + 1;
        r.kv_ready_s = -1;
        sent.emplace(r.id, r);  // the first attempt's
        if (args.contains("engine_request")) {
          by_engine_id.emplace(args["engine_request"].dump(), r.id);  // the first attempt's
        }
      } else if ((name == "first token written" || name == "last token written") &&
                 args.contains("request")) {
        auto [it, fresh] = written.emplace(args["request"].dump(), std::make_pair(-1.0, -1.0));
        (name == "first token written" ? it->second.first : it->second.second) = Ts(e);
      } else if (name == "kv ready") {
        auto it = sent.find(RequestArg(args));
        if (it != sent.end()) it->second.kv_ready_s = Ts(e);
      } else if (name == "step" && e.value("cat", "") == "engine") {
        dsteps.emplace_back(Ts(e), End(e));
      }
    }
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("decode trace: ") + e.what());
  }
  std::sort(dsteps.begin(), dsteps.end());
  for (const auto& [engine_id, w] : written) {
    const auto id = by_engine_id.find(engine_id);
    if (id == by_engine_id.end()) continue;
    const auto it = sent.find(id->second);
    if (it == sent.end()) continue;
    it->second.first_written_s = w.first;
    it->second.last_written_s = w.second;
  }
  std::vector<TracedRequest> out;
  for (auto& [id, r] : sent) {
    const auto got = p.got.find(id);
    const auto st = p.steps_of.find(id);
    if (got == p.got.end() || st == p.steps_of.end() || r.kv_ready_s < 0) continue;
    const auto first = p.steps.find(st->second.first);
    const auto last = p.steps.find(st->second.second);
    if (first == p.steps.end() || last == p.steps.end()) continue;
    const auto next =
        std::lower_bound(dsteps.begin(), dsteps.end(), std::make_pair(r.kv_ready_s, -1e300));
    if (next == dsteps.end()) continue;
    r.got_s = got->second;
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
    if (!(r.step_s() > 0)) continue;
    const double f = (r.kv_ready_s - r.step_begin_s) / r.step_s();
    if (!std::isfinite(f) || f <= 0) {
      return FailedPrecondition("request " + r.id + ": its KV was ready at or before its prefill " +
                                "step began (" +
                                std::to_string((r.kv_ready_s - r.step_begin_s) * 1e3) + " ms)");
    }
    fractions.push_back(std::min(f, 1.0));
  }
  if (fractions.empty() || fractions.size() < min_requests) {
    return FailedPrecondition("KV ready fraction: " + std::to_string(fractions.size()) +
                              " traced requests with a prefill step, under the " +
                              std::to_string(min_requests) + " needed");
  }
  return Percentile(std::move(fractions), 0.5);
}

namespace {

// The start of the densest `bin_s`-wide window of offsets (sorted); its middle is returned.
double DensestOffset(std::vector<double> offsets, double bin_s) {
  std::sort(offsets.begin(), offsets.end());
  size_t best_lo = 0, best_n = 0;
  for (size_t lo = 0, hi = 0; lo < offsets.size(); ++lo) {
    hi = std::max(hi, lo);
    while (hi < offsets.size() && offsets[hi] - offsets[lo] <= bin_s) ++hi;
    if (hi - lo > best_n) {
      best_n = hi - lo;
      best_lo = lo;
    }
  }
  // The median of the window's offsets: its centre, robust to a stray value at either edge.
  return offsets[best_lo + (best_n - 1) / 2];
}

}  // namespace

Result<std::vector<OutsideSample>> JoinOutsideLatency(std::span<const ClientRequest> client,
                                                      std::span<const TracedRequest> traced,
                                                      const JoinOptions& options) {
  if (!(options.bin_s > 0) || !(options.max_skew_s > 0)) {
    return InvalidArgument("outside latency join: bin_s and max_skew_s must be positive");
  }
  std::map<int, std::vector<size_t>> by_len;  // prompt length -> traced indices
  for (size_t j = 0; j < traced.size(); ++j) by_len[traced[j].prompt_tokens].push_back(j);
  std::vector<double> offsets;
  for (const ClientRequest& c : client) {
    const auto it = by_len.find(c.prompt_tokens);
    if (it == by_len.end()) continue;
    for (size_t j : it->second) offsets.push_back(traced[j].sent_s - c.arrival_s);
  }
  if (offsets.empty()) {
    return InvalidArgument("outside latency join: no traced request has a client's prompt length");
  }
  const double t0 = DensestOffset(std::move(offsets), options.bin_s);
  std::vector<bool> used(traced.size(), false);
  std::vector<OutsideSample> out;
  for (size_t i = 0; i < client.size(); ++i) {
    const ClientRequest& c = client[i];
    const auto it = by_len.find(c.prompt_tokens);
    if (it == by_len.end() || !std::isfinite(c.ttft_s) || c.ttft_s < 0) continue;
    size_t best = traced.size();
    double best_skew = options.max_skew_s;
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
    const double tail = c.span_s >= 0 && t.has_written() ? c.span_s - t.written_span_s()
                                                         : std::numeric_limits<double>::quiet_NaN();
    out.push_back({i, best, c.ttft_s - t.engines_s(), t.arrived_s() - c.arrival_s - t0, tail});
  }
  if (out.empty()) return InvalidArgument("outside latency join: no request joined");
  return out;
}

OutsideLatency OutsideLatency::Constant(double seconds) {
  OutsideLatency o;
  o.constant_s_ = std::max(0.0, seconds);
  return o;
}

Result<OutsideLatency> OutsideLatency::Sampled(std::vector<double> samples_s, uint64_t seed) {
  return SampledWithInbound(std::move(samples_s), {}, seed);
}

Result<OutsideLatency> OutsideLatency::SampledWithInbound(std::vector<double> samples_s,
                                                          std::vector<double> inbound_s,
                                                          uint64_t seed,
                                                          std::vector<double> tail_s) {
  if (samples_s.empty()) return InvalidArgument("outside latency: no samples");
  if (!inbound_s.empty() && inbound_s.size() != samples_s.size()) {
    return InvalidArgument("outside latency: " + std::to_string(inbound_s.size()) +
                           " ways in for " + std::to_string(samples_s.size()) + " samples");
  }
  if (!tail_s.empty() && tail_s.size() != samples_s.size()) {
    return InvalidArgument("outside latency: " + std::to_string(tail_s.size()) + " tails for " +
                           std::to_string(samples_s.size()) + " samples");
  }
  for (double s : tail_s) {
    if (!std::isfinite(s)) return InvalidArgument("outside latency: a tail is not finite");
  }
  for (double& s : samples_s) {
    if (!std::isfinite(s)) return InvalidArgument("outside latency: a sample is not finite");
    s = std::max(0.0, s);
  }
  for (double s : inbound_s) {
    if (!std::isfinite(s)) return InvalidArgument("outside latency: a way in is not finite");
  }
  // The samples sorted, each way in kept beside its own sample.
  std::vector<size_t> order(samples_s.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return samples_s[a] < samples_s[b]; });
  OutsideLatency o;
  o.seed_ = seed;
  for (size_t i : order) o.samples_s_.push_back(samples_s[i]);
  if (!inbound_s.empty()) {
    std::vector<double> sorted_in = inbound_s;
    const auto p5 = sorted_in.begin() + static_cast<std::ptrdiff_t>(0.05 * sorted_in.size());
    std::nth_element(sorted_in.begin(), p5, sorted_in.end());
    for (size_t i : order) o.inbound_s_.push_back(std::max(0.0, inbound_s[i] - *p5));
  }
  if (!tail_s.empty()) {
    for (size_t i : order) o.tail_s_.push_back(tail_s[i]);
  }
  return o;
}

size_t OutsideLatency::Draw(int64_t request_id) const {
  // SplitMix64 of (seed, id): the same request draws the same sample in every simulation.
  uint64_t z = seed_ + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(request_id) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z % samples_s_.size();
}

double OutsideLatency::For(int64_t request_id) const {
  if (samples_s_.empty()) return constant_s_;
  return samples_s_[Draw(request_id)];
}

double OutsideLatency::InboundFor(int64_t request_id) const {
  if (inbound_s_.empty()) return 0.0;
  return inbound_s_[Draw(request_id)];
}

double OutsideLatency::TailFor(int64_t request_id) const {
  if (tail_s_.empty()) return 0.0;
  return tail_s_[Draw(request_id)];
}

double OutsideLatency::TailMean() const {
  if (tail_s_.empty()) return 0.0;
  double sum = 0;
  for (double s : tail_s_) sum += s;
  return sum / static_cast<double>(tail_s_.size());
}

double OutsideLatency::Quantile(double q) const {
  if (samples_s_.empty()) return constant_s_;
  q = std::clamp(q, 0.0, 1.0);
  const double pos = q * static_cast<double>(samples_s_.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, samples_s_.size() - 1);
  return samples_s_[lo] + (pos - static_cast<double>(lo)) * (samples_s_[hi] - samples_s_[lo]);
}

double OutsideLatency::Mean() const {
  if (samples_s_.empty()) return constant_s_;
  double sum = 0;
  for (double s : samples_s_) sum += s;
  return sum / static_cast<double>(samples_s_.size());
}

std::vector<SimRequest> WithInboundDelays(std::span<const SimRequest> sent,
                                          const OutsideLatency& outside) {
  std::vector<SimRequest> out(sent.begin(), sent.end());
  for (SimRequest& r : out) r.arrival_s += outside.InboundFor(r.id);
  return out;
}

}  // namespace pd::planner
