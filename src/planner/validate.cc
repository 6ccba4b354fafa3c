#include "planner/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace pd::planner {

Result<std::vector<RequestResult>> MeasuredFromBenchJson(const nlohmann::json& bench,
                                                         const std::string& source) {
  for (const char* key : {"ttfts", "itls", "output_lens"}) {
    if (!bench.contains(key) || !bench[key].is_array()) {
      return InvalidArgument(source + ": missing array '" + key + "'");
    }
  }
  const auto& ttfts = bench["ttfts"];
  const auto& itls = bench["itls"];
  const auto& outs = bench["output_lens"];
  if (ttfts.size() != itls.size() || ttfts.size() != outs.size()) {
    return InvalidArgument(source + ": 'ttfts', 'itls' and 'output_lens' differ in length");
  }
  std::vector<RequestResult> out;
  for (size_t i = 0; i < ttfts.size(); ++i) {
    if (!ttfts[i].is_number() || !outs[i].is_number_integer() || !itls[i].is_array()) {
      return InvalidArgument(source + ": request " + std::to_string(i) + " is malformed");
    }
    RequestResult r;
    r.id = static_cast<int64_t>(i);
    r.output_len = outs[i].get<int>();
    r.first_token_s = ttfts[i].get<double>();
    double gaps = 0.0;
    for (const auto& g : itls[i]) gaps += g.is_number() ? g.get<double>() : 0.0;
    // The mean gap after the first token: the stream's chunks may merge tokens, so the sum of
    // gaps over output_len - 1 tokens, not the mean of the gaps.
    r.finish_s = r.first_token_s + gaps;
    if (r.output_len <= 1) r.finish_s = r.first_token_s;
    out.push_back(r);
  }
  const int failed = bench.value("failed", 0);
  for (int i = 0; i < failed; ++i) {
    RequestResult r;
    r.id = static_cast<int64_t>(out.size());
    r.failed = true;
    out.push_back(r);
  }
  return out;
}

Result<RealOverheads> SolveOverheads(const std::vector<IdleProbe>& probes, double measured_tpot_s,
                                     double modelled_tpot_s) {
  if (probes.empty()) return InvalidArgument("overheads: no idle probes");
  // Least squares of resid = fixed + per_token · prompt_len.
  const double n = static_cast<double>(probes.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const IdleProbe& p : probes) {
    const double x = p.prompt_len, y = p.measured_ttft_s - p.modelled_ttft_s;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  RealOverheads o;
  const double det = n * sxx - sx * sx;
  if (det > 1e-9 * std::max(1.0, sxx * n)) o.per_token_s = (n * sxy - sx * sy) / det;
  o.per_token_s = std::max(0.0, o.per_token_s);
  // The fixed cost from the shortest prompt, where the latency model's own error (relative, so
  // growing with the step time) disturbs it least.
  const IdleProbe* shortest = &probes[0];
  for (const IdleProbe& p : probes)
    if (p.prompt_len < shortest->prompt_len) shortest = &p;
  o.fixed_s = std::max(0.0, shortest->measured_ttft_s - shortest->modelled_ttft_s -
                                o.per_token_s * shortest->prompt_len);
  o.decode_step_ms = std::max(0.0, (measured_tpot_s - modelled_tpot_s) * 1e3);
  return o;
}

double RelDiff(double simulated, double measured) {
  if (measured == 0.0) return simulated == 0.0 ? 0.0 : INFINITY;
  return (simulated - measured) / measured;
}

std::string FormatComparison(const std::vector<ComparisonRow>& rows) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-8s %-10s %12s %12s %9s\n", "rate", "metric", "simulated",
                "measured", "sim/real");
  out += line;
  for (const ComparisonRow& r : rows) {
    struct Metric {
      const char* name;
      double sim, real, scale;
      const char* unit;
    };
    const Metric metrics[] = {
        {"SLO att.", r.simulated.attainment, r.measured.attainment, 100, "%"},
        {"TTFT p50", r.simulated.ttft_p50_s, r.measured.ttft_p50_s, 1e3, "ms"},
        {"TTFT p90", r.simulated.ttft_p90_s, r.measured.ttft_p90_s, 1e3, "ms"},
        {"TPOT p50", r.simulated.tpot_p50_s, r.measured.tpot_p50_s, 1e3, "ms"},
        {"TPOT p90", r.simulated.tpot_p90_s, r.measured.tpot_p90_s, 1e3, "ms"},
    };
    bool first = true;
    for (const Metric& m : metrics) {
      char rate[16] = "";
      if (first) std::snprintf(rate, sizeof(rate), "%.3g", r.rate);
      first = false;
      std::snprintf(line, sizeof(line), "%-8s %-10s %10.2f%-2s %10.2f%-2s %+8.1f%%\n", rate, m.name,
                    m.sim * m.scale, m.unit, m.real * m.scale, m.unit,
                    100 * RelDiff(m.sim, m.real));
      out += line;
    }
  }
  return out;
}

nlohmann::json ComparisonToJson(const std::vector<ComparisonRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  auto side = [](const Summary& s) {
    return nlohmann::json{{"attainment", s.attainment}, {"ttft_p50_s", s.ttft_p50_s},
                          {"ttft_p90_s", s.ttft_p90_s}, {"tpot_p50_s", s.tpot_p50_s},
                          {"tpot_p90_s", s.tpot_p90_s}, {"num_requests", s.num_requests},
                          {"num_failed", s.num_failed}};
  };
  for (const ComparisonRow& r : rows) {
    out.push_back(
        {{"rate", r.rate}, {"simulated", side(r.simulated)}, {"measured", side(r.measured)}});
  }
  return out;
}

}  // namespace pd::planner
