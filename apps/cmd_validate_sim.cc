// `pdserve validate-sim`: the cluster simulator against the real system on this machine.
//
//   pdserve validate-sim --model models/qwen3-small [--profile FILE] [--threads 1]
//       [--rate 0.5 --rate 1 --rate 2] [--seed 1] [--out FILE]
//
// 1. The latency model: --profile FILE (from `pdserve profile` on the same model and threads),
//    or a quick profile run here, pinned to core 0 like the prefill instance.
// 2. `pdserve up` (1 prefill + 1 decode, --pin-cores: each on its own core) as a child process.
// 3. A warm-up (60 requests at 20 req/s, another seed), then calibration through the deployment
//    by probe sets, three before the first bench round and one after each (the machine drifts; the
//    calibration is the median over the sets): idle TTFT probes at three prompt lengths (with the
//    prefill instance's compute-thread CPU time from schedstat: a scale on the profile's prefill
//    step; the rest of the TTFT is a fixed cost and a KV transfer time per prompt token, which
//    hold no instance), decode probes at batch 1 and 8 (a cost per decode step and per sequence
//    per step beyond the forward pass), co-run pairs (how much each instance slows down while the
//    other computes) and the CPU per request and per token that the bench client and router and
//    each instance's non-compute threads spend (schedstat).
// 3b. The load run, once the rates are fixed: 300 requests of the bench's workload at the highest
//    rate (another seed; not compared), during which the bench client's and router's CPU is
//    measured: under load they take 1.5-3x the CPU per request the sequential probes show.
// 3c. Calibration runs: in every round, just before each rate's bench run, 100 requests at that
//    rate (another seed per round; traced, not compared). Per rate, the median over its runs of
//    the client's and router's CPU, the prefill and decode steps' stretch, the decode co-run
//    factor and the outside latency replaces the load run's (apps/validate_sim_rate_cal.h): the
//    per-rate-median rule. The paired rule simulates each round with the figures of the
//    calibration run just before it and compares the medians over rounds of each side
//    (apps/validate_sim_paired.h); kPairedRuleUsed says which is used, the other is printed
//    beside it.
// 4. Rounds: per round, `pdserve bench`'s own runner (Poisson arrivals, the random dataset, a
//    fixed seed, ignore_eos) against the router at each rate (20/40/60% of the calibrated
//    capacity unless --rate is given); the measured side is the median of the rounds.
// 5. The simulator on the same requests (the same lengths and arrival times, regenerated from the
//    seed with the bench's generators), running engine::Scheduler with the instances' policy and
//    pdserve's hand-over (first token sampled by the decode instance): with the latency model
//    alone, and calibrated, each instance's steps stretched by the CPU share that the client,
//    the router (their cost from the load run) and its own non-compute threads take at that rate;
//    with --trace, the decode instance's stretch and co-run factor are the load run's traced ones
//    (apps/validate_sim_decode_load.h), and each request reaches the instances its traced delay
//    on the way in later (drawn with its outside latency: apps/validate_sim_simulate.h).
// 6. Side by side: SLO attainment and p50/p90 TTFT and TPOT, simulated vs measured, and the noise:
//    how far the rounds spread (the machine) and how far reseeded simulations spread (sampling).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <thread>

#include "apps/command.h"
#include "apps/matmul_flag.h"
#include "bench/client.h"
#include "bench/datasets.h"
#include "bench/runner.h"
#include "common/file_util.h"
#include "common/thread_util.h"
#include "common/trace.h"
#include "engine/model_runner.h"
#include "model/weights.h"
#ifdef PD_PLANNER_HAS_ENGINE_SCHEDULER
#include "planner/engine_scheduler.h"
#endif
#include "apps/validate_sim_calibration.h"
#include "apps/validate_sim_decode_load.h"
#include "apps/validate_sim_flags.h"
#include "apps/validate_sim_outside.h"
#include "apps/validate_sim_paired.h"
#include "apps/validate_sim_probes.h"
#include "apps/validate_sim_rate_cal.h"
#include "apps/validate_sim_report.h"
#include "apps/validate_sim_simulate.h"
#include "apps/validate_sim_up.h"
#include "planner/paired_rounds.h"
#include "planner/profiler.h"
#include "planner/simulator.h"
#include "planner/step_stats.h"
#include "planner/validate.h"
#include "planner/validate_stats.h"

namespace pd::apps {
namespace {

using validate_sim::BatchTpot;
using validate_sim::BenchRequests;
using validate_sim::CalibratedAt;
using validate_sim::CalibrateDecodeUnderLoad;
using validate_sim::CalibratedLinks;
using validate_sim::CalibrateKvReady;
using validate_sim::CalibrateOutside;
using validate_sim::Calibration;
using validate_sim::ChooseSlo;
using validate_sim::ClientRequestsOf;
using validate_sim::ClientRouterCpuSeconds;
using validate_sim::Combine;
using validate_sim::ContentionWindow;
using validate_sim::CorunFactors;
using validate_sim::CorunSample;
using validate_sim::CpuPerRequest;
using validate_sim::CpuWindow;
using validate_sim::Deployment;
using validate_sim::FindInstances;
using validate_sim::Instances;
using validate_sim::LoadRunCpu;
using validate_sim::MachineCores;
using validate_sim::MeasureCorun;
using validate_sim::PrintReports;
using validate_sim::ProbeRequest;
using validate_sim::ProbeSet;
using validate_sim::RateReport;
using validate_sim::ReportJson;
using validate_sim::RoundResult;
using validate_sim::RunProbes;
using validate_sim::SimulateRate;
using validate_sim::StartUp;
using validate_sim::Stretches;
using validate_sim::ThreadTimes;
using validate_sim::TpotOf;
using validate_sim::UpProcess;
using validate_sim::ValidateFlags;
using validate_sim::ValidateSlo;
using validate_sim::WithDecodeBatchFactors;
using validate_sim::WithoutStepFactors;

int Fail(const std::string& message) {
  std::fprintf(stderr, "pdserve validate-sim: %s\n", message.c_str());
  return 1;
}

// The profile from the file, or a quick one measured here on core 0 (the runner's threads
// inherit the affinity).
Result<planner::StepCoeffs> LoadOrProfile(const ValidateFlags& f) {
  if (!f.profile.empty()) {
    ASSIGN_OR_RETURN(auto table, planner::LoadProfile(f.profile, ""));
    return table->Coeffs(1);
  }
  std::fprintf(stderr, "validate-sim: profiling %s (--quick, %d thread(s), core 0)\n",
               f.model.c_str(), f.threads);
  ASSIGN_OR_RETURN(model::ModelWeights weights, model::LoadModelWeights(f.model));
  planner::ProfileOptions po = planner::DefaultProfileOptions(true, 1024, 1024);
  // Decode shapes over what the workload gives the decode instance (as sim_vs_real.sh does).
  const int lo = std::max(1, static_cast<int>(f.input_len * (1 - f.range_ratio)));
  const int hi = static_cast<int>((f.input_len + f.output_len) * (1 + f.range_ratio));
  RETURN_IF_ERROR(planner::SetDecodeGrid(
      &po, {1, 2, 4, 8, 16}, {lo, f.input_len + f.output_len / 2, std::min(hi, 1024)}, 1024));
  engine::ModelRunnerOptions ro;
  ro.num_threads = f.threads;
  ro.matmul = CheckedMatmul(f.matmul);
  ro.num_pages = planner::PagesNeeded(po, ro.kv.page_size);
  const std::vector<int> all_cpus = CurrentThreadCpus();
  if (f.pin_cores) (void)PinCurrentThread({0});
  auto runner = engine::ModelRunner::Create(weights, ro);
  if (!runner.ok()) return runner.status();
  auto r = planner::ProfileRunner(**runner, po);
  runner->reset();
  if (f.pin_cores) (void)PinCurrentThread(all_cpus);
  if (!r.ok()) return r.status();
  std::printf("%s", planner::FormatProfile(*r).c_str());
  return r->coeffs;
}

// The bench's workload: the random dataset with the flags' lengths.
bench::DatasetSpec SpecOf(const ValidateFlags& f) {
  bench::DatasetSpec spec;
  spec.name = "random";
  spec.random_input_len = f.input_len;
  spec.random_output_len = f.output_len;
  spec.random_range_ratio = f.range_ratio;
  return spec;
}

// The bench's options for `n` requests of `spec` at `rate` req/s against the deployment.
bench::BenchOptions BenchAt(const ValidateFlags& f, const bench::DatasetSpec& spec, int n,
                            double rate, uint64_t seed) {
  bench::BenchOptions bo;
  bo.endpoint.port = f.port;
  bo.dataset = spec;
  bo.num_prompts = n;
  bo.request_rate = rate;
  bo.seed = seed;
  bo.ignore_eos = true;
  return bo;
}

// As many as a compared round: 100 gave per-request figures 1.5-2.5x apart between runs.
constexpr int kLoadRunPrompts = 300;
constexpr int kWarmUpPrompts = 60;
constexpr double kWarmUpRate = 20;  // req/s: about a third of this machine's capacity

// Before any probe: the bench's workload, 60 requests at 20 req/s
// (another seed; not compared), so that the instances' KV pages, caches and the connections'
// paths are as warm as in the bench rounds that follow.
Status WarmUp(const ValidateFlags& f) {
  return bench::RunBenchmark(BenchAt(f, SpecOf(f), kWarmUpPrompts, kWarmUpRate, f.seed + 7919))
      .status();
}

int PromptsAt(const ValidateFlags& f, double rate) {
  return std::clamp(static_cast<int>(rate * f.seconds_per_rate), 20, f.max_prompts);
}

Result<RoundResult> BenchRound(const ValidateFlags& f, const bench::DatasetSpec& spec, double rate,
                               const ValidateSlo& slo, const Deployment& dep) {
  const int n = PromptsAt(f, rate);
  std::fprintf(stderr, "validate-sim: rate %.3g req/s, %d requests\n", rate, n);
  bench::BenchOptions bo = BenchAt(f, spec, n, rate, f.seed);
  bo.goodput_ms = {{"ttft", slo.ttft_s * 1e3}, {"tpot", slo.tpot_s * 1e3}};
  const double cpu0 = ClientRouterCpuSeconds(dep.up);
  const auto wall0 = std::chrono::steady_clock::now();
  const ContentionWindow window(dep);
  RoundResult out;
  out.begin_s = Tracer::NowNs() * 1e-9;
  ASSIGN_OR_RETURN(bench::BenchmarkSummary real, bench::RunBenchmark(bo));
  out.end_s = Tracer::NowNs() * 1e-9;
  out.stretch = window.Finish();
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  out.client_router_cores = (ClientRouterCpuSeconds(dep.up) - cpu0) / std::max(wall_s, 1e-9);
  ASSIGN_OR_RETURN(auto measured, planner::MeasuredFromBenchJson(real.json, "bench result"));
  out.measured = planner::Summarize(measured, slo, slo.other);
  ASSIGN_OR_RETURN(out.client,
                   ClientRequestsOf(real.json, bench::ArrivalTimes(n, rate, 1.0, f.seed)));
  if (!out.client.empty()) out.requests = std::move(measured);  // in arrival order
  return out;
}

Status SimulateRateReport(const ValidateFlags& f, const bench::DatasetSpec& spec,
                          const ValidateSlo& slo, const planner::StepCoeffs& coeffs,
                          int64_t kv_tokens, const planner::ClusterLinks& links,
                          const Calibration& cal, const std::optional<Calibration>& own_split,
                          RateReport* r) {
  const double rate = r->raw.rate;
  const int n = PromptsAt(f, rate);
  std::vector<planner::Summary> measured;
  for (const RoundResult& rr : r->rounds) measured.push_back(rr.measured);
  r->raw.measured = r->calibrated.measured = planner::MedianSummary(measured);
  r->machine = planner::RelativeSpread(measured);
  r->modelled_cores = rate * cal.StretchCpu().Seconds(f.output_len);
  ASSIGN_OR_RETURN(auto cal_insts, CalibratedAt(f, coeffs, cal, kv_tokens, rate));
  ASSIGN_OR_RETURN(auto reqs, BenchRequests(spec, n, rate, f.seed));
  // The calibrated KV transfer: its time per prompt token, as the link's bandwidth.
  const planner::ClusterLinks cal_links = CalibratedLinks(links, cal);
  ASSIGN_OR_RETURN(
      r->calibrated.simulated,
      SimulateRate(cal_insts, cal_links, reqs, slo, cal.outside, &r->sim_steps, &r->sim_requests));
  r->per_rate_median = r->calibrated;
  if (cal.decode_step_factors || cal.prefill_step_factors) {
    auto other = cal_insts;
    for (auto& inst : other) {
      if (inst.role == planner::Role::kPrefill) inst.step_factors = cal.prefill_step_factors;
    }
    ASSIGN_OR_RETURN(r->with_prefill_factors,
                     SimulateRate(other, cal_links, reqs, slo, cal.outside));
    ASSIGN_OR_RETURN(r->without_step_factors, SimulateRate(WithoutStepFactors(cal_insts), cal_links,
                                                           reqs, slo, cal.outside));
  }
  if (cal.outside.has_inbound()) {
    ASSIGN_OR_RETURN(r->without_inbound_hop,
                     SimulateRate(cal_insts, cal_links, reqs, slo, cal.outside, nullptr, nullptr,
                                  /*inbound_hop=*/false));
  }
  if (cal.prefill_loop_gap_s > 0) {
    auto no_gap = cal_insts;
    for (auto& inst : no_gap) inst.loop_gap_s = 0.0;
    ASSIGN_OR_RETURN(r->without_loop_gap, SimulateRate(no_gap, cal_links, reqs, slo, cal.outside));
  }
  if (cal.outside.has_tail()) {
    ASSIGN_OR_RETURN(r->without_tail,
                     SimulateRate(cal_insts, cal_links, reqs, slo, cal.outside.WithoutTail()));
  }
  for (const planner::ArrivalMeasure m : planner::kAllArrivalMeasures) {
    if (!HasArrivalWork(cal, m)) continue;
    ASSIGN_OR_RETURN(auto worked,
                     CalibratedAt(f, coeffs, WithArrivalWork(cal, m), kv_tokens, rate));
    ASSIGN_OR_RETURN(r->with_arrival_work[static_cast<size_t>(m)],
                     SimulateRate(worked, cal_links, reqs, slo, cal.outside));
  }
  if (!cal.measured_batch_factors.empty()) {
    ASSIGN_OR_RETURN(r->with_batch_factors,
                     SimulateRate(WithDecodeBatchFactors(cal_insts, cal.measured_batch_factors),
                                  cal_links, reqs, slo, cal.outside, &r->batch_factor_steps));
  }
  if (own_split) {
    ASSIGN_OR_RETURN(auto own_insts, CalibratedAt(f, coeffs, *own_split, kv_tokens, rate));
    ASSIGN_OR_RETURN(r->own_split,
                     SimulateRate(own_insts, cal_links, reqs, slo, own_split->outside));
  }
  ASSIGN_OR_RETURN(r->raw.simulated,
                   SimulateRate(Instances(f, coeffs, planner::RealOverheads{}, kv_tokens), links,
                                reqs, slo, planner::OutsideLatency()));
  std::vector<planner::Summary> reseeded;
  for (int k = 1; k <= f.sampling_seeds; ++k) {
    ASSIGN_OR_RETURN(auto other, BenchRequests(spec, n, rate, f.seed + k));
    ASSIGN_OR_RETURN(planner::Summary s,
                     SimulateRate(cal_insts, cal_links, other, slo, cal.outside));
    reseeded.push_back(s);
  }
  r->sampling = planner::RelativeSpread(reseeded);
  return OkStatus();
}

// The calibrated capacity: the rate at which the prefill instance is busy all the time with
// prompts of the mean length, its steps slowed by the co-run factor (at high load the decode
// instance is almost always busy) and by the CPU that the client and the router take from its
// core per request (SaturationRate; its own threads' work is in its calibrated step; the decode
// side's own threads count as in the stretch). The 128/32 workload is
// prefill-bound on this engine; the decode side's bound (batches of 16, the same accounting) is
// taken too in case a workload is not.
Result<double> CalibratedCapacity(const ValidateFlags& f, const planner::StepCoeffs& c,
                                  const Calibration& cal, int64_t kv_tokens) {
  const auto insts = Instances(f, c, cal.overheads, kv_tokens);
  const double shared = cal.client_cpu.Seconds(f.output_len) / MachineCores();
  const double prefill_s =
      insts[0].coeffs.PrefillMs(f.input_len, double(f.input_len) * f.input_len) * 1e-3 *
      cal.overheads.corun_prefill;
  ASSIGN_OR_RETURN(double prefill_cap, planner::SaturationRate(prefill_s, shared));
  const int b = std::min(f.max_num_seqs, 16);
  const double decode_s =
      insts[1].coeffs.DecodeMs(b, int64_t(b) * (f.input_len + f.output_len / 2)) * 1e-3 *
      cal.overheads.corun_decode * f.output_len / b;
  ASSIGN_OR_RETURN(double decode_cap,
                   planner::SaturationRate(decode_s, shared + cal.decode_own_cpu.per_request_s));
  return std::min(prefill_cap, decode_cap);
}

// Below 75%: there a 25% slower spell of this machine (the probe sets drift that much within a
// run) takes the prefill instance to 94% busy, and the rounds of one run disagreed by up to 87%
// in attainment and 270% in TTFT p50.
constexpr double kLoadShares[] = {0.2, 0.4, 0.6};

// Probe sets before the first round: the compared rates come from the median of their
// capacities (planner::SteadyCapacity), not from one set that may catch a fast or slow spell of
// this machine (one set put a run's rates 25% higher than the next three sets would have).
constexpr int kPreRoundProbeSets = 3;

// The rates: --rate, or 20/40/60% of the calibrated capacity (the median over the pre-round
// probe sets, each calibrated alone, so fixed before any bench round). `rule` says which.
Result<std::vector<double>> ChooseRates(const ValidateFlags& f, const planner::StepCoeffs& c,
                                        const std::vector<ProbeSet>& pre_round, int64_t kv_tokens,
                                        std::string* rule) {
  *rule = "rates given with --rate";
  if (!f.rates.empty()) return f.rates;
  std::vector<double> caps;
  std::string each;
  for (const ProbeSet& set : pre_round) {
    ASSIGN_OR_RETURN(const Calibration one, Combine(f, {set}, false));
    ASSIGN_OR_RETURN(const double cap, CalibratedCapacity(f, c, one, kv_tokens));
    caps.push_back(cap);
    each += (each.empty() ? "" : ", ") + std::to_string(cap).substr(0, 5);
  }
  ASSIGN_OR_RETURN(const double cap, planner::SteadyCapacity(caps));
  std::vector<double> rates;
  for (double share : kLoadShares) rates.push_back(share * cap);
  char text[400];
  std::snprintf(text, sizeof(text),
                "rates 20/40/60%% of the calibrated capacity %.1f req/s (median of %zu pre-round "
                "probe sets' capacities: %s; mean prompts, prefill steps x co-run, less the "
                "client's, router's and its own threads' CPU)",
                cap, caps.size(), each.c_str());
  *rule = text;
  return rates;
}

// The load run, after the rates are fixed and before the first compared round: the bench's
// workload at the highest compared rate (another seed; not compared), during which the bench
// client's and router's CPU is measured: concurrent requests cost them 1.5-3x what the
// sequential probes do, and the calibrated simulation's stretch needs the cost under load. The
// highest rate, because the stretch's error is the rate times the cost's error, and because per
// request the two took more at the lowest rate (a run whose rounds measured 5.4-7.7 ms per
// request at 12.3 req/s and 3.6-4.5 ms at 37; its 100-request load run at 12.3 req/s measured
// 9.2 ms, and the simulation stretched the higher rates' steps by 2.4x the rounds' CPU).
// Also each calibration run (validate_sim_rate_cal.h): `n` requests of seed `seed` at `rate`.
Result<LoadRunCpu> LoadRun(const ValidateFlags& f, double rate, const Deployment& dep,
                           int n = kLoadRunPrompts, uint64_t seed = 0,
                           const char* what = "load run") {
  const bench::BenchOptions bo = BenchAt(f, SpecOf(f), n, rate, seed ? seed : f.seed + 104729);
  ASSIGN_OR_RETURN(std::vector<bench::LengthPair> lengths,
                   bench::SampleLengths(bo.dataset, bo.num_prompts, bo.seed));
  LoadRunCpu load;
  load.rate = rate;
  load.requests = bo.num_prompts;
  for (const bench::LengthPair& l : lengths) load.mean_output_tokens += l.output_len;
  load.mean_output_tokens /= std::max<size_t>(1, lengths.size());
  std::fprintf(stderr, "validate-sim: %s, %d requests at %.3g req/s\n", what, bo.num_prompts, rate);
  const double cpu0 = ClientRouterCpuSeconds(dep.up);
  load.begin_s = Tracer::NowNs() * 1e-9;
  ASSIGN_OR_RETURN(bench::BenchmarkSummary run, bench::RunBenchmark(bo));
  load.end_s = Tracer::NowNs() * 1e-9;
  load.cpu_s = ClientRouterCpuSeconds(dep.up) - cpu0;
  load.seed = bo.seed;
  ASSIGN_OR_RETURN(load.client, ClientRequestsOf(run.json, bench::ArrivalTimes(bo.num_prompts, rate,
                                                                               1.0, bo.seed)));
  return load;
}

// The measured side: `f.rounds` rounds of bench runs over the rates, each rate's preceded by an
// uncompared calibration run at that rate (`cal_runs`, per rate), a probe set after each round.
Status RunRounds(const ValidateFlags& f, const bench::DatasetSpec& spec,
                 const std::vector<double>& rates, const ValidateSlo& slo, const Deployment& dep,
                 const planner::StepCoeffs& c, std::vector<ProbeSet>* sets,
                 std::vector<RateReport>* reports, std::vector<std::vector<LoadRunCpu>>* cal_runs) {
  reports->assign(rates.size(), RateReport{});
  cal_runs->assign(rates.size(), {});
  for (int round = 0; round < f.rounds; ++round) {
    for (size_t i = 0; i < rates.size(); ++i) {
      ASSIGN_OR_RETURN(LoadRunCpu cal_run,
                       LoadRun(f, rates[i], dep, validate_sim::CalRunPrompts(f),
                               validate_sim::CalRunSeed(f, round), "calibration run"));
      (*cal_runs)[i].push_back(std::move(cal_run));
      ASSIGN_OR_RETURN(RoundResult r, BenchRound(f, spec, rates[i], slo, dep));
      (*reports)[i].rounds.push_back(r);
    }
    ASSIGN_OR_RETURN(ProbeSet set, RunProbes(f, c, dep, round + kPreRoundProbeSets));
    sets->push_back(set);
  }
  return OkStatus();
}

// The serve default: an f32 KV region of 256 MiB.
struct KvLayout {
  double bytes_per_token = 0;
  int64_t tokens = 0;
};
Result<KvLayout> KvOf(const std::string& model) {
  ASSIGN_OR_RETURN(model::ModelWeights weights, model::LoadModelWeights(model));
  const model::ModelConfig& mc = weights.config;
  KvLayout kv;
  kv.bytes_per_token = 2.0 * 4 * mc.num_layers * mc.num_kv_heads * mc.head_dim;
  kv.tokens = static_cast<int64_t>((256ull << 20) / kv.bytes_per_token);
  return kv;
}

Status Validate(const ValidateFlags& f) {
  if (f.threads < 1 || f.input_len < 2 || f.output_len < 2 || f.rounds < 1 ||
      f.sampling_seeds < 0 || f.corun_pairs < 1) {
    return InvalidArgument(
        "--threads >= 1, --input-len >= 2, --output-len >= 2, --rounds >= 1, "
        "--sampling-seeds >= 0 and --corun-pairs >= 1");
  }
  ASSIGN_OR_RETURN(const planner::StepCoeffs coeffs, LoadOrProfile(f));
  ASSIGN_OR_RETURN(const KvLayout kv, KvOf(f.model));
  UpProcess up;
  RETURN_IF_ERROR(StartUp(f, &up));
  ASSIGN_OR_RETURN(const Deployment dep, FindInstances(up.pid));
  RETURN_IF_ERROR(WarmUp(f));
  std::vector<ProbeSet> sets;
  for (int k = 0; k < kPreRoundProbeSets; ++k) {
    ASSIGN_OR_RETURN(ProbeSet set, RunProbes(f, coeffs, dep, k));
    sets.push_back(set);
  }
  // The SLOs and the rates come from the pre-round probe sets: fixed before any bench round.
  ASSIGN_OR_RETURN(Calibration cal, Combine(f, sets, false));
  ASSIGN_OR_RETURN(const ValidateSlo slo, ChooseSlo(f, cal.idle_ttft_s, cal.idle_tpot_s,
                                                    cal.batch_tpot_s, cal.batch_probe));
  std::string rate_rule;
  ASSIGN_OR_RETURN(const std::vector<double> rates,
                   ChooseRates(f, coeffs, sets, kv.tokens, &rate_rule));
  ASSIGN_OR_RETURN(const LoadRunCpu load, LoadRun(f, rates.back(), dep));
  const bench::DatasetSpec spec = SpecOf(f);
  std::vector<RateReport> reports;
  std::vector<std::vector<LoadRunCpu>> cal_runs;
  RETURN_IF_ERROR(RunRounds(f, spec, rates, slo, dep, coeffs, &sets, &reports, &cal_runs));
  up.Stop();
  ASSIGN_OR_RETURN(Calibration probes, Combine(f, sets, false));
  ASSIGN_OR_RETURN(cal, Combine(f, sets, true, &load));
  for (size_t i = 0; i < rates.size(); ++i)
    reports[i].raw.rate = reports[i].calibrated.rate = rates[i];
  // The traces are read once and parsed into the requests and the engine steps (the texts, ~90 MB,
  // are dropped then).
  Result<std::vector<planner::TracedRequest>> traced = FailedPrecondition("no --trace");
  Result<validate_sim::TracedSteps> steps = FailedPrecondition("no --trace");
  {
    const Result<validate_sim::TraceTexts> texts = validate_sim::ReadTraceTexts(f);
    traced = validate_sim::ReadTracedRequests(texts);
    steps = texts.ok() ? validate_sim::ReadTracedSteps(*texts)
                       : Result<validate_sim::TracedSteps>(texts.status());
  }
  // The latency outside the engines, from the load run's traced requests (the rule is fixed in
  // the code; the load run came before every compared round).
  CalibrateOutside(f, load.client, load.begin_s, load.end_s, reports, traced, &cal);
  // The hand-over point inside the prefill step, from the same load run's traces.
  CalibrateKvReady(f, load.begin_s, load.end_s, reports, traced, &cal);
  probes.overheads.kv_ready_fraction = cal.overheads.kv_ready_fraction;
  probes.overheads.transfer_s_per_token = cal.overheads.transfer_s_per_token;
  // Uncalibrated, the KV transfer takes no time; calibrated, the probes' transfer time per token.
  planner::ClusterLinks links;
  links.kv_bytes_per_token = kv.bytes_per_token;
  links.intra_node_bw = 1e18;
  // The decode steps' stretch and co-run factor under load, from the load run's traces (the rule
  // is fixed in the code; the load run came before every compared round).
  CalibrateDecodeUnderLoad(f, spec, coeffs, kv.tokens, links, slo, load, steps, &cal);
  // Per rate, the median of that rate's calibration runs (apps/validate_sim_rate_cal.h); the single
  // load run's calibration `cal` is simulated beside it (not used).
  std::printf(
      "\nunder load per rate (%d calibration runs of %d requests at each rate, one before each "
      "round's bench run at that rate, not compared; per run / median, beside the single load "
      "run's):\n",
      f.rounds, validate_sim::CalRunPrompts(f));
  for (size_t i = 0; i < reports.size(); ++i) {
    std::vector<planner::CalibrationRunFactors> runs;
    std::vector<planner::RunWindow> windows;
    for (const LoadRunCpu& run : cal_runs[i]) {
      std::printf("  calibration window %.3g req/s: %.6f %.6f\n", run.rate, run.begin_s, run.end_s);
      runs.push_back(validate_sim::FactorsOfRun(f, spec, coeffs, kv.tokens, links, slo, run, probes,
                                                steps, traced));
      windows.push_back({run.begin_s, run.end_s});
    }
    std::optional<Calibration> own_split;
    ASSIGN_OR_RETURN(const planner::RateCalibration rc,
                     planner::CombineCalibrationRuns(runs, f.output_len));
    ASSIGN_OR_RETURN(const Calibration at_rate,
                     validate_sim::CalibrationAtRate(f, runs, rc, cal, &reports[i].rate_calibration,
                                                     &own_split));
    RETURN_IF_ERROR(SimulateRateReport(f, spec, slo, coeffs, kv.tokens, links, at_rate, own_split,
                                       &reports[i]));
    // The paired rule (apps/validate_sim_paired.h): each round with its own calibration run.
    const Status paired =
        validate_sim::SimulatePaired(f, spec, slo, coeffs, kv.tokens, links, runs, windows, cal, rc,
                                     PromptsAt(f, rates[i]), &reports[i]);
    if (!paired.ok() && validate_sim::kPairedRuleUsed) return paired;
    if (!paired.ok()) {
      std::fprintf(stderr, "validate-sim: paired rule at %.3g req/s: %s\n", rates[i],
                   paired.ToString().c_str());
    }
    if (validate_sim::kPairedRuleUsed) reports[i].calibrated = reports[i].paired->row;
  }
  PrintReports(f, slo, cal, reports, rate_rule);
  validate_sim::PrintPaired(reports);
  if (!f.trace.empty()) {
    if (steps.ok()) {
      PrintStepComparisons(reports, *steps);
    } else {
      std::fprintf(stderr, "validate-sim: --trace: %s\n", steps.status().ToString().c_str());
    }
  }
  if (f.out.empty()) return OkStatus();
  return WriteStringToFile(f.out, ReportJson(f, slo, cal, reports).dump(2) + "\n");
}

int RunValidate(const ValidateFlags& f) {
  const Status s = Validate(f);
  return s.ok() ? 0 : Fail(s.ToString());
}

CommandRunner SetUpValidate(CLI::App* app) {
  auto f = std::make_shared<ValidateFlags>();
  app->add_option("--model", f->model, "model directory")->required();
  app->add_option("--profile,--latency-model", f->profile,
                  "latency model from `pdserve profile` (default: a quick profile here)");
  app->add_option("--threads", f->threads, "compute threads per instance")->capture_default_str();
  app->add_option("--rate", f->rates, "request rates (default: 20/40/60% of capacity)");
  app->add_option("--port", f->port, "router port (instances: P+1, P+2)")->capture_default_str();
  app->add_option("--seed", f->seed)->capture_default_str();
  app->add_option("--input-len", f->input_len, "random dataset: prompt tokens")
      ->capture_default_str();
  app->add_option("--output-len", f->output_len, "random dataset: output tokens")
      ->capture_default_str();
  app->add_option("--range-ratio", f->range_ratio, "random dataset: length spread")
      ->capture_default_str();
  app->add_option("--seconds-per-rate", f->seconds_per_rate, "arrival span per rate")
      ->capture_default_str();
  app->add_option("--max-prompts", f->max_prompts, "requests per rate and round at most")
      ->capture_default_str();
  app->add_option("--rounds", f->rounds, "bench rounds per rate; the measured side is the median")
      ->capture_default_str();
  app->add_option("--sampling-seeds", f->sampling_seeds,
                  "reseeded simulations per rate that show the sampling noise")
      ->capture_default_str();
  app->add_option("--corun-pairs", f->corun_pairs, "interleaved alone/busy co-run probe pairs")
      ->capture_default_str();
  app->add_option("--ttft", f->ttft_slo_s, "TTFT SLO, s (default: 3x idle TTFT)");
  app->add_option("--tpot", f->tpot_slo_s, "TPOT SLO, s (default: by --slo-rule)");
  app->add_option("--slo-rule", f->slo_rule,
                  "the TPOT SLO: batch (the batch-8 decode probe's TPOT) or idle (2x the idle "
                  "TPOT); the other rule's attainment is printed beside")
      ->check(CLI::IsMember({"batch", "idle"}))
      ->capture_default_str();
  app->add_option("--max-num-seqs", f->max_num_seqs)->capture_default_str();
  app->add_option("--max-num-batched-tokens", f->max_num_batched_tokens)->capture_default_str();
  AddMatmulFlag(app, &f->matmul,
                "f32 | bf16: the instances' --matmul and the in-place profile's precision (with "
                "--profile, profile it with the same)");
  app->add_flag("!--no-pin", f->pin_cores, "do not pin the instances to cores");
  app->add_flag("!--no-corun", f->corun,
                "do not measure or simulate the instances slowing each other down");
  app->add_option("--out", f->out, "also write the comparison as JSON");
  app->add_option("--up-log", f->up_log, "where pdserve up's output goes")->capture_default_str();
  app->add_option("--trace", f->trace,
                  "pdserve up --trace FILE (the instances' Chrome traces); prints the real decode "
                  "steps per batch size beside the simulation's");
  return [f] { return RunValidate(*f); };
}

// The name has a dash, so register directly rather than through PD_REGISTER_COMMAND.
const bool kRegistered = RegisterCommand(
    {"validate-sim", "Simulator against the real system: pdserve bench vs the simulator",
     SetUpValidate});

}  // namespace

}  // namespace pd::apps
