#include "planner/step_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace pd::planner {

Result<std::vector<StepRecord>> EngineStepsFromTrace(const std::string& json_text, double begin_s,
                                                     double end_s) {
  std::vector<StepRecord> out;
  try {
    const nlohmann::json doc = nlohmann::json::parse(json_text);
    if (!doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
      return InvalidArgument("trace: no 'traceEvents' array");
    }
    for (const auto& e : doc["traceEvents"]) {
      if (e.value("name", "") != "step" || e.value("cat", "") != "engine" ||
          e.value("ph", "") != "X") {
        continue;
      }
      const auto& args = e.contains("args") ? e["args"] : nlohmann::json::object();
      if (!e.contains("ts") || !e.contains("dur") || !args.contains("decodes") ||
          !args.contains("prefill_tokens")) {
        return InvalidArgument("trace: a step event lacks ts, dur, decodes or prefill_tokens");
      }
      StepRecord r;
      r.start_s = e["ts"].get<double>() * 1e-6;  // the file's unit: microseconds
      r.duration_s = e["dur"].get<double>() * 1e-6;
      r.decode_seqs = args["decodes"].get<int>();
      r.prefill_tokens = args["prefill_tokens"].get<int64_t>();
      r.prefill_chunks = args.value("prefill_chunks", r.prefill_tokens > 0 ? 1 : 0);
      if (r.start_s >= begin_s && r.start_s <= end_s) out.push_back(r);
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("trace: ") + e.what());
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const StepRecord& a, const StepRecord& b) { return a.start_s < b.start_s; });
  return out;
}

void MarkCorun(std::span<StepRecord> steps, std::span<const StepRecord> other) {
  // Both in start order; `j` is the first step of `other` that may still be running.
  size_t j = 0;
  for (StepRecord& s : steps) {
    while (j < other.size() && other[j].start_s + other[j].duration_s <= s.start_s) ++j;
    s.corun = false;
    // Steps of one instance do not overlap, so only other[j] and the few after it that started
    // before s can be running at s's start.
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
    if (s.instance != instance) continue;
    out.push_back(
        {s.start_s, s.duration_s, s.decode_seqs, s.prefill_tokens, s.corun, s.prefill_chunks});
  }
  return out;
}

std::vector<BatchStepStats> SummarizeDecodeSteps(std::span<const StepRecord> steps, int max_batch,
                                                 double max_gap_s) {
  max_batch = std::max(1, max_batch);
  std::vector<BatchStepStats> rows(max_batch);
  struct Sums {
    double all = 0, alone = 0, corun = 0, gap = 0;
  };
  std::vector<Sums> sums(max_batch);
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepRecord& s = steps[i];
    if (s.prefill_tokens > 0 || s.decode_seqs < 1) continue;
    const int row = std::min(s.decode_seqs, max_batch) - 1;
    BatchStepStats& r = rows[row];
    ++r.count;
    sums[row].all += s.duration_s;
    if (s.corun) {
      ++r.corun_count;
      sums[row].corun += s.duration_s;
    } else {
      sums[row].alone += s.duration_s;
    }
    if (i + 1 < steps.size()) {
      const double gap = steps[i + 1].start_s - (s.start_s + s.duration_s);
      if (gap >= 0 && gap <= max_gap_s) {
        ++r.gap_count;
        sums[row].gap += gap;
      }
    }
  }
  for (int b = 0; b < max_batch; ++b) {
    BatchStepStats& r = rows[b];
    r.batch = b + 1;
    const int64_t alone = r.count - r.corun_count;
    if (r.count > 0) r.mean_s = sums[b].all / r.count;
    if (alone > 0) r.mean_alone_s = sums[b].alone / alone;
    if (r.corun_count > 0) r.mean_corun_s = sums[b].corun / r.corun_count;
    if (r.gap_count > 0) r.mean_gap_s = sums[b].gap / r.gap_count;
  }
  return rows;
}

Result<std::vector<BatchStepStats>> MergeDecodeStepStats(std::span<const BatchStepStats> a,
                                                         std::span<const BatchStepStats> b) {
  std::vector<BatchStepStats> out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    BatchStepStats& o = out[i];
    o.batch = static_cast<int>(i) + 1;
    double all = 0, alone = 0, corun = 0, gap = 0;
    for (std::span<const BatchStepStats> t : {a, b}) {
      if (i >= t.size()) continue;
      const BatchStepStats& r = t[i];
      if (r.batch != o.batch) {
        return InvalidArgument("MergeDecodeStepStats: row " + std::to_string(i) + " is of batch " +
                               std::to_string(r.batch) + ", not " + std::to_string(o.batch));
      }
      o.count += r.count;
      o.corun_count += r.corun_count;
      o.gap_count += r.gap_count;
      all += r.count * r.mean_s;
      alone += (r.count - r.corun_count) * r.mean_alone_s;
      corun += r.corun_count * r.mean_corun_s;
      gap += r.gap_count * r.mean_gap_s;
    }
    const int64_t n_alone = o.count - o.corun_count;
    if (o.count > 0) o.mean_s = all / o.count;
    if (n_alone > 0) o.mean_alone_s = alone / n_alone;
    if (o.corun_count > 0) o.mean_corun_s = corun / o.corun_count;
    if (o.gap_count > 0) o.mean_gap_s = gap / o.gap_count;
  }
  return out;
}

std::vector<double> DecodeStepFactors(std::span<const StepRecord> steps,
                                      std::span<const double> kv_ready_s, double max_gap_s) {
  std::vector<double> ready(kv_ready_s.begin(), kv_ready_s.end());
  std::sort(ready.begin(), ready.end());
  struct Counted {
    size_t step;
    double gap;
  };
  std::vector<Counted> counted;
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    const StepRecord& s = steps[i];
    const StepRecord& next = steps[i + 1];
    if (s.prefill_tokens > 0 || s.decode_seqs < 1 || next.decode_seqs < 1) continue;
    const double end = s.start_s + s.duration_s;
    const double gap = next.start_s - end;
    if (gap < 0) continue;
    const auto r = std::lower_bound(ready.begin(), ready.end(), end);
    if (r != ready.end() && *r <= next.start_s) continue;
    counted.push_back({i, gap});
  }
  // Per class (batch size, co-run mark): step time, steps, short-gap time, short gaps.
  struct Sums {
    double step = 0, gap = 0;
    int64_t steps = 0, gaps = 0;
  };
  std::map<std::pair<int, bool>, Sums> sums;
  auto class_of = [&](const Counted& c) {
    return std::make_pair(steps[c.step].decode_seqs, steps[c.step].corun);
  };
  for (const Counted& c : counted) {
    Sums& m = sums[class_of(c)];
    m.step += steps[c.step].duration_s;
    ++m.steps;
    if (c.gap <= max_gap_s) {
      m.gap += c.gap;
      ++m.gaps;
    }
  }
  std::vector<double> out;
  out.reserve(counted.size());
  for (const Counted& c : counted) {
    const Sums& m = sums[class_of(c)];
    const double mean = m.step / m.steps + (m.gaps > 0 ? m.gap / m.gaps : 0.0);
    const double k = mean > 0 ? (steps[c.step].duration_s + c.gap) / mean : 0.0;
    if (k > 0 && std::isfinite(k)) out.push_back(k);  // the simulator takes positive factors
  }
  return out;
}

std::vector<double> PrefillStepFactors(std::span<const StepRecord> steps, const StepCoeffs& model) {
  std::vector<double> ratio;
  std::vector<bool> corun;
  double sum[2] = {0, 0};
  int64_t n[2] = {0, 0};
  for (const StepRecord& s : steps) {
    if (s.prefill_tokens <= 0) continue;
    const double t = static_cast<double>(s.prefill_tokens);
    const double ms = model.PrefillMs(s.prefill_tokens, t * t / std::max(1, s.prefill_chunks));
    const double r = s.duration_s * 1e3 / ms;
    if (!(ms > 0) || !(r > 0) || !std::isfinite(r)) continue;
    ratio.push_back(r);
    corun.push_back(s.corun);
    sum[s.corun] += r;
    ++n[s.corun];
  }
  std::vector<double> out;
  out.reserve(ratio.size());
  for (size_t i = 0; i < ratio.size(); ++i) out.push_back(ratio[i] / (sum[corun[i]] / n[corun[i]]));
  return out;
}

std::vector<double> PrefillChunkFactors(std::span<const StepRecord> real,
                                        std::span<const StepRecord> sim, int64_t min_steps) {
  struct Sums {
    double time = 0;
    int64_t steps = 0;
  };
  // Per count, and the time of every step that computed prompt tokens (in step order).
  const auto by_chunks = [](std::span<const StepRecord> steps, double* total_time) {
    std::vector<Sums> rows;
    for (const StepRecord& s : steps) {
      if (s.prefill_tokens <= 0) continue;
      const size_t c = static_cast<size_t>(std::max(1, s.prefill_chunks));
      if (rows.size() < c) rows.resize(c);
      rows[c - 1].time += s.duration_s;
      ++rows[c - 1].steps;
      *total_time += s.duration_s;
    }
    return rows;
  };
  double real_time = 0, sim_time = 0;
  const std::vector<Sums> r = by_chunks(real, &real_time);
  const std::vector<Sums> m = by_chunks(sim, &sim_time);
  if (!(real_time > 0) || !(sim_time > 0)) return {};
  const double busy = real_time / sim_time;
  std::vector<double> out;
  size_t last = 0;  // the count after the largest one that has its own factor
  for (size_t c = 0; c < r.size(); ++c) {
    const bool own = r[c].steps >= std::max<int64_t>(1, min_steps) && c < m.size() &&
                     m[c].steps > 0 && m[c].time > 0;
    if (!own) {
      if (c == 0) return {};
      out.push_back(out.back());
      continue;
    }
    const double mean_real = r[c].time / static_cast<double>(r[c].steps);
    const double mean_sim = m[c].time / static_cast<double>(m[c].steps);
    out.push_back(mean_real / mean_sim / busy);
    last = c + 1;
  }
  // One count alone gives a level, not a shape: the stretch holds the level.
  if (last < 2) return {};
  out.resize(last);
  return out;
}

namespace {

// DecodeFactorsUnderLoad's split: step and sequence factors by weighted least squares over the
// batch sizes with enough real alone steps; false when it cannot be fitted or is out of range.
bool SplitStretch(std::span<const BatchStepStats> real, std::span<const BatchStepStats> sim,
                  double fixed_s, DecodeLoadFactors* out) {
  if (!(fixed_s > 0)) return false;
  // Normal equations of min sum n (y - a*F - c*V)^2.
  double ff = 0, fv = 0, vv = 0, fy = 0, vy = 0;
  int rows = 0;
  for (size_t i = 0; i < real.size() && i < sim.size(); ++i) {
    const int64_t n = real[i].count - real[i].corun_count;
    if (n < kMinSplitRowSteps || sim[i].count - sim[i].corun_count <= 0) continue;
    const double y = real[i].mean_alone_s + real[i].mean_gap_s;
    const double v = sim[i].mean_alone_s - fixed_s;
    if (!(v > 0)) continue;
    ff += n * fixed_s * fixed_s;
    fv += n * fixed_s * v;
    vv += n * v * v;
    fy += n * fixed_s * y;
    vy += n * v * y;
    ++rows;
  }
  const double det = ff * vv - fv * fv;
  if (rows < 2 || !(det > 1e-9 * ff * vv)) return false;
  const double a = (fy * vv - vy * fv) / det;
  const double c = (vy * ff - fy * fv) / det;
  if (!(a >= 0.5 && a <= 2.0 && c >= 0.5 && c <= 2.0)) return false;
  out->step_stretch = a;
  out->seq_stretch = c;
  return true;
}

}  // namespace

Result<DecodeLoadFactors> DecodeFactorsUnderLoad(std::span<const BatchStepStats> real,
                                                 std::span<const BatchStepStats> sim,
                                                 int64_t min_steps, double sim_step_fixed_s) {
  DecodeLoadFactors out;
  double real_alone = 0, sim_alone = 0, real_corun = 0, corun_as_alone = 0;
  for (size_t i = 0; i < real.size(); ++i) {
    const BatchStepStats& r = real[i];
    const int64_t alone = r.count - r.corun_count;
    if (alone <= 0) continue;
    const double loop = r.mean_gap_s;  // the engine loop after a step, both kinds alike
    if (i < sim.size() && sim[i].count - sim[i].corun_count > 0) {
      out.alone_steps += alone;
      real_alone += alone * (r.mean_alone_s + loop);
      sim_alone += alone * sim[i].mean_alone_s;
    }
    if (r.corun_count > 0) {
      out.corun_steps += r.corun_count;
      real_corun += r.corun_count * (r.mean_corun_s + loop);
      corun_as_alone += r.corun_count * (r.mean_alone_s + loop);
    }
  }
  if (out.alone_steps < std::max<int64_t>(1, min_steps) || !(sim_alone > 0)) {
    return FailedPrecondition("decode steps under load: " + std::to_string(out.alone_steps) +
                              " real steps ran alone with a simulated counterpart, fewer than " +
                              std::to_string(min_steps));
  }
  out.stretch = real_alone / sim_alone;
  if (corun_as_alone > 0) out.corun = real_corun / corun_as_alone;
  out.step_stretch = out.seq_stretch = out.stretch;
  out.split = SplitStretch(real, sim, sim_step_fixed_s, &out);
  return out;
}

std::vector<double> DecodeBatchFactors(std::span<const BatchStepStats> real,
                                       std::span<const BatchStepStats> sim, double fixed_s,
                                       double step_stretch, double seq_stretch,
                                       int64_t min_row_steps) {
  std::vector<double> out;
  if (!(fixed_s >= 0 && std::isfinite(fixed_s) && step_stretch > 0 && std::isfinite(step_stretch) &&
        seq_stretch > 0 && std::isfinite(seq_stretch))) {
    return out;
  }
  size_t last = 0;  // one past the largest batch size with a factor of its own
  out.assign(std::min(real.size(), sim.size()), 0.0);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t n = real[i].count - real[i].corun_count;
    if (n < std::max<int64_t>(1, min_row_steps) || sim[i].count - sim[i].corun_count <= 0) continue;
    const double predicted = step_stretch * fixed_s + seq_stretch * (sim[i].mean_alone_s - fixed_s);
    const double k = (real[i].mean_alone_s + real[i].mean_gap_s) / predicted;
    if (!(predicted > 0) || !(k > 0) || !std::isfinite(k)) continue;
    out[i] = k;
    last = i + 1;
  }
  out.resize(last);
  if (out.empty() || out[0] == 0.0) return {};
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i] == 0.0) out[i] = out[i - 1];
  }
  return out;
}

std::string FormatStepComparison(std::span<const BatchStepStats> real,
                                 std::span<const BatchStepStats> sim) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "%6s | %7s %6s %7s %7s %7s %6s | %7s %6s %7s %7s %7s  (ms)\n",
                "batch", "real n", "corun", "mean", "alone", "corun", "gap", "sim n", "corun",
                "mean", "alone", "corun");
  out += line;
  const size_t n = std::max(real.size(), sim.size());
  for (size_t i = 0; i < n; ++i) {
    const BatchStepStats r = i < real.size() ? real[i] : BatchStepStats{};
    const BatchStepStats s = i < sim.size() ? sim[i] : BatchStepStats{};
    if (r.count == 0 && s.count == 0) continue;
    auto share = [](const BatchStepStats& x) {
      return x.count > 0 ? 100.0 * x.corun_count / x.count : 0.0;
    };
    const bool last = i + 1 == n;
    char batch[32];
    std::snprintf(batch, sizeof(batch), "%zu%s", i + 1, last ? "+" : "");
    std::snprintf(line, sizeof(line),
                  "%6s | %7lld %5.0f%% %7.3f %7.3f %7.3f %6.3f | %7lld %5.0f%% %7.3f %7.3f %7.3f\n",
                  batch, static_cast<long long>(r.count), share(r), r.mean_s * 1e3,
                  r.mean_alone_s * 1e3, r.mean_corun_s * 1e3, r.mean_gap_s * 1e3,
                  static_cast<long long>(s.count), share(s), s.mean_s * 1e3, s.mean_alone_s * 1e3,
                  s.mean_corun_s * 1e3);
    out += line;
  }
  return out;
}

}  // namespace pd::planner
