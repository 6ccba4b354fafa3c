#include "planner/metrics.h"

#include <algorithm>
#include <cmath>

namespace pd::planner {

bool MeetsSlo(const RequestResult& r, const Slo& slo) {
  return r.done() && r.ttft_s() <= slo.ttft_s && r.tpot_s() <= slo.tpot_s;
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double pos = q * (values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (pos - lo);
}

double Attainment(std::span<const RequestResult> results, const Slo& slo) {
  if (results.empty()) return 0.0;
  int met = 0;
  for (const auto& r : results) met += MeetsSlo(r, slo);
  return met / static_cast<double>(results.size());
}

Summary Summarize(std::span<const RequestResult> results, const Slo& slo) {
  Summary s;
  s.num_requests = static_cast<int>(results.size());
  if (results.empty()) return s;
  std::vector<double> ttft, tpot;
  int ttft_ok = 0, tpot_ok = 0;
  for (const auto& r : results) {
    if (!r.done()) {
      ++s.num_failed;
      continue;
    }
    ttft.push_back(r.ttft_s());
    tpot.push_back(r.tpot_s());
    ttft_ok += r.ttft_s() <= slo.ttft_s;
    tpot_ok += r.tpot_s() <= slo.tpot_s;
  }
  const double n = static_cast<double>(results.size());
  s.attainment = Attainment(results, slo);
  s.ttft_attainment = ttft_ok / n;
  s.tpot_attainment = tpot_ok / n;
  s.ttft_p50_s = Percentile(ttft, 0.5);
  s.ttft_p90_s = Percentile(ttft, 0.9);
  s.tpot_p50_s = Percentile(tpot, 0.5);
  s.tpot_p90_s = Percentile(tpot, 0.9);
  for (double v : ttft) s.ttft_mean_s += v / ttft.size();
  for (double v : tpot) s.tpot_mean_s += v / tpot.size();
  return s;
}

}  // namespace pd::planner
