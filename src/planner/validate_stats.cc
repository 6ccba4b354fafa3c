#include "planner/validate_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace pd::planner {
double UpperMedian(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result<double> SteadyCapacity(std::vector<double> per_set) {
  if (per_set.size() < 2) {
    return InvalidArgument("steady capacity: at least 2 pre-round probe sets");
  }
  for (double c : per_set) {
    if (!(c > 0) || !std::isfinite(c)) {
      return InvalidArgument("steady capacity: a probe set's capacity is not positive");
    }
  }
  std::sort(per_set.begin(), per_set.end());
  return per_set[(per_set.size() - 1) / 2];
}

namespace {

template <typename Get>
double MedianOf(std::span<const Summary> rounds, Get get) {
  std::vector<double> v;
  for (const Summary& s : rounds) v.push_back(get(s));
  return UpperMedian(std::move(v));
}

template <typename Get>
double SpreadOf(std::span<const Summary> rounds, Get get) {
  std::vector<double> v;
  for (const Summary& s : rounds) v.push_back(get(s));
  if (v.empty()) return 0.0;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  const double mid = UpperMedian(v);
  return mid == 0.0 ? 0.0 : (*hi - *lo) / std::fabs(mid);
}

bool AllHaveOther(std::span<const Summary> rounds) {
  return !rounds.empty() && std::all_of(rounds.begin(), rounds.end(),
                                        [](const Summary& s) { return s.other_attainment >= 0; });
}

}  // namespace

Summary MedianSummary(std::span<const Summary> rounds) {
  Summary m;
  if (rounds.empty()) return m;
  m.attainment = MedianOf(rounds, [](const Summary& s) { return s.attainment; });
  m.ttft_attainment = MedianOf(rounds, [](const Summary& s) { return s.ttft_attainment; });
  m.tpot_attainment = MedianOf(rounds, [](const Summary& s) { return s.tpot_attainment; });
  m.ttft_p50_s = MedianOf(rounds, [](const Summary& s) { return s.ttft_p50_s; });
  m.ttft_p90_s = MedianOf(rounds, [](const Summary& s) { return s.ttft_p90_s; });
  m.ttft_mean_s = MedianOf(rounds, [](const Summary& s) { return s.ttft_mean_s; });
  m.tpot_p50_s = MedianOf(rounds, [](const Summary& s) { return s.tpot_p50_s; });
  m.tpot_p90_s = MedianOf(rounds, [](const Summary& s) { return s.tpot_p90_s; });
  m.tpot_mean_s = MedianOf(rounds, [](const Summary& s) { return s.tpot_mean_s; });
  if (AllHaveOther(rounds))
    m.other_attainment = MedianOf(rounds, [](const Summary& s) { return s.other_attainment; });
  for (const Summary& s : rounds) {
    if (s.attainment == m.attainment) {
      m.num_requests = s.num_requests;
      m.num_failed = s.num_failed;
      break;
    }
  }
  return m;
}

Spread RelativeSpread(std::span<const Summary> rounds) {
  Spread s;
  s.attainment = SpreadOf(rounds, [](const Summary& r) { return r.attainment; });
  s.ttft_p50 = SpreadOf(rounds, [](const Summary& r) { return r.ttft_p50_s; });
  s.ttft_p90 = SpreadOf(rounds, [](const Summary& r) { return r.ttft_p90_s; });
  s.tpot_p50 = SpreadOf(rounds, [](const Summary& r) { return r.tpot_p50_s; });
  s.tpot_p90 = SpreadOf(rounds, [](const Summary& r) { return r.tpot_p90_s; });
  if (AllHaveOther(rounds))
    s.other_attainment = SpreadOf(rounds, [](const Summary& r) { return r.other_attainment; });
  return s;
}

std::string FormatSpread(const Spread& s) {
  char line[160];
  std::snprintf(
      line, sizeof(line), "att %.0f%% | TTFT p50 %.0f%% p90 %.0f%% | TPOT p50 %.0f%% p90 %.0f%%",
      100 * s.attainment, 100 * s.ttft_p50, 100 * s.ttft_p90, 100 * s.tpot_p50, 100 * s.tpot_p90);
  std::string out = line;
  if (s.other_attainment >= 0) {
    std::snprintf(line, sizeof(line), " | att at the other SLO %.0f%%", 100 * s.other_attainment);
    out += line;
  }
  return out;
}

Result<ClientCpuCost> SolveClientCpuCost(double tokens_a, double cpu_a, double tokens_b,
                                         double cpu_b) {
  if (!(tokens_a > 0) || !(tokens_b > 0) || tokens_a == tokens_b) {
    return InvalidArgument("client CPU probes need two different, positive output lengths");
  }
  if (!(cpu_a >= 0) || !(cpu_b >= 0)) {
    return InvalidArgument("client CPU probes: CPU seconds must be >= 0");
  }
  ClientCpuCost c;
  c.per_token_s = (cpu_b - cpu_a) / (tokens_b - tokens_a);
  c.per_request_s = cpu_a - c.per_token_s * tokens_a;
  if (c.per_token_s < 0) {
    c = {(cpu_a + cpu_b) / 2, 0.0};
  } else if (c.per_request_s < 0) {  // all per token: the least-squares slope through 0
    c = {0.0, (cpu_a * tokens_a + cpu_b * tokens_b) / (tokens_a * tokens_a + tokens_b * tokens_b)};
  }
  return c;
}

Result<ClientCpuCost> LoadedClientCpuCost(const ClientCpuCost& probe, double cpu_s, int requests,
                                          double mean_output_tokens) {
  if (requests < 1 || !(cpu_s >= 0) || !(mean_output_tokens >= 0)) {
    return InvalidArgument(
        "loaded client CPU: at least one request, CPU seconds and mean output tokens >= 0");
  }
  const double per_request = cpu_s / requests;
  const double probe_mean = probe.Seconds(mean_output_tokens);
  if (!(probe_mean > 0)) return ClientCpuCost{per_request, 0.0};
  const double k = per_request / probe_mean;
  return ClientCpuCost{probe.per_request_s * k, probe.per_token_s * k};
}

Result<double> BackgroundCpuStretch(const ClientCpuCost& shared, double rate,
                                    double mean_output_tokens, int cores,
                                    const ClientCpuCost& own) {
  if (!(rate >= 0) || cores < 1) {
    return InvalidArgument("background CPU: the rate must be >= 0 and the cores >= 1");
  }
  const double per_request =
      shared.Seconds(mean_output_tokens) / cores + own.Seconds(mean_output_tokens);
  const double u = std::min(0.9, rate * per_request);
  return 1.0 / (1.0 - u);
}

Result<double> SaturationRate(double work_s, double background_s) {
  if (!(work_s > 0) || !(background_s >= 0)) {
    return InvalidArgument("saturation rate: work must be > 0 and background CPU >= 0");
  }
  return 1.0 / (work_s + background_s);
}

Result<double> StretchAtRate(double measured, double measured_rate, double rate) {
  if (!(measured > 0) || !(measured_rate > 0) || !(rate >= 0)) {
    return InvalidArgument(
        "stretch at a rate: the measured stretch and rate must be > 0, the rate >= 0");
  }
  const double u = std::min(0.9, (1.0 - 1.0 / measured) * rate / measured_rate);
  return 1.0 / (1.0 - u);
}

double CorunFactor(std::span<const double> alone, std::span<const double> busy) {
  if (alone.size() != busy.size()) return 1.0;
  std::vector<double> ratios;
  for (size_t i = 0; i < alone.size(); ++i) {
    if (alone[i] > 0 && busy[i] > 0) ratios.push_back(busy[i] / alone[i]);
  }
  if (ratios.empty()) return 1.0;
  return std::clamp(UpperMedian(std::move(ratios)), 1.0, 4.0);
}

}  // namespace pd::planner
