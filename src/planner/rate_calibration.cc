#include "planner/rate_calibration.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "planner/fit.h"

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
                                  int64_t min_steps, double left_out_s) {
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
  if (!(left_out_s >= 0 && left_out_s <= real_s / 2)) {
    return FailedPrecondition("prefill busy stretch: " + std::to_string(left_out_s) +
                              " s to leave out of " + std::to_string(real_s) + " s traced");
  }
  return (real_s - left_out_s) / sim_s;
}

const char* ArrivalMeasureKey(ArrivalMeasure m) {
  switch (m) {
    case ArrivalMeasure::kLessChance:
      return "arrival_work";
    case ArrivalMeasure::kHeld:
      return "held_work";
    case ArrivalMeasure::kOwnFit:
      return "own_fit_work";
  }
  return "?";
}

std::optional<double> PrefillArrivalWork::Work(ArrivalMeasure m) const {
  switch (m) {
    case ArrivalMeasure::kLessChance:
      return work_s;
    case ArrivalMeasure::kHeld:
      return std::max(0.0, held_s);
    case ArrivalMeasure::kOwnFit:
      if (!fit_held_s || !fit_chance_s) return std::nullopt;
      return std::max(0.0, *fit_held_s - *fit_chance_s);
  }
  return std::nullopt;
}

namespace {

// One traced prefill step as MeasurePrefillArrivalWork counts it.
struct CountedStep {
  double real_s;
  int64_t tokens;
  double sq;  // Σ prompt lengths², as PrefillStepFactors takes it
  int arrivals;
  bool corun;
  double free_by_chance = 0;  // exp(-rate x real_s)
};

// The held steps' excess per request that came during them and the excess expected by chance
// (MeasurePrefillArrivalWork), with `model_s` the step's time by the model it is set against;
// the held steps (and requests) of a co-run mark without free steps are not counted.
struct HeldExcess {
  double held_s = 0, chance_s = 0;
  int64_t held_steps = 0, arrivals = 0;
};
template <typename ModelS>
HeldExcess HeldAndChance(std::span<const CountedStep> counted, double rate, ModelS model_s) {
  double free_real[2] = {0, 0}, free_model[2] = {0, 0}, chance_real[2] = {0, 0},
         chance_model[2] = {0, 0};
  for (const CountedStep& c : counted) {
    chance_real[c.corun] += c.free_by_chance * c.real_s;
    chance_model[c.corun] += c.free_by_chance * model_s(c);
    if (c.arrivals > 0) continue;
    free_real[c.corun] += c.real_s;
    free_model[c.corun] += model_s(c);
  }
  HeldExcess out;
  double excess = 0, chance_excess = 0, chance_arrivals = 0;
  for (const CountedStep& c : counted) {
    if (!(free_model[c.corun] > 0)) continue;
    if (c.arrivals > 0) {
      excess += c.real_s - model_s(c) * free_real[c.corun] / free_model[c.corun];
      out.arrivals += c.arrivals;
      ++out.held_steps;
    }
    chance_excess += (1 - c.free_by_chance) *
                     (c.real_s - model_s(c) * chance_real[c.corun] / chance_model[c.corun]);
    chance_arrivals += rate * c.real_s;
  }
  if (out.arrivals > 0) out.held_s = excess / static_cast<double>(out.arrivals);
  if (chance_arrivals > 0) out.chance_s = chance_excess / chance_arrivals;
  return out;
}

}  // namespace

Result<PrefillArrivalWork> MeasurePrefillArrivalWork(std::span<const StepRecord> steps,
                                                     std::span<const TracedRequest> traced,
                                                     const StepCoeffs& model, int64_t min_steps) {
  // The requests' instants at the instance, each with the start of the step that computed it.
  std::vector<std::pair<double, double>> got;  // (got_s, its step's start)
  got.reserve(traced.size());
  for (const TracedRequest& r : traced) got.emplace_back(r.got_s, r.step_begin_s);
  std::sort(got.begin(), got.end());
  const auto first_at = [&](double t) {
    return std::lower_bound(got.begin(), got.end(),
                            std::pair{t, -std::numeric_limits<double>::infinity()});
  };
  constexpr double kSameStepS = 1e-6;  // as PrefillLoopGap: one step read from two events
  const auto profiled_s = [&](const CountedStep& c) {
    return model.PrefillMs(c.tokens, c.sq) * 1e-3;
  };
  std::vector<CountedStep> counted;
  double first_start = std::numeric_limits<double>::infinity(), last_end = -first_start;
  PrefillArrivalWork out;
  for (const StepRecord& s : steps) {
    if (s.prefill_tokens <= 0) continue;
    const double t = static_cast<double>(s.prefill_tokens);
    CountedStep c{s.duration_s, s.prefill_tokens, t * t / std::max(1, s.prefill_chunks), 0,
                  s.corun};
    const double model_s = profiled_s(c);
    if (!(model_s > 0) || !std::isfinite(model_s) || !(s.duration_s >= 0) ||
        !std::isfinite(s.duration_s)) {
      continue;
    }
    const double end = s.start_s + s.duration_s;
    for (auto it = first_at(s.start_s); it != got.end() && it->first < end; ++it) {
      c.arrivals += it->second > s.start_s + kSameStepS;
    }
    out.free_steps += c.arrivals == 0;
    counted.push_back(c);
    first_start = std::min(first_start, s.start_s);
    last_end = std::max(last_end, end);
  }
  // Requests that came at random at the run's rate leave a step free with exp(-rate x its time).
  const double rate = last_end > first_start
                          ? static_cast<double>(first_at(last_end) - first_at(first_start)) /
                                (last_end - first_start)
                          : 0.0;
  for (CountedStep& c : counted) c.free_by_chance = std::exp(-rate * c.real_s);
  const HeldExcess profiled = HeldAndChance(counted, rate, profiled_s);
  out.held_steps = profiled.held_steps;
  out.arrivals = profiled.arrivals;
  if (out.held_steps < min_steps || out.free_steps < min_steps) {
    return FailedPrecondition("prefill arrival work: " + std::to_string(out.held_steps) +
                              " steps a request came during and " + std::to_string(out.free_steps) +
                              " free ones traced, need " + std::to_string(min_steps) + " of each");
  }
  out.held_s = profiled.held_s;
  out.chance_s = profiled.chance_s;
  out.work_s = std::max(0.0, out.held_s - out.chance_s);
  // The same against this run's own fit of its free steps (kOwnFit).
  std::vector<PrefillSample> free;
  for (const CountedStep& c : counted) {
    if (c.arrivals == 0) free.push_back({c.tokens, c.sq, c.real_s * 1e3});
  }
  auto fit = FitPrefill(free, {.relative = false, .non_negative = true});
  if (fit.ok()) {
    StepCoeffs own = model;
    own.prefill = *fit;
    const auto fitted_s = [&](const CountedStep& c) {
      return own.PrefillMs(c.tokens, c.sq) * 1e-3;
    };
    bool positive = true;
    for (const CountedStep& c : counted) positive = positive && fitted_s(c) > 0;
    if (positive) {
      const HeldExcess own_fit = HeldAndChance(counted, rate, fitted_s);
      out.fit_held_s = own_fit.held_s;
      out.fit_chance_s = own_fit.chance_s;
    }
  }
  return out;
}

Result<double> PrefillLoopGap(std::span<const StepRecord> steps,
                              std::span<const TracedRequest> traced, double max_gap_s,
                              int64_t min_gaps) {
  // The earliest arrival among each step's requests, by the step's start.
  std::map<double, double> first_arrival;
  for (const TracedRequest& r : traced) {
    auto [it, added] = first_arrival.emplace(r.step_begin_s, r.arrived_s());
    if (!added) it->second = std::min(it->second, r.arrived_s());
  }
  // A step's start as read from its "step" event and from the request's trace may differ in the
  // last bits; the nearest within this is the same step.
  constexpr double kSameStepS = 1e-6;
  const auto arrival_of = [&](double start) -> std::optional<double> {
    auto it = first_arrival.lower_bound(start - kSameStepS);
    if (it == first_arrival.end() || it->first > start + kSameStepS) return std::nullopt;
    return it->second;
  };
  double sum = 0;
  int64_t n = 0;
  const StepRecord* last = nullptr;
  for (const StepRecord& s : steps) {
    if (s.prefill_tokens <= 0) continue;
    if (last != nullptr) {
      const double end = last->start_s + last->duration_s;
      const double gap = s.start_s - end;
      const std::optional<double> arrived = arrival_of(s.start_s);
      if (arrived && *arrived < end && gap >= 0 && gap <= max_gap_s) {
        sum += gap;
        ++n;
      }
    }
    last = &s;
  }
  if (n < min_gaps) {
    return FailedPrecondition("prefill loop gap: " + std::to_string(n) +
                              " back-to-back prefill steps traced, need " +
                              std::to_string(min_gaps));
  }
  return sum / static_cast<double>(n);
}

namespace {

double Mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// The median over the runs that gave `get`, and how many did.
template <typename Get>
Result<std::optional<double>> MedianOf(std::span<const CalibrationRunFactors> runs, Get get,
                                       int* count) {
  std::vector<double> v;
  for (const CalibrationRunFactors& r : runs) {
    if (const std::optional<double> x = std::invoke(get, r)) v.push_back(*x);
  }
  *count = static_cast<int>(v.size());
  if (v.empty()) return std::optional<double>();
  ASSIGN_OR_RETURN(const size_t k, UpperMedianIndex(v));
  return std::optional<double>(v[k]);
}

// The run taken whole for a figure whose parts belong together: among the runs `key` gives a
// value for, the one at that value's upper median; none when no run gives one. `count`: how many
// gave one. InvalidArgument naming `what` when a value is not finite.
template <typename Key>
Result<std::optional<size_t>> MedianRun(std::span<const CalibrationRunFactors> runs, Key key,
                                        const char* what, int* count) {
  std::vector<double> value;
  std::vector<size_t> run;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (const std::optional<double> v = key(runs[i])) {
      value.push_back(*v);
      run.push_back(i);
    }
  }
  *count = static_cast<int>(value.size());
  if (value.empty()) return std::optional<size_t>();
  auto k = UpperMedianIndex(value);
  if (!k.ok()) return InvalidArgument(std::string("CombineCalibrationRuns: ") + what);
  return std::optional<size_t>(run[*k]);
}

// RateCalibration's pooled split, when the runs give one: every run's rows that kept them
// merged, split at their common per-step part, scaled so that its unsplit stretch is the taken
// run's (`level`).
Status PoolDecodeSplit(std::span<const CalibrationRunFactors> runs, double level,
                       RateCalibration* out) {
  std::vector<BatchStepStats> real, sim;
  double fixed_s = 0.0;
  int n = 0;
  for (const CalibrationRunFactors& r : runs) {
    if (r.decode_real_rows.empty() || r.decode_sim_rows.empty() || !(r.decode_fixed_s > 0)) {
      continue;
    }
    if (n > 0 && r.decode_fixed_s != fixed_s) return OkStatus();  // split at other parts
    fixed_s = r.decode_fixed_s;
    ASSIGN_OR_RETURN(real, MergeDecodeStepStats(real, r.decode_real_rows));
    ASSIGN_OR_RETURN(sim, MergeDecodeStepStats(sim, r.decode_sim_rows));
    ++n;
  }
  if (n < 2) return OkStatus();
  auto pooled = DecodeFactorsUnderLoad(real, sim, 1, fixed_s);
  if (!pooled.ok() || !pooled->split || !(pooled->stretch > 0)) return OkStatus();
  const double scale = level / pooled->stretch;
  out->pooled_decode_stretch = pooled->step_stretch * scale;
  out->pooled_decode_seq_stretch = pooled->seq_stretch * scale;
  out->pooled_split_runs = n;
  out->pooled_split_level = level;
  out->pooled_decode_batch_factors = DecodeBatchFactors(real, sim, fixed_s, pooled->step_stretch,
                                                        pooled->seq_stretch, kMinSplitRowSteps);
  return OkStatus();
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
    for (const std::optional<double>& k :
         {r.decode_stretch, r.decode_seq_stretch, r.decode_alone_stretch}) {
      if (k && !std::isfinite(*k)) {
        return InvalidArgument("CombineCalibrationRuns: a decode stretch is not finite");
      }
    }
    if (r.prefill_loop_gap_s &&
        !(std::isfinite(*r.prefill_loop_gap_s) && *r.prefill_loop_gap_s >= 0)) {
      return InvalidArgument("CombineCalibrationRuns: a prefill loop gap is not finite and >= 0");
    }
    for (const std::optional<double>& w : r.prefill_arrival_work_s) {
      if (w && !(std::isfinite(*w) && *w >= 0)) {
        return InvalidArgument(
            "CombineCalibrationRuns: a prefill arrival work is not finite and >= 0");
      }
    }
  }
  return OkStatus();
}

}  // namespace

std::vector<double> RunDecodeBatchFactors(const CalibrationRunFactors& run) {
  if (run.decode_real_rows.empty() || run.decode_sim_rows.empty() || !run.decode_stretch ||
      !run.decode_seq_stretch) {
    return {};
  }
  return DecodeBatchFactors(run.decode_real_rows, run.decode_sim_rows, run.decode_fixed_s,
                            *run.decode_stretch, *run.decode_seq_stretch, kMinSplitRowSteps);
}

Result<RateCalibration> CombineCalibrationRuns(std::span<const CalibrationRunFactors> runs,
                                               double output_tokens) {
  RETURN_IF_ERROR(CheckRuns(runs, output_tokens));
  RateCalibration out;
  out.rate = runs[0].rate;
  out.runs = static_cast<int>(runs.size());
  ASSIGN_OR_RETURN(out.prefill_stretch,
                   MedianOf(runs, &CalibrationRunFactors::prefill_stretch, &out.prefill_runs));
  ASSIGN_OR_RETURN(out.prefill_loop_gap_s,
                   MedianOf(runs, &CalibrationRunFactors::prefill_loop_gap_s, &out.loop_gap_runs));
  for (size_t m = 0; m < kArrivalMeasures; ++m) {
    ASSIGN_OR_RETURN(
        out.prefill_arrival_work_s[m],
        MedianOf(
            runs, [&](const CalibrationRunFactors& r) { return r.prefill_arrival_work_s[m]; },
            &out.arrival_work_runs[m]));
    ASSIGN_OR_RETURN(
        out.prefill_stretch_left_out[m],
        MedianOf(
            runs, [&](const CalibrationRunFactors& r) { return r.prefill_stretch_left_out[m]; },
            &out.left_out_runs[m]));
  }
  // The runs' keys for the figures taken whole from one run.
  const auto client_key = [&](const CalibrationRunFactors& r) -> std::optional<double> {
    if (!r.client_cpu) return std::nullopt;
    return r.client_cpu->Seconds(output_tokens);
  };
  const auto outside_key = [](const CalibrationRunFactors& r) -> std::optional<double> {
    if (r.outside_s.empty()) return std::nullopt;
    return Mean(r.outside_s);
  };
  ASSIGN_OR_RETURN(out.decode_run, MedianRun(runs, DecodeLevel, "a decode stretch is not finite",
                                             &out.stretch_runs));
  if (out.decode_run) {
    const CalibrationRunFactors& r = runs[*out.decode_run];
    out.decode_stretch = r.decode_stretch;
    out.decode_seq_stretch = r.decode_seq_stretch.value_or(*r.decode_stretch);
    RETURN_IF_ERROR(PoolDecodeSplit(runs, *DecodeLevel(r), &out));
  }
  ASSIGN_OR_RETURN(out.decode_corun,
                   MedianOf(runs, &CalibrationRunFactors::decode_corun, &out.corun_runs));
  ASSIGN_OR_RETURN(out.client_run, MedianRun(runs, client_key, "a client CPU cost is not finite",
                                             &out.client_runs));
  if (out.client_run) out.client_cpu = runs[*out.client_run].client_cpu;
  ASSIGN_OR_RETURN(out.outside_run, MedianRun(runs, outside_key, "an outside sample is not finite",
                                              &out.outside_runs));
  if (out.outside_run) {
    out.outside_s = runs[*out.outside_run].outside_s;
    out.inbound_s = runs[*out.outside_run].inbound_s;
    out.tail_s = runs[*out.outside_run].tail_s;
  }
  std::vector<StepRecord> real, sim;
  for (const CalibrationRunFactors& r : runs) {
    real.insert(real.end(), r.prefill_real_steps.begin(), r.prefill_real_steps.end());
    sim.insert(sim.end(), r.prefill_sim_steps.begin(), r.prefill_sim_steps.end());
  }
  out.prefill_chunk_factors = PrefillChunkFactors(real, sim, kMinSplitRowSteps);
  for (const CalibrationRunFactors& r : runs) {
    for (auto [from, to, count] :
         {std::tuple{&r.decode_step_factors, &out.decode_step_factors, &out.step_factor_runs},
          std::tuple{&r.prefill_step_factors, &out.prefill_step_factors,
                     &out.prefill_factor_runs}}) {
      for (double k : *from) {
        if (!std::isfinite(k)) {
          return InvalidArgument("CombineCalibrationRuns: a step factor is not finite");
        }
      }
      to->insert(to->end(), from->begin(), from->end());
      *count += !from->empty();
    }
  }
  return out;
}

std::optional<double> DecodeLevel(const CalibrationRunFactors& run) {
  if (!run.decode_stretch) return std::nullopt;
  return run.decode_alone_stretch.value_or(*run.decode_stretch);
}

Result<std::optional<DecodeSplit>> PooledSplitAtLevel(const RateCalibration& rc, double level) {
  if (!std::isfinite(level) || level <= 0) {
    return InvalidArgument("PooledSplitAtLevel: the level must be positive and finite");
  }
  if (!rc.pooled_decode_stretch || !rc.pooled_decode_seq_stretch || !(rc.pooled_split_level > 0)) {
    return std::optional<DecodeSplit>();
  }
  const double scale = level / rc.pooled_split_level;
  return std::optional<DecodeSplit>(
      DecodeSplit{*rc.pooled_decode_stretch * scale, *rc.pooled_decode_seq_stretch * scale});
}

std::optional<double> BracketedDecodeLevel(const CalibrationRunFactors& before,
                                           const CalibrationRunFactors* after) {
  const std::optional<double> first = DecodeLevel(before);
  if (!first) return std::nullopt;
  const std::optional<double> second = after ? DecodeLevel(*after) : std::nullopt;
  return second ? (*first + *second) / 2 : *first;
}

}  // namespace pd::planner
