#include "planner/goodput.h"

#include <algorithm>
#include <cmath>

namespace pd::planner {
namespace {

// Failed bisection probes in a row, from the top, before the lowest probe is tried.
constexpr int kZeroCheckAfter = 4;

struct PhaseWork {
  double prefill_s = 0.0;  // seconds of prefill per request (one at a time)
  double decode_s = 0.0;   // seconds of decoding per request at a full batch
};

PhaseWork WorkPerRequest(const InstanceConfig& inst, std::span<const SimRequest> reqs) {
  PhaseWork w;
  if (reqs.empty()) return w;
  const int batch = std::max(1, std::min(inst.policy.max_num_seqs, 256));
  for (const auto& r : reqs) {
    StepShape p;
    p.prefill_tokens = r.prompt_len;
    p.prefill_sq = double(r.prompt_len) * r.prompt_len;
    w.prefill_s += PipelineTimes(inst.coeffs, p, inst.pp).stage_s;
    StepShape d;
    d.decode_seqs = batch;
    d.decode_context = int64_t(batch) * (r.prompt_len + r.output_len / 2);
    w.decode_s += PipelineTimes(inst.coeffs, d, inst.pp).stage_s * (r.output_len - 1) / batch;
  }
  w.prefill_s /= reqs.size();
  w.decode_s /= reqs.size();
  return w;
}

}  // namespace

int RequestsForRate(const GoodputOptions& options, double rate, size_t available) {
  if (options.min_requests <= 0 && options.min_duration_s <= 0) return static_cast<int>(available);
  const double want =
      std::max<double>(options.min_requests, std::ceil(rate * options.min_duration_s));
  return static_cast<int>(std::min<double>(want, static_cast<double>(available)));
}

double UpperBoundRate(std::span<const InstanceConfig> instances,
                      std::span<const SimRequest> unit_rate) {
  double prefill_rate = 0.0, decode_rate = 0.0, colocated_rate = 0.0;
  for (const auto& inst : instances) {
    const PhaseWork w = WorkPerRequest(inst, unit_rate);
    const double p = w.prefill_s > 0 ? 1.0 / w.prefill_s : 1e9;
    const double d = w.decode_s > 0 ? 1.0 / w.decode_s : 1e9;
    if (inst.role == Role::kPrefill) prefill_rate += p;
    if (inst.role == Role::kDecode) decode_rate += d;
    if (inst.role == Role::kColocated) colocated_rate += 1.0 / (1.0 / p + 1.0 / d);
  }
  const double bound = colocated_rate > 0 ? colocated_rate : std::min(prefill_rate, decode_rate);
  return 4.0 * std::min(bound, 1e6);
}

Result<Summary> AttainmentAt(std::span<const InstanceConfig> instances, const ClusterLinks& links,
                             std::span<const SimRequest> unit_rate, double rate,
                             const GoodputOptions& options) {
  if (!(rate > 0)) return InvalidArgument("rate must be positive");
  const std::vector<SimRequest> reqs =
      AtRate(unit_rate.first(RequestsForRate(options, rate, unit_rate.size())), rate);
  SimOptions sim;
  sim.slo = options.slo;
  sim.make_scheduler = options.make_scheduler;
  ASSIGN_OR_RETURN(SimResult r, Simulate(instances, links, reqs, sim));
  return Summarize(r.requests, options.slo);
}

Result<double> FindGoodput(std::span<const InstanceConfig> instances, const ClusterLinks& links,
                           std::span<const SimRequest> unit_rate, const GoodputOptions& options) {
  if (unit_rate.empty()) return InvalidArgument("goodput search needs a non-empty workload");
  if (!(options.attainment > 0 && options.attainment <= 1)) {
    return InvalidArgument("attainment target must be in (0, 1]");
  }
  auto meets = [&](double rate) -> Result<bool> {
    const int n = RequestsForRate(options, rate, unit_rate.size());
    const std::vector<SimRequest> reqs = AtRate(unit_rate.first(n), rate);
    SimOptions sim;
    sim.slo = options.slo;
    sim.make_scheduler = options.make_scheduler;
    // Misses allowed before a rate is known to fail the target.
    sim.max_misses =
        static_cast<int>(std::floor((1.0 - options.attainment) * static_cast<double>(n) + 1e-9));
    // Requests that must meet the SLOs for the target (attainment >= target - 1e-12): once
    // that many did, the probe passes whatever the rest do.
    sim.stop_after_meets =
        static_cast<int>(std::ceil((options.attainment - 1e-12) * static_cast<double>(n) - 1e-9));
    ASSIGN_OR_RETURN(SimResult r, Simulate(instances, links, reqs, sim));
    if (r.stopped_early) return false;
    if (r.reached_meets) return true;
    return Summarize(r.requests, options.slo).attainment >= options.attainment - 1e-12;
  };
  double hi = options.max_rate > 0 ? options.max_rate : UpperBoundRate(instances, unit_rate);
  double lo = 0.0;
  for (int i = 0; i < 8; ++i) {  // a bound that still meets the target is widened
    ASSIGN_OR_RETURN(bool ok, meets(hi));
    if (!ok) break;
    lo = hi;
    hi *= 2;
  }
  for (int i = 0; i < options.iterations; ++i) {
    if (i == kZeroCheckAfter && lo == 0.0) {
      // Every probe so far failed: try the bisection's lowest probe. When it fails too, so would
      // every probe left (goodput is monotonic in the rate, as the bisection assumes) and the
      // answer is 0 at once. (Not tried first: a passing probe at a tiny rate is costly.)
      ASSIGN_OR_RETURN(bool ok, meets(std::ldexp(hi, -(options.iterations - i))));
      if (!ok) return 0.0;
    }
    const double mid = 0.5 * (lo + hi);
    ASSIGN_OR_RETURN(bool ok, meets(mid));
    (ok ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace pd::planner
