#include "planner/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace pd::planner {

double UpperMedian(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

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
  for (int i = bench.value("failed", 0); i > 0; --i) {
    out.push_back({});
    out.back().failed = true;
  }
  return out;
}

namespace {

// Least squares of y = p0 + p1 x with p0 >= lo0 and p1 >= lo1 (the unconstrained fit, else each
// bound in turn with the other refitted; the candidate with the smaller residual). `flat`: the
// xs do not differ, p1 is not identifiable.
struct Line {
  double p0 = 0.0, p1 = 0.0;
  bool flat = false;
};
Line FitBoundedLine(const std::vector<double>& x, const std::vector<double>& y, double lo0,
                    double lo1) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  Line out;
  const double det = n * sxx - sx * sx;
  if (!(det > 1e-12 * std::max(1.0, n * sxx))) {
    out.flat = true;
    return out;
  }
  auto sse = [&](const Line& l) {
    double e = 0;
    for (size_t i = 0; i < x.size(); ++i) e += std::pow(y[i] - l.p0 - l.p1 * x[i], 2);
    return e;
  };
  Line free{(sxx * sy - sx * sxy) / det, (n * sxy - sx * sy) / det};
  if (free.p0 >= lo0 && free.p1 >= lo1) return free;
  // p0 held at lo0: p1 = Σx(y − lo0) / Σx²; p1 held at lo1: p0 = mean(y − lo1·x).
  Line a{lo0, std::max(lo1, sxx > 0 ? (sxy - lo0 * sx) / sxx : lo1)};
  Line b{std::max(lo0, (sy - lo1 * sx) / n), lo1};
  return sse(a) <= sse(b) ? a : b;
}

// The mean of `y`, at least 0.
double MeanAtLeastZero(const std::vector<double>& y) {
  double sum = 0;
  for (double v : y) sum += v;
  return std::max(0.0, sum / static_cast<double>(y.size()));
}

}  // namespace

Result<RealOverheads> SolveOverheads(const std::vector<IdleProbe>& probes,
                                     const std::vector<DecodeProbe>& decode_probes) {
  if (probes.empty()) return InvalidArgument("overheads: no idle TTFT probes");
  if (decode_probes.empty()) return InvalidArgument("overheads: no decode probes");
  RealOverheads o;
  std::vector<double> x, y;
  for (const DecodeProbe& d : decode_probes) {
    if (d.batch < 1) return InvalidArgument("overheads: a decode probe's batch must be >= 1");
    x.push_back(d.batch);
    y.push_back((d.measured_tpot_s - d.modelled_tpot_s) * 1e3);
  }
  const Line decode = FitBoundedLine(x, y, 0.0, 0.0);
  if (decode.flat) {  // one batch size: all per sequence
    for (size_t i = 0; i < x.size(); ++i) y[i] /= x[i];
    o.decode_seq_ms = MeanAtLeastZero(y);
  } else {
    o.decode_fixed_ms = decode.p0;
    o.decode_seq_ms = decode.p1;
  }
  // The first token's step is a batch-1 decode step, calibrated as above.
  const double first_step_extra_s = (o.decode_fixed_ms + o.decode_seq_ms) * 1e-3;
  double cm = 0, mm = 0;
  for (const IdleProbe& p : probes) {
    if (!(p.measured_prefill_cpu_s > 0) || !(p.modelled_prefill_s > 0)) {
      return InvalidArgument("overheads: a TTFT probe without its measured prefill compute time");
    }
    cm += p.measured_prefill_cpu_s * p.modelled_prefill_s;
    mm += p.modelled_prefill_s * p.modelled_prefill_s;
  }
  o.prefill_scale = std::max(kMinPrefillScale, cm / mm);
  x.clear();
  y.clear();
  for (const IdleProbe& p : probes) {
    x.push_back(p.prompt_len);
    y.push_back(p.measured_ttft_s - (p.modelled_ttft_s - p.modelled_prefill_s) -
                first_step_extra_s - o.prefill_scale * p.modelled_prefill_s);
  }
  const Line rest = FitBoundedLine(x, y, 0.0, 0.0);
  if (rest.flat) {
    o.fixed_s = MeanAtLeastZero(y);
  } else {
    o.fixed_s = rest.p0;
    o.transfer_s_per_token = rest.p1;
  }
  return o;
}

double CorunFactor(std::vector<double> ratios) {
  return ratios.empty() ? 1.0 : std::clamp(UpperMedian(std::move(ratios)), 1.0, 4.0);
}

namespace {

// The five compared metrics of a summary.
constexpr double Summary::*kMetrics[] = {&Summary::attainment, &Summary::ttft_p50_s,
                                         &Summary::ttft_p90_s, &Summary::tpot_p50_s,
                                         &Summary::tpot_p90_s};

}  // namespace

Summary MedianSummary(std::span<const Summary> rounds) {
  Summary m;
  if (rounds.empty()) return m;
  for (double Summary::*f :
       {&Summary::attainment, &Summary::ttft_attainment, &Summary::tpot_attainment,
        &Summary::ttft_p50_s, &Summary::ttft_p90_s, &Summary::ttft_mean_s, &Summary::tpot_p50_s,
        &Summary::tpot_p90_s, &Summary::tpot_mean_s}) {
    std::vector<double> v;
    for (const Summary& s : rounds) v.push_back(s.*f);
    m.*f = UpperMedian(std::move(v));
  }
  m.num_requests = rounds[0].num_requests;
  m.num_failed = rounds[0].num_failed;
  return m;
}

Summary RelativeSpread(std::span<const Summary> rounds) {
  Summary out;
  for (double Summary::*f : kMetrics) {
    std::vector<double> v;
    for (const Summary& s : rounds) v.push_back(s.*f);
    if (v.empty()) continue;
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    const double mid = UpperMedian(v);
    out.*f = mid == 0.0 ? 0.0 : (*hi - *lo) / std::fabs(mid);
  }
  return out;
}

double RelDiff(double simulated, double measured) {
  if (measured == 0.0) return simulated == 0.0 ? 0.0 : INFINITY;
  return (simulated - measured) / measured;
}

std::string FormatComparison(std::span<const ComparisonRow> rows) {
  static const char* kNames[] = {"SLO att.", "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90"};
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-8s %-10s %12s %12s %9s\n", "rate", "metric", "simulated",
                "measured", "sim/real");
  out += line;
  for (const ComparisonRow& r : rows) {
    for (int k = 0; k < 5; ++k) {
      char rate[16] = "";
      if (k == 0) std::snprintf(rate, sizeof(rate), "%.3g", r.rate);
      const double sim = r.simulated.*kMetrics[k], real = r.measured.*kMetrics[k];
      const double scale = k == 0 ? 100 : 1e3;
      const char* unit = k == 0 ? "%" : "ms";
      std::snprintf(line, sizeof(line), "%-8s %-10s %10.2f%-2s %10.2f%-2s %+8.1f%%\n", rate,
                    kNames[k], sim * scale, unit, real * scale, unit, 100 * RelDiff(sim, real));
      out += line;
    }
  }
  return out;
}

nlohmann::json ComparisonToJson(std::span<const ComparisonRow> rows) {
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

int CellsWithin(std::span<const ComparisonRow> rows, double tolerance) {
  int n = 0;
  for (const ComparisonRow& r : rows) {
    for (double Summary::*f : kMetrics) {
      if (std::fabs(RelDiff(r.simulated.*f, r.measured.*f)) <= tolerance) ++n;
    }
  }
  return n;
}

}  // namespace pd::planner
