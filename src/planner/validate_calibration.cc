#include "planner/validate_calibration.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#ifdef PD_PLANNER_HAS_ENGINE_SCHEDULER
#include "planner/engine_scheduler.h"
#endif

namespace pd::planner {
namespace {

// What one calibration run must hold for each figure (a run has 100-200 requests).
constexpr int64_t kMinDecodeSteps = 150;  // alone decode steps, and step factors
constexpr int64_t kMinCorunSteps = 60;
constexpr int64_t kMinPrefillSteps = 50;
constexpr int64_t kMinLoopGaps = 20;
constexpr size_t kMinKvReadyRequests = 30;
constexpr double kMinJoinedShare = 0.5;  // of the client's requests, for the outside sample
constexpr int kBatchRows = 64;

}  // namespace

std::vector<InstanceConfig> CalibratedInstances(const StepCoeffs& model, const Calibration& cal,
                                                const SchedPolicy& policy) {
  const RealOverheads& o = cal.overheads;
  InstanceConfig p;
  p.role = Role::kPrefill;
  p.coeffs = model;
  for (double& k : p.coeffs.prefill) k *= o.prefill_scale * cal.prefill_stretch;
  for (auto* form : {&p.coeffs.decode_small, &p.coeffs.decode_large}) {
    for (double& k : *form) k *= cal.prefill_stretch;
  }
  p.policy = policy;
  p.corun_slowdown = o.corun_prefill;
  p.kv_ready_fraction = o.kv_ready_fraction;
  p.calibration = cal.prefill;
  InstanceConfig d = p;
  d.role = Role::kDecode;
  d.coeffs = model;
  d.corun_slowdown = o.corun_decode;
  d.calibration = cal.decode;
  // Scheduling once per step; sampling, detokenising and streaming once per sequence.
  for (auto* form : {&d.coeffs.decode_small, &d.coeffs.decode_large}) {
    (*form)[0] = ((*form)[0] + o.decode_fixed_ms) * cal.decode_step_stretch;
    (*form)[1] *= cal.decode_seq_stretch;
    (*form)[2] = ((*form)[2] + o.decode_seq_ms) * cal.decode_seq_stretch;
  }
  return {p, d};
}

ClusterLinks CalibratedLinks(double kv_bytes_per_token, const RealOverheads& o) {
  ClusterLinks links;
  links.kv_bytes_per_token = kv_bytes_per_token;
  links.intra_node_bw =
      o.transfer_s_per_token > 0 ? kv_bytes_per_token / o.transfer_s_per_token : 1e18;
  return links;
}

Result<SimResult> SimulateCalibrated(std::span<const InstanceConfig> insts,
                                     const ClusterLinks& links, std::span<const SimRequest> sent,
                                     const OutsideLatency& outside, bool record_steps) {
  std::vector<SimRequest> reqs(sent.begin(), sent.end());
  for (SimRequest& r : reqs) r.arrival_s += outside.InboundFor(r.id);
  SimOptions so;
  so.first_token_on_decode = true;
  so.record_steps = record_steps;
#ifdef PD_PLANNER_HAS_ENGINE_SCHEDULER
  so.make_scheduler = EngineSchedulerFactory();
#endif
  ASSIGN_OR_RETURN(SimResult sim, Simulate(insts, links, reqs, so));
  for (RequestResult& r : sim.requests) {
    const double outside_s = outside.For(r.id);
    if (r.first_token_s >= 0) r.first_token_s += outside_s;
    if (r.finish_s >= 0) {
      r.finish_s += outside_s;
      if (r.output_len > 1)
        r.finish_s = std::max(r.first_token_s, r.finish_s + outside.TailFor(r.id));
    }
  }
  return sim;
}

namespace {

// Decode-only steps per number of decoding sequences (row b-1; larger batches in the last row):
// counts and mean times alone and co-run, and the mean loop gap after them.
struct BatchStepStats {
  int64_t count = 0, corun_count = 0, gap_count = 0;
  double mean_alone_s = 0.0, mean_corun_s = 0.0, mean_gap_s = 0.0;
};
std::vector<BatchStepStats> SummarizeDecodeSteps(std::span<const StepRecord> steps, int max_batch) {
  std::vector<BatchStepStats> rows(std::max(1, max_batch));
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepRecord& s = steps[i];
    if (s.prefill_tokens > 0 || s.decode_seqs < 1) continue;
    BatchStepStats& r = rows[std::min<size_t>(s.decode_seqs, rows.size()) - 1];
    ++r.count;  // the means hold sums until the end
    (s.corun ? r.mean_corun_s : r.mean_alone_s) += s.duration_s;
    r.corun_count += s.corun;
    if (i + 1 < steps.size()) {
      const double gap = steps[i + 1].start_s - (s.start_s + s.duration_s);
      if (gap >= 0 && gap <= kMaxLoopGapS) {
        ++r.gap_count;
        r.mean_gap_s += gap;
      }
    }
  }
  for (BatchStepStats& r : rows) {
    const int64_t alone = r.count - r.corun_count;
    r.mean_alone_s = alone > 0 ? r.mean_alone_s / alone : 0.0;
    r.mean_corun_s = r.corun_count > 0 ? r.mean_corun_s / r.corun_count : 0.0;
    r.mean_gap_s = r.gap_count > 0 ? r.mean_gap_s / r.gap_count : 0.0;
  }
  return rows;
}

// The least-squares split of min sum n (y - a F - c V)^2 over the rows with enough real alone
// steps; false when it cannot be fitted or a factor is outside [0.5, 2].
bool SplitStretch(std::span<const BatchStepStats> real, std::span<const BatchStepStats> sim,
                  double fixed_s, DecodeLoadFactors* out) {
  if (!(fixed_s > 0)) return false;
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

Result<DecodeLoadFactors> DecodeFactorsUnderLoad(std::span<const StepRecord> real_steps,
                                                 std::span<const StepRecord> sim_steps,
                                                 int64_t min_steps, double sim_fixed_s) {
  const auto real = SummarizeDecodeSteps(real_steps, kBatchRows);
  const auto sim = SummarizeDecodeSteps(sim_steps, kBatchRows);
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
                              " alone steps with a simulated counterpart, need " +
                              std::to_string(min_steps));
  }
  out.stretch = out.step_stretch = out.seq_stretch = real_alone / sim_alone;
  if (corun_as_alone > 0) out.corun = real_corun / corun_as_alone;
  SplitStretch(real, sim, sim_fixed_s, &out);
  return out;
}

std::vector<double> DecodeStepFactors(std::span<const StepRecord> steps,
                                      std::span<const double> kv_ready_s) {
  std::vector<double> ready(kv_ready_s.begin(), kv_ready_s.end());
  std::sort(ready.begin(), ready.end());
  std::vector<std::pair<size_t, double>> counted;  // step, the gap after it
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    const StepRecord& s = steps[i];
    if (s.prefill_tokens > 0 || s.decode_seqs < 1 || steps[i + 1].decode_seqs < 1) continue;
    const double end = s.start_s + s.duration_s;
    const double gap = steps[i + 1].start_s - end;
    const auto r = std::lower_bound(ready.begin(), ready.end(), end);
    if (gap < 0 || (r != ready.end() && *r <= steps[i + 1].start_s)) continue;
    counted.emplace_back(i, gap);
  }
  struct Sums {
    double step = 0, gap = 0;
    int64_t steps = 0, gaps = 0;
  };
  std::map<std::pair<int, bool>, Sums> sums;  // by batch size and co-run mark
  for (const auto& [i, gap] : counted) {
    Sums& m = sums[{steps[i].decode_seqs, steps[i].corun}];
    m.step += steps[i].duration_s;
    ++m.steps;
    if (gap <= kMaxLoopGapS) {
      m.gap += gap;
      ++m.gaps;
    }
  }
  std::vector<double> out;
  for (const auto& [i, gap] : counted) {
    const Sums& m = sums[{steps[i].decode_seqs, steps[i].corun}];
    const double mean = m.step / m.steps + (m.gaps > 0 ? m.gap / m.gaps : 0.0);
    const double k = mean > 0 ? (steps[i].duration_s + gap) / mean : 0.0;
    if (k > 0 && std::isfinite(k)) out.push_back(k);
  }
  return out;
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
  if (!(sim_s > 0) || !std::isfinite(real_s)) {
    return FailedPrecondition("prefill busy stretch: no simulated prefill time");
  }
  return real_s / sim_s;
}

Result<double> PrefillLoopGap(std::span<const StepRecord> steps,
                              std::span<const TracedRequest> traced, int64_t min_gaps) {
  std::map<double, double> first_arrival;  // a step's start -> the earliest arrival it computed
  for (const TracedRequest& r : traced) {
    auto [it, added] = first_arrival.emplace(r.step_begin_s, r.arrived_s());
    if (!added) it->second = std::min(it->second, r.arrived_s());
  }
  constexpr double kSameStepS = 1e-6;  // a step's start as read from two events
  double sum = 0;
  int64_t n = 0;
  const StepRecord* last = nullptr;
  for (const StepRecord& s : steps) {
    if (s.prefill_tokens <= 0) continue;
    if (last != nullptr) {
      const double end = last->start_s + last->duration_s;
      const double gap = s.start_s - end;
      const auto it = first_arrival.lower_bound(s.start_s - kSameStepS);
      const bool waiting =
          it != first_arrival.end() && it->first <= s.start_s + kSameStepS && it->second < end;
      if (waiting && gap >= 0 && gap <= kMaxLoopGapS) {
        sum += gap;
        ++n;
      }
    }
    last = &s;
  }
  if (n < min_gaps) {
    return FailedPrecondition("prefill loop gap: " + std::to_string(n) +
                              " back-to-back prefill steps, need " + std::to_string(min_gaps));
  }
  return sum / static_cast<double>(n);
}

RunCalibration CalibrateRun(const TracedRun& run, const SimResult& unstretched,
                            double sim_fixed_s) {
  // A figure the run cannot give (too few steps or requests of its kind) stays unset.
  const auto if_ok = [](auto r) { return r.ok() ? std::optional(*r) : std::nullopt; };
  RunCalibration out;
  out.prefill_stretch = if_ok(
      PrefillBusyStretch(run.prefill_steps, StepsOfInstance(unstretched, 0), kMinPrefillSteps));
  out.decode = if_ok(DecodeFactorsUnderLoad(run.decode_steps, StepsOfInstance(unstretched, 1),
                                            kMinDecodeSteps, sim_fixed_s));
  out.prefill_loop_gap_s = if_ok(PrefillLoopGap(run.prefill_steps, run.requests, kMinLoopGaps));
  out.kv_ready_fraction = if_ok(KvReadyFraction(run.requests, kMinKvReadyRequests));
  std::vector<double> ready;
  for (const TracedRequest& r : run.requests) ready.push_back(r.kv_ready_s);
  out.decode_step_factors = DecodeStepFactors(run.decode_steps, ready);
  if (static_cast<int64_t>(out.decode_step_factors.size()) < kMinDecodeSteps) {
    out.decode_step_factors.clear();
  }
  if (!run.client.empty()) {
    auto j = JoinOutsideLatency(run.client, run.requests);
    if (j.ok() && j->outside_s.size() >= kMinJoinedShare * run.client.size()) out.outside = *j;
  }
  return out;
}

Calibration WithRun(const Calibration& probes, const RunCalibration& run, bool corun,
                    uint64_t seed) {
  Calibration cal = probes;
  if (run.prefill_stretch) cal.prefill_stretch = *run.prefill_stretch;
  if (run.decode) {
    cal.decode_step_stretch = run.decode->step_stretch;
    cal.decode_seq_stretch = run.decode->seq_stretch;
    if (corun && run.decode->corun_steps >= kMinCorunSteps) {
      cal.overheads.corun_decode = std::clamp(run.decode->corun, 1.0, 4.0);
    }
  }
  if (run.kv_ready_fraction) {
    cal.overheads.kv_ready_fraction = *run.kv_ready_fraction;
    cal.overheads.transfer_s_per_token = 0;
  }
  if (!run.decode_step_factors.empty()) {
    cal.decode =
        std::make_shared<const StepCalibration>(StepCalibration{run.decode_step_factors, 0.0});
  }
  if (run.prefill_loop_gap_s) {
    cal.prefill =
        std::make_shared<const StepCalibration>(StepCalibration{{}, *run.prefill_loop_gap_s});
  }
  if (!run.outside.outside_s.empty()) {
    if (auto o = OutsideLatency::Sampled(run.outside, seed); o.ok()) cal.outside = *o;
  }
  return cal;
}

}  // namespace pd::planner
