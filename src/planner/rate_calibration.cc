#include "planner/rate_calibration.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>

namespace pd::planner {

Result<size_t> UpperMedianIndex(std::span<const double> values) {
  if (values.empty()) return InvalidArgument("UpperMedianIndex: no values");
  for (double v : values) {
    if (!std::isfinite(v)) return InvalidArgument("UpperMedianIndex: a value is not finite");
  }
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return values[a] < values[b]; });
  return order[values.size() / 2];
}

Result<double> PrefillBusyStretch(std::span<const StepRecord> real, std::span<const StepRecord> sim,
                                  int64_t min_steps) {
  double real_s = 0, sim_s = 0;
  int64_t n = 0;
  for (const StepRecord& s : real) {
    if (s.prefill_tokens <= 0) continue;
    real_s += s.duration_s;
    ++n;
  }
  for (const StepRecord& s : sim) {
    if (s.prefill_tokens > 0) sim_s += s.duration_s;
  }
  if (n < min_steps) {
    return FailedPrecondition("prefill busy stretch: " + std::to_string(n) +
                              " traced prefill steps, need " + std::to_string(min_steps));
  }
  if (!(sim_s > 0) || !std::isfinite(real_s) || !std::isfinite(sim_s)) {
    return FailedPrecondition("prefill busy stretch: no simulated prefill time");
  }
  return real_s / sim_s;
}

Result<std::vector<double>> PrefillStepRatios(
    std::span<const TracedRequest> traced, double begin_s, double end_s,
    const std::function<double(const StepShape& shape, double step_begin_s)>& model_s,
    size_t min_steps) {
  std::map<double, std::pair<double, StepShape>> steps;  // begin -> (end, shape)
  for (const TracedRequest& r : traced) {
    if (r.step_begin_s < begin_s || r.step_begin_s > end_s || r.step_s() <= 0) continue;
    auto& [end, shape] = steps[r.step_begin_s];
    end = r.step_end_s;
    shape.prefill_tokens += r.prompt_tokens;
    shape.prefill_sq += static_cast<double>(r.prompt_tokens) * r.prompt_tokens;
  }
  if (steps.size() < std::max<size_t>(min_steps, 1)) {
    return FailedPrecondition("prefill step ratios: " + std::to_string(steps.size()) +
                              " traced steps in the window, need " + std::to_string(min_steps));
  }
  std::vector<double> ratios;
  for (const auto& [begin, step] : steps) {
    const double model = model_s(step.second, begin);
    if (!(model > 0) || !std::isfinite(model)) {
      return InvalidArgument("prefill step ratios: the model's step is not positive and finite");
    }
    ratios.push_back((step.first - begin) / model);
  }
  return ratios;
}

Result<LevelAndSpread> SplitLevel(std::vector<double> ratios) {
  if (ratios.empty()) return InvalidArgument("SplitLevel: no ratios");
  for (double r : ratios) {
    if (!(r > 0) || !std::isfinite(r)) {
      return InvalidArgument("SplitLevel: a ratio is not positive and finite");
    }
  }
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  LevelAndSpread out;
  out.level = n % 2 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
  for (double& r : ratios) r /= out.level;
  out.spread = std::move(ratios);
  return out;
}

namespace {

double Mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// The median over the runs that gave `get`, and how many did.
Result<std::optional<double>> MedianOf(std::span<const CalibrationRunFactors> runs,
                                       std::optional<double> CalibrationRunFactors::*get,
                                       int* count) {
  std::vector<double> v;
  for (const CalibrationRunFactors& r : runs) {
    if (r.*get) v.push_back(*(r.*get));
  }
  *count = static_cast<int>(v.size());
  if (v.empty()) return std::optional<double>();
  ASSIGN_OR_RETURN(const size_t k, UpperMedianIndex(v));
  return std::optional<double>(v[k]);
}

Status CheckRuns(std::span<const CalibrationRunFactors> runs, double output_tokens) {
  if (runs.empty()) return InvalidArgument("CombineCalibrationRuns: no calibration runs");
  if (!std::isfinite(output_tokens) || output_tokens < 0) {
    return InvalidArgument("CombineCalibrationRuns: output_tokens must be finite and >= 0");
  }
  for (const CalibrationRunFactors& r : runs) {
    if (r.rate != runs[0].rate) {
      return InvalidArgument("CombineCalibrationRuns: the runs' rates differ");
    }
    if (!std::isfinite(r.rate) || r.rate <= 0) {
      return InvalidArgument("CombineCalibrationRuns: a rate is not positive and finite");
    }
    if (r.client_cpu && !std::isfinite(r.client_cpu->Seconds(output_tokens))) {
      return InvalidArgument("CombineCalibrationRuns: a client CPU cost is not finite");
    }
  }
  return OkStatus();
}

}  // namespace

Result<RateCalibration> CombineCalibrationRuns(std::span<const CalibrationRunFactors> runs,
                                               double output_tokens) {
  RETURN_IF_ERROR(CheckRuns(runs, output_tokens));
  RateCalibration out;
  out.rate = runs[0].rate;
  out.runs = static_cast<int>(runs.size());
  ASSIGN_OR_RETURN(out.prefill_stretch,
                   MedianOf(runs, &CalibrationRunFactors::prefill_stretch, &out.prefill_runs));
  ASSIGN_OR_RETURN(out.decode_stretch,
                   MedianOf(runs, &CalibrationRunFactors::decode_stretch, &out.stretch_runs));
  ASSIGN_OR_RETURN(out.decode_corun,
                   MedianOf(runs, &CalibrationRunFactors::decode_corun, &out.corun_runs));
  std::vector<double> levels, p90s;
  std::vector<size_t> spread_run;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!runs[i].prefill_steps || runs[i].prefill_steps->spread.empty()) continue;
    const std::vector<double>& sp = runs[i].prefill_steps->spread;
    levels.push_back(runs[i].prefill_steps->level);
    p90s.push_back(sp[std::min(sp.size() - 1, static_cast<size_t>(0.9 * sp.size()))]);
    spread_run.push_back(i);
  }
  out.prefill_step_runs = static_cast<int>(levels.size());
  if (!levels.empty()) {
    ASSIGN_OR_RETURN(const size_t k, UpperMedianIndex(levels));
    out.prefill_level = levels[k];
    ASSIGN_OR_RETURN(const size_t j, UpperMedianIndex(p90s));
    out.prefill_spread = runs[spread_run[j]].prefill_steps->spread;
  }
  std::vector<double> cost, mean;
  std::vector<size_t> cost_run, mean_run;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].client_cpu) {
      cost.push_back(runs[i].client_cpu->Seconds(output_tokens));
      cost_run.push_back(i);
    }
    if (!runs[i].outside_s.empty()) {
      mean.push_back(Mean(runs[i].outside_s));
      mean_run.push_back(i);
    }
  }
  out.client_runs = static_cast<int>(cost.size());
  out.outside_runs = static_cast<int>(mean.size());
  if (!cost.empty()) {
    ASSIGN_OR_RETURN(const size_t k, UpperMedianIndex(cost));
    out.client_run = cost_run[k];
    out.client_cpu = runs[cost_run[k]].client_cpu;
  }
  if (!mean.empty()) {
    auto k = UpperMedianIndex(mean);
    if (!k.ok()) return InvalidArgument("CombineCalibrationRuns: an outside sample is not finite");
    out.outside_run = mean_run[*k];
    out.outside_s = runs[mean_run[*k]].outside_s;
  }
  return out;
}

}  // namespace pd::planner
