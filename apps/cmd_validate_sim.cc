// `pdserve validate-sim`: the cluster simulator against the real system on this machine.
//
//   pdserve validate-sim --model models/qwen3-small [--profile FILE] [--threads 1]
//       [--rate 0.5 --rate 1 --rate 2] [--seed 1] [--out FILE]
//
// 1. The latency model: --profile FILE (from `pdserve profile` on the same model and threads),
//    or a quick profile run here, pinned to core 0 like the prefill instance.
// 2. `pdserve up` (1 prefill + 1 decode, --pin-cores: each on its own core) as a child process.
// 3. A warm-up (60 requests at 20 req/s, another seed), then calibration through the deployment
//    by probe sets, one before the first bench round and one after each (the machine drifts; the
//    calibration is the median over the sets): idle TTFT probes at three prompt lengths (with the
//    prefill instance's compute-thread CPU time from schedstat: a scale on the profile's prefill
//    step; the rest of the TTFT is a fixed cost and a KV transfer time per prompt token, which
//    hold no instance), decode probes at batch 1 and 8 (a cost per decode step and per sequence
//    per step beyond the forward pass), co-run pairs (how much each instance slows down while the
//    other computes) and the CPU per request and per token that the bench client and router and
//    each instance's non-compute threads spend (schedstat).
// 4. Rounds: per round, `pdserve bench`'s own runner (Poisson arrivals, the random dataset, a
//    fixed seed, ignore_eos) against the router at each rate (20/40/60% of the calibrated
//    capacity unless --rate is given); the measured side is the median of the rounds.
// 5. The simulator on the same requests (the same lengths and arrival times, regenerated from the
//    seed with the bench's generators), running engine::Scheduler with the instances' policy and
//    pdserve's hand-over (first token sampled by the decode instance): with the latency model
//    alone, and calibrated, each instance's steps stretched by the CPU share that the client,
//    the router and its own non-compute threads take at that rate.
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
#include "bench/client.h"
#include "bench/datasets.h"
#include "bench/runner.h"
#include "common/file_util.h"
#include "common/thread_util.h"
#include "engine/model_runner.h"
#include "model/weights.h"
#ifdef PD_PLANNER_HAS_ENGINE_SCHEDULER
#include "planner/engine_scheduler.h"
#endif
#include "apps/validate_sim_probes.h"
#include "apps/validate_sim_up.h"
#include "planner/profiler.h"
#include "planner/simulator.h"
#include "planner/validate.h"
#include "planner/validate_stats.h"

namespace pd::apps {
namespace {

using validate_sim::BatchTpot;
using validate_sim::ClientRouterCpuSeconds;
using validate_sim::ContentionWindow;
using validate_sim::CorunFactors;
using validate_sim::CorunSample;
using validate_sim::CpuPerRequest;
using validate_sim::CpuWindow;
using validate_sim::Deployment;
using validate_sim::FindInstances;
using validate_sim::MeasureCorun;
using validate_sim::Median;
using validate_sim::ProbeRequest;
using validate_sim::Stretches;
using validate_sim::ThreadTimes;
using validate_sim::TpotOf;
using validate_sim::UpProcess;

struct ValidateFlags {
  std::string model;
  std::string profile;  // "" : profile here (--quick)
  int threads = 1;
  std::vector<double> rates;  // empty: 20%, 40%, 60% of the calibrated capacity
  int port = 8700;
  uint64_t seed = 1;
  int input_len = 128;
  int output_len = 32;
  double range_ratio = 0.5;
  double seconds_per_rate = 60.0;
  int max_prompts = 300;
  int rounds = 3;           // bench rounds per rate (same seed): the measured side is their median
  int sampling_seeds = 8;   // reseeded simulations per rate: the spread a workload's sample gives
  int corun_pairs = 3;      // per probe set
  double ttft_slo_s = 0.0;  // 0: 3x the idle TTFT of a mean prompt
  double tpot_slo_s = 0.0;  // 0: 2x the idle TPOT
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  bool pin_cores = true;
  bool corun = true;  // measure and simulate the instances slowing each other down
  std::string out;
  std::string up_log = "/tmp/pdserve-validate-sim-up.log";
};

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
  engine::ModelRunnerOptions ro;
  ro.num_threads = f.threads;
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

Status StartUp(const ValidateFlags& f, UpProcess* up) {
  std::vector<std::string> args = {"pdserve",
                                   "up",
                                   "--model",
                                   f.model,
                                   "--prefill",
                                   "1",
                                   "--decode",
                                   "1",
                                   "--threads",
                                   std::to_string(f.threads),
                                   "--port",
                                   std::to_string(f.port),
                                   "--max-num-seqs",
                                   std::to_string(f.max_num_seqs),
                                   "--max-num-batched-tokens",
                                   std::to_string(f.max_num_batched_tokens)};
  // Whole instances pinned: the simulator models instances that do not disturb each other, and
  // with only two cores the decode instance's streaming threads would otherwise run on the
  // prefill core (measured: attainment 82-84% vs 92-96% at ~18 req/s).
  if (f.pin_cores) args.insert(args.end(), {"--pin-cores", "--pin-whole-instances"});
  const int log = open(f.up_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (log < 0) return IoError(f.up_log + ": " + std::strerror(errno));
  up->pid = fork();
  if (up->pid < 0) return Internal(std::string("fork: ") + std::strerror(errno));
  if (up->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    dup2(log, 1);
    dup2(log, 2);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(log);
  bench::Endpoint ep;
  ep.port = f.port;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < end) {
    int status = 0;
    if (waitpid(up->pid, &status, WNOHANG) == up->pid) {
      up->pid = -1;
      return Unavailable("pdserve up exited during start-up; see " + f.up_log);
    }
    if (bench::GetServerInfo(ep).ok()) return OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return DeadlineExceeded("pdserve up did not answer within 300 s; see " + f.up_log);
}

double ModelledPrefillS(const planner::StepCoeffs& c, int prompt) {
  return c.PrefillMs(prompt, double(prompt) * prompt) * 1e-3;
}
// Modelled idle TTFT: the prefill step, then the decode step that samples the first token.
double ModelledTtftS(const planner::StepCoeffs& c, int prompt) {
  return ModelledPrefillS(c, prompt) + c.DecodeMs(1, prompt + 1) * 1e-3;
}

struct Calibration {
  planner::RealOverheads overheads;
  double idle_ttft_s = 0.0;  // at the mean prompt
  double idle_tpot_s = 0.0;
  planner::ClientCpuCost client_cpu;  // bench client + router, per request and output token
  planner::ClientCpuCost prefill_own_cpu, decode_own_cpu;  // instances' non-compute threads
  Stretches stretch;                                       // of the instances during the probes
};

// Where the probes go and the salt of their synthetic prompts.
struct ProbeTarget {
  bench::Endpoint ep;
  std::string model;
  Deployment dep;
  uint64_t salt = 1;
  Result<bench::RequestResult> Send(int prompt_len, int max_tokens) {
    bench::GenerationRequest r = ProbeRequest(prompt_len, max_tokens, salt++);
    r.model = model;
    bench::RequestResult m = bench::SendStreaming(ep, r);
    if (!m.success) return Unavailable("probe failed: " + m.error);
    return m;
  }
};

constexpr int kTtftRounds = 12;  // the first warms up
constexpr int kTpotProbes = 7;
constexpr int kBatchProbes = 5;
constexpr int kWarmUpPrompts = 60;
constexpr double kWarmUpRate = 20;  // req/s: about a third of this machine's capacity

// Idle TTFT probes: prompts of 16 tokens and of the dataset's mean and 2x mean, two tokens each,
// round-robin over the lengths (a burst of load from elsewhere hits every length alike); the
// median of 11 after a warm-up round. Also the client's and router's CPU per such request.
Result<std::vector<planner::IdleProbe>> TtftProbes(const ValidateFlags& f,
                                                   const planner::StepCoeffs& c, ProbeTarget& t,
                                                   CpuPerRequest* cpu) {
  const std::vector<int> lens = {16, f.input_len, 2 * f.input_len};
  std::vector<std::vector<double>> ttft(lens.size());
  const CpuWindow window(t.dep);
  std::vector<std::vector<double>> compute(lens.size());
  for (int round = 0; round < kTtftRounds; ++round) {
    for (size_t k = 0; k < lens.size(); ++k) {
      const planner::ThreadCpuTimes before = ThreadTimes(t.dep.prefill);
      ASSIGN_OR_RETURN(bench::RequestResult m, t.Send(lens[k], 2));
      const double cpu = planner::BusiestThreadRunSeconds(before, ThreadTimes(t.dep.prefill));
      if (round > 0) {
        ttft[k].push_back(m.ttft);
        compute[k].push_back(cpu);
      }
    }
  }
  *cpu = window.PerRequest(kTtftRounds * lens.size());
  std::vector<planner::IdleProbe> probes;
  for (size_t k = 0; k < lens.size(); ++k) {
    probes.push_back({lens[k], Median(ttft[k]), ModelledTtftS(c, lens[k]),
                      ModelledPrefillS(c, lens[k]), Median(compute[k])});
  }
  return probes;
}

// Decode probes: one request of the mean prompt with output_len tokens (the median of 7, and the
// client's and router's CPU per such request), and `batch` requests of 16-token prompts with
// 4x output_len tokens sent together (the median of 5).
Result<std::vector<planner::DecodeProbe>> DecodeProbes(const ValidateFlags& f,
                                                       const planner::StepCoeffs& c, ProbeTarget& t,
                                                       CpuPerRequest* cpu) {
  std::vector<double> tpot;
  const CpuWindow window(t.dep);
  for (int rep = 0; rep < kTpotProbes; ++rep) {
    ASSIGN_OR_RETURN(bench::RequestResult m, t.Send(f.input_len, f.output_len));
    if (m.output_len < 2) return Unavailable("idle TPOT probe: fewer than 2 tokens came back");
    tpot.push_back(TpotOf(m));
  }
  *cpu = window.PerRequest(kTpotProbes);
  std::vector<planner::DecodeProbe> decode = {
      {1, Median(tpot), c.DecodeMs(1, f.input_len + f.output_len / 2) * 1e-3}};
  const int batch = std::min(8, f.max_num_seqs);
  if (batch > 1) {
    const int out = 4 * f.output_len;
    std::vector<double> batch_tpot;
    for (int rep = 0; rep < kBatchProbes; ++rep) {
      ASSIGN_OR_RETURN(double tp, BatchTpot(t.ep, t.model, batch, 16, out, t.salt));
      t.salt += batch;
      batch_tpot.push_back(tp);
    }
    decode.push_back(
        {batch, Median(batch_tpot), c.DecodeMs(batch, int64_t(batch) * (16 + out / 2)) * 1e-3});
  }
  return decode;
}

void PrintCalibration(const std::vector<planner::IdleProbe>& probes,
                      const std::vector<planner::DecodeProbe>& decode, const Calibration& cal) {
  std::printf("idle probes through the deployment (measured vs latency model):\n");
  for (const auto& p : probes) {
    std::printf(
        "  prompt %5d: TTFT %.2f ms measured, %.2f ms modelled; prefill step %.2f ms modelled, "
        "the prefill instance computed %.2f ms\n",
        p.prompt_len, p.measured_ttft_s * 1e3, p.modelled_ttft_s * 1e3, p.modelled_prefill_s * 1e3,
        p.measured_prefill_cpu_s * 1e3);
  }
  for (const auto& d : decode) {
    std::printf("  batch %2d: TPOT %.3f ms measured, %.3f ms modelled (forward pass only)\n",
                d.batch, d.measured_tpot_s * 1e3, d.modelled_tpot_s * 1e3);
  }
  const planner::RealOverheads& o = cal.overheads;
  std::printf(
      "calibrated from these probes (fed to the calibrated simulation): prefill steps x%.3f "
      "(this deployment's prefill instance's compute thread vs the profile), fixed %.2f ms per "
      "request (HTTP, router, hand-over) and %.4f ms per prompt token (KV transfer; neither holds "
      "an instance), decode %.3f ms per step + %.3f ms per sequence per step (sampling, "
      "detokenising, streaming); bench client + router use %.3f ms CPU per request + %.4f ms per "
      "output token, the prefill instance's non-compute threads %.3f ms + %.4f ms/token, the "
      "decode instance's %.3f ms + %.4f ms/token (schedstat); waiting for a core stretched the "
      "prefill instance's work x%.3f, the decode instance's x%.3f (not used)\n",
      o.prefill_scale, o.fixed_s * 1e3, o.transfer_s_per_token * 1e3, o.decode_fixed_ms,
      o.decode_seq_ms, cal.client_cpu.per_request_s * 1e3, cal.client_cpu.per_token_s * 1e3,
      cal.prefill_own_cpu.per_request_s * 1e3, cal.prefill_own_cpu.per_token_s * 1e3,
      cal.decode_own_cpu.per_request_s * 1e3, cal.decode_own_cpu.per_token_s * 1e3,
      cal.stretch.prefill, cal.stretch.decode);
}

// Before any probe: the bench's workload, 60 requests at 20 req/s
// (another seed; not compared), so that the instances' KV pages, caches and the connections'
// paths are as warm as in the bench rounds that follow.
Status WarmUp(const ValidateFlags& f) {
  bench::BenchOptions bo;
  bo.endpoint.port = f.port;
  bo.dataset.name = "random";
  bo.dataset.random_input_len = f.input_len;
  bo.dataset.random_output_len = f.output_len;
  bo.dataset.random_range_ratio = f.range_ratio;
  bo.num_prompts = kWarmUpPrompts;
  bo.request_rate = kWarmUpRate;
  bo.seed = f.seed + 7919;
  bo.ignore_eos = true;
  return bench::RunBenchmark(bo).status();
}

// One set of calibration probes: idle TTFT and decode probes, the client's and router's CPU, the
// co-run pairs. validate-sim takes one before the first bench round and one after each round, so
// the calibration spans the same stretch of time as the runs it is compared with (this machine
// drifts by 10-30% over minutes; a burst of probes catches one moment of it).
struct ProbeSet {
  std::vector<planner::IdleProbe> ttft;
  std::vector<planner::DecodeProbe> decode;
  CpuPerRequest cpu_short, cpu_long;  // per 2-token / output_len request
  std::vector<CorunSample> corun;
  Stretches stretch;
};

Result<ProbeSet> RunProbes(const ValidateFlags& f, const planner::StepCoeffs& c,
                           const Deployment& dep, int set) {
  ProbeTarget t;
  t.ep.port = f.port;
  t.dep = dep;
  t.salt = 1 + 100000ull * set;
  ASSIGN_OR_RETURN(bench::ServerInfo info, bench::GetServerInfo(t.ep));
  t.model = info.model_id;
  ProbeSet ps;
  const ContentionWindow window(dep);
  ASSIGN_OR_RETURN(ps.ttft, TtftProbes(f, c, t, &ps.cpu_short));
  ASSIGN_OR_RETURN(ps.decode, DecodeProbes(f, c, t, &ps.cpu_long));
  ps.stretch = window.Finish();
  if (f.corun) {
    ASSIGN_OR_RETURN(ps.corun, MeasureCorun(t.ep, t.model, dep.prefill, f.input_len, f.output_len,
                                            f.corun_pairs, t.salt + 50000));
  }
  std::fprintf(stderr,
               "validate-sim: probe set %d: TTFT %.2f / %.2f / %.2f ms, TPOT %.3f (batch 1) / %.3f "
               "ms (batch %d)\n",
               set, ps.ttft[0].measured_ttft_s * 1e3, ps.ttft[1].measured_ttft_s * 1e3,
               ps.ttft[2].measured_ttft_s * 1e3, ps.decode[0].measured_tpot_s * 1e3,
               ps.decode.back().measured_tpot_s * 1e3, ps.decode.back().batch);
  return ps;
}

double MedianOver(const std::vector<ProbeSet>& sets, double (*get)(const ProbeSet&, size_t),
                  size_t k) {
  std::vector<double> v;
  for (const ProbeSet& s : sets) v.push_back(get(s, k));
  return Median(v);
}

// A CPU cost per request and per output token from the probe sets' medians.
Result<planner::ClientCpuCost> CpuCost(const ValidateFlags& f, const std::vector<ProbeSet>& sets,
                                       double CpuPerRequest::*part) {
  std::vector<double> short_cost, long_cost;
  for (const ProbeSet& s : sets) {
    short_cost.push_back(s.cpu_short.*part);
    long_cost.push_back(s.cpu_long.*part);
  }
  return planner::SolveClientCpuCost(2, Median(short_cost), f.output_len, Median(long_cost));
}

// The calibration from probe sets: each probe's median over the sets, the co-run pairs pooled.
Result<Calibration> Combine(const ValidateFlags& f, const std::vector<ProbeSet>& sets, bool print) {
  if (sets.empty()) return InvalidArgument("no calibration probes");
  std::vector<planner::IdleProbe> ttft = sets[0].ttft;
  std::vector<planner::DecodeProbe> decode = sets[0].decode;
  for (size_t k = 0; k < ttft.size(); ++k) {
    ttft[k].measured_ttft_s = MedianOver(
        sets, [](const ProbeSet& s, size_t i) { return s.ttft[i].measured_ttft_s; }, k);
    ttft[k].measured_prefill_cpu_s = MedianOver(
        sets, [](const ProbeSet& s, size_t i) { return s.ttft[i].measured_prefill_cpu_s; }, k);
  }
  for (size_t k = 0; k < decode.size(); ++k) {
    decode[k].measured_tpot_s = MedianOver(
        sets, [](const ProbeSet& s, size_t i) { return s.decode[i].measured_tpot_s; }, k);
  }
  Calibration cal;
  cal.stretch = sets[0].stretch;
  cal.idle_ttft_s = ttft[1].measured_ttft_s;
  cal.idle_tpot_s = decode[0].measured_tpot_s;
  ASSIGN_OR_RETURN(cal.client_cpu, CpuCost(f, sets, &CpuPerRequest::client));
  ASSIGN_OR_RETURN(cal.prefill_own_cpu, CpuCost(f, sets, &CpuPerRequest::prefill_own));
  ASSIGN_OR_RETURN(cal.decode_own_cpu, CpuCost(f, sets, &CpuPerRequest::decode_own));
  ASSIGN_OR_RETURN(cal.overheads, planner::SolveOverheads(ttft, decode));
  std::vector<CorunSample> pooled;
  for (const ProbeSet& s : sets) pooled.insert(pooled.end(), s.corun.begin(), s.corun.end());
  const std::string corun = CorunFactors(pooled, &cal.overheads);
  if (print) {
    std::printf(
        "calibration: the median of %zu probe sets (before the first bench round and "
        "after each)\n%s",
        sets.size(), corun.c_str());
    PrintCalibration(ttft, decode, cal);
  }
  return cal;
}

// The two instances as `pdserve up` runs them: engine policy, KV capacity of the default region,
// with the calibration applied to the step times.
std::vector<planner::InstanceConfig> Instances(const ValidateFlags& f, planner::StepCoeffs c,
                                               const planner::RealOverheads& o, int64_t kv_tokens) {
  planner::InstanceConfig p;
  p.role = planner::Role::kPrefill;
  p.coeffs = c;
  for (double& k : p.coeffs.prefill) k *= o.prefill_scale;
  p.policy.max_num_seqs = f.max_num_seqs;
  p.policy.max_num_batched_tokens = f.max_num_batched_tokens;
  p.policy.enable_chunked_prefill = true;
  p.policy.kv_capacity_tokens = kv_tokens;
  p.corun_slowdown = o.corun_prefill;
  planner::InstanceConfig d = p;
  d.role = planner::Role::kDecode;
  d.coeffs = c;
  d.corun_slowdown = o.corun_decode;
  // Scheduling once per step; sampling, detokenising and streaming once per sequence in a step.
  for (auto* form : {&d.coeffs.decode_small, &d.coeffs.decode_large}) {
    (*form)[0] += o.decode_fixed_ms;
    (*form)[2] += o.decode_seq_ms;
  }
  return {p, d};
}

// The bench's requests for a rate, regenerated with its own generators.
Result<std::vector<planner::SimRequest>> BenchRequests(const bench::DatasetSpec& spec, int n,
                                                       double rate, uint64_t seed) {
  ASSIGN_OR_RETURN(std::vector<bench::LengthPair> lengths, bench::SampleLengths(spec, n, seed));
  const std::vector<double> arrivals = bench::ArrivalTimes(n, rate, 1.0, seed);
  std::vector<planner::SimRequest> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({i, arrivals[i], lengths[i].prompt_len, lengths[i].output_len});
  }
  return out;
}

// The simulator on the bench's requests; `fixed_s` added to each request's first token and end
// (on the way in and the first token's way out).
Result<planner::Summary> SimulateRate(std::span<const planner::InstanceConfig> insts,
                                      const planner::ClusterLinks& links,
                                      const std::vector<planner::SimRequest>& reqs,
                                      const planner::Slo& slo, double fixed_s) {
  planner::SimOptions so;
  so.slo = slo;
  so.first_token_on_decode = true;
#ifdef PD_PLANNER_HAS_ENGINE_SCHEDULER
  so.make_scheduler = planner::EngineSchedulerFactory();
#endif
  ASSIGN_OR_RETURN(planner::SimResult sim, planner::Simulate(insts, links, reqs, so));
  for (auto& r : sim.requests) {
    if (r.first_token_s >= 0) r.first_token_s += fixed_s;
    if (r.finish_s >= 0) r.finish_s += fixed_s;
  }
  return planner::Summarize(sim.requests, slo);
}

// The step times of each instance scaled by `factor`.
std::vector<planner::InstanceConfig> Slowed(std::vector<planner::InstanceConfig> insts,
                                            const Stretches& factor) {
  for (auto& inst : insts) {
    const double k = inst.role == planner::Role::kPrefill ? factor.prefill : factor.decode;
    for (auto* form : {&inst.coeffs.prefill, &inst.coeffs.decode_small, &inst.coeffs.decode_large})
      for (double& v : *form) v *= k;
  }
  return insts;
}

int MachineCores() { return std::max<int>(1, CurrentThreadCpus().size()); }

// The calibrated deployment at `rate`: the probes' calibration, each instance's steps stretched
// by the share of its core that other work takes at that rate: the bench client and router
// (unpinned: from both cores alike) and the instance's own HTTP, fabric and messenger threads
// (pinned with it), their CPU measured by the probes. Of the instance's own threads only the part
// per request counts (receiving the request, the KV transfer): their work per token (streaming
// it) runs between that instance's steps, so the decode probes' per-sequence cost holds it
// already.
Result<std::vector<planner::InstanceConfig>> CalibratedAt(const ValidateFlags& f,
                                                          const planner::StepCoeffs& c,
                                                          const Calibration& cal, int64_t kv_tokens,
                                                          double rate) {
  Stretches k;
  const planner::ClientCpuCost prefill_own{cal.prefill_own_cpu.per_request_s, 0.0};
  const planner::ClientCpuCost decode_own{cal.decode_own_cpu.per_request_s, 0.0};
  ASSIGN_OR_RETURN(k.prefill, planner::BackgroundCpuStretch(cal.client_cpu, rate, f.output_len,
                                                            MachineCores(), prefill_own));
  ASSIGN_OR_RETURN(k.decode, planner::BackgroundCpuStretch(cal.client_cpu, rate, f.output_len,
                                                           MachineCores(), decode_own));
  return Slowed(Instances(f, c, cal.overheads, kv_tokens), k);
}

// One bench run at one rate, measured.
struct RoundResult {
  planner::Summary measured;
  double client_router_cores = 0;  // measured during the run
  Stretches stretch;               // waiting for a core, measured during the run (not used)
};

int PromptsAt(const ValidateFlags& f, double rate) {
  return std::clamp(static_cast<int>(rate * f.seconds_per_rate), 20, f.max_prompts);
}

Result<RoundResult> BenchRound(const ValidateFlags& f, const bench::DatasetSpec& spec, double rate,
                               const planner::Slo& slo, const Deployment& dep) {
  const int n = PromptsAt(f, rate);
  std::fprintf(stderr, "validate-sim: rate %.3g req/s, %d requests\n", rate, n);
  bench::BenchOptions bo;
  bo.endpoint.port = f.port;
  bo.dataset = spec;
  bo.num_prompts = n;
  bo.request_rate = rate;
  bo.seed = f.seed;
  bo.ignore_eos = true;
  bo.goodput_ms = {{"ttft", slo.ttft_s * 1e3}, {"tpot", slo.tpot_s * 1e3}};
  const double cpu0 = ClientRouterCpuSeconds(dep.up);
  const auto wall0 = std::chrono::steady_clock::now();
  const ContentionWindow window(dep);
  ASSIGN_OR_RETURN(bench::BenchmarkSummary real, bench::RunBenchmark(bo));
  RoundResult out;
  out.stretch = window.Finish();
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  out.client_router_cores = (ClientRouterCpuSeconds(dep.up) - cpu0) / std::max(wall_s, 1e-9);
  ASSIGN_OR_RETURN(auto measured, planner::MeasuredFromBenchJson(real.json, "bench result"));
  out.measured = planner::Summarize(measured, slo);
  return out;
}

// Everything about one rate: the simulations beside the median of the bench rounds, and the
// spreads that say how much of a difference is noise.
struct RateReport {
  planner::ComparisonRow raw, calibrated;
  std::vector<RoundResult> rounds;
  planner::Spread machine;    // over the bench rounds (the same requests each time)
  planner::Spread sampling;   // the calibrated simulation over reseeded workloads
  double modelled_cores = 0;  // the bench client's and router's CPU the simulation assumes
};

Status SimulateRateReport(const ValidateFlags& f, const bench::DatasetSpec& spec,
                          const planner::Slo& slo, const planner::StepCoeffs& coeffs,
                          int64_t kv_tokens, const planner::ClusterLinks& links,
                          const Calibration& cal, RateReport* r) {
  const double rate = r->raw.rate;
  const int n = PromptsAt(f, rate);
  std::vector<planner::Summary> measured;
  for (const RoundResult& rr : r->rounds) measured.push_back(rr.measured);
  r->raw.measured = r->calibrated.measured = planner::MedianSummary(measured);
  r->machine = planner::RelativeSpread(measured);
  r->modelled_cores = rate * cal.client_cpu.Seconds(f.output_len);
  ASSIGN_OR_RETURN(auto cal_insts, CalibratedAt(f, coeffs, cal, kv_tokens, rate));
  ASSIGN_OR_RETURN(auto reqs, BenchRequests(spec, n, rate, f.seed));
  // The calibrated KV transfer: its time per prompt token, as the link's bandwidth.
  planner::ClusterLinks cal_links = links;
  if (cal.overheads.transfer_s_per_token > 0) {
    cal_links.intra_node_bw = links.kv_bytes_per_token / cal.overheads.transfer_s_per_token;
  }
  ASSIGN_OR_RETURN(r->calibrated.simulated,
                   SimulateRate(cal_insts, cal_links, reqs, slo, cal.overheads.fixed_s));
  ASSIGN_OR_RETURN(r->raw.simulated,
                   SimulateRate(Instances(f, coeffs, planner::RealOverheads{}, kv_tokens), links,
                                reqs, slo, 0.0));
  std::vector<planner::Summary> reseeded;
  for (int k = 1; k <= f.sampling_seeds; ++k) {
    ASSIGN_OR_RETURN(auto other, BenchRequests(spec, n, rate, f.seed + k));
    ASSIGN_OR_RETURN(planner::Summary s,
                     SimulateRate(cal_insts, cal_links, other, slo, cal.overheads.fixed_s));
    reseeded.push_back(s);
  }
  r->sampling = planner::RelativeSpread(reseeded);
  return OkStatus();
}

nlohmann::json OverheadsJson(const Calibration& cal) {
  const planner::RealOverheads& o = cal.overheads;
  return {
      {"fixed_s", o.fixed_s},
      {"prefill_scale", o.prefill_scale},
      {"transfer_s_per_token", o.transfer_s_per_token},
      {"decode_fixed_ms", o.decode_fixed_ms},
      {"decode_seq_ms", o.decode_seq_ms},
      {"corun_prefill", o.corun_prefill},
      {"corun_decode", o.corun_decode},
      {"client_router_cpu_s_per_request", cal.client_cpu.per_request_s},
      {"client_router_cpu_s_per_token", cal.client_cpu.per_token_s},
      {"prefill_own_cpu_s", {cal.prefill_own_cpu.per_request_s, cal.prefill_own_cpu.per_token_s}},
      {"decode_own_cpu_s", {cal.decode_own_cpu.per_request_s, cal.decode_own_cpu.per_token_s}},
      {"probe_stretch", {{"prefill", cal.stretch.prefill}, {"decode", cal.stretch.decode}}}};
}

nlohmann::json SpreadJson(const planner::Spread& s) {
  return {{"attainment", s.attainment},
          {"ttft_p50", s.ttft_p50},
          {"ttft_p90", s.ttft_p90},
          {"tpot_p50", s.tpot_p50},
          {"tpot_p90", s.tpot_p90}};
}

// The calibrated capacity: the rate at which the prefill instance is busy all the time with
// prompts of the mean length, its steps slowed by the co-run factor (at high load the decode
// instance is almost always busy) and by the CPU that the client, the router and its own
// non-compute threads take from its core per request (SaturationRate). The 128/32 workload is
// prefill-bound on this engine; the decode side's bound (batches of 16, the same accounting) is
// taken too in case a workload is not.
Result<double> CalibratedCapacity(const ValidateFlags& f, const planner::StepCoeffs& c,
                                  const Calibration& cal, int64_t kv_tokens) {
  const auto insts = Instances(f, c, cal.overheads, kv_tokens);
  const double shared = cal.client_cpu.Seconds(f.output_len) / MachineCores();
  const double prefill_s =
      insts[0].coeffs.PrefillMs(f.input_len, double(f.input_len) * f.input_len) * 1e-3 *
      cal.overheads.corun_prefill;
  ASSIGN_OR_RETURN(double prefill_cap,
                   planner::SaturationRate(prefill_s, shared + cal.prefill_own_cpu.per_request_s));
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

void PrintReports(const ValidateFlags& f, const planner::Slo& slo, const Calibration& cal,
                  const std::vector<RateReport>& reports, const std::string& rate_rule) {
  std::printf(
      "\n%s, 1 prefill + 1 decode, %d thread(s) each%s; random dataset %d/%d tokens (range "
      "%.2g), Poisson, seed %llu; SLO TTFT %.1f ms, TPOT %.1f ms; %s; measured = the median of "
      "%d bench rounds per rate (rates interleaved, the same requests each round)\n",
      f.model.c_str(), f.threads, f.pin_cores ? ", pinned" : "", f.input_len, f.output_len,
      f.range_ratio, static_cast<unsigned long long>(f.seed), slo.ttft_s * 1e3, slo.tpot_s * 1e3,
      rate_rule.c_str(), f.rounds);
  std::vector<planner::ComparisonRow> raw, calibrated;
  for (const RateReport& r : reports) {
    raw.push_back(r.raw);
    calibrated.push_back(r.calibrated);
  }
  std::printf("\nthe latency model alone (the profile, nothing calibrated):\n%s",
              planner::FormatComparison(raw).c_str());
  const planner::RealOverheads& o = cal.overheads;
  std::printf(
      "\ncalibrated through this deployment by the probes (prefill x%.3f, fixed %.2f ms, decode "
      "+%.3f ms/step +%.3f ms/seq, co-run prefill x%.3f decode x%.3f, client + router %.3f "
      "ms/request + %.4f ms/token of CPU taken from %d cores):\n%s",
      o.prefill_scale, o.fixed_s * 1e3, o.decode_fixed_ms, o.decode_seq_ms, o.corun_prefill,
      o.corun_decode, cal.client_cpu.per_request_s * 1e3, cal.client_cpu.per_token_s * 1e3,
      MachineCores(), planner::FormatComparison(calibrated).c_str());
  std::printf(
      "\nnoise, (max - min) / median per metric: machine = over the %d bench rounds (the same "
      "requests); sampling = the calibrated simulation over %d reseeded workloads of the same "
      "size\n",
      f.rounds, f.sampling_seeds);
  for (const RateReport& r : reports) {
    std::printf("  rate %.3g (%d requests): machine %s; sampling %s\n", r.raw.rate,
                r.raw.measured.num_requests, planner::FormatSpread(r.machine).c_str(),
                planner::FormatSpread(r.sampling).c_str());
    for (size_t k = 0; k < r.rounds.size(); ++k) {
      const RoundResult& rr = r.rounds[k];
      const planner::Summary& m = rr.measured;
      std::printf(
          "    round %zu: att %.1f%%, TTFT p50 %.2f p90 %.2f ms, TPOT p50 %.3f p90 %.3f ms; "
          "client + router %.3f cores (modelled %.3f); waited for a core: prefill x%.3f, decode "
          "x%.3f\n",
          k + 1, 100 * m.attainment, m.ttft_p50_s * 1e3, m.ttft_p90_s * 1e3, m.tpot_p50_s * 1e3,
          m.tpot_p90_s * 1e3, rr.client_router_cores, r.modelled_cores, rr.stretch.prefill,
          rr.stretch.decode);
    }
  }
}

nlohmann::json ReportJson(const ValidateFlags& f, const planner::Slo& slo, const Calibration& cal,
                          const std::vector<RateReport>& reports) {
  std::vector<planner::ComparisonRow> raw, calibrated;
  nlohmann::json noise = nlohmann::json::array();
  for (const RateReport& r : reports) {
    raw.push_back(r.raw);
    calibrated.push_back(r.calibrated);
    nlohmann::json rounds = nlohmann::json::array();
    for (const RoundResult& rr : r.rounds) {
      rounds.push_back({{"attainment", rr.measured.attainment},
                        {"ttft_p50_s", rr.measured.ttft_p50_s},
                        {"ttft_p90_s", rr.measured.ttft_p90_s},
                        {"tpot_p50_s", rr.measured.tpot_p50_s},
                        {"tpot_p90_s", rr.measured.tpot_p90_s},
                        {"client_router_cores", rr.client_router_cores}});
    }
    noise.push_back({{"rate", r.raw.rate},
                     {"machine", SpreadJson(r.machine)},
                     {"sampling", SpreadJson(r.sampling)},
                     {"modelled_client_router_cores", r.modelled_cores},
                     {"rounds", rounds}});
  }
  return {{"model", f.model},
          {"threads", f.threads},
          {"slo", {{"ttft_s", slo.ttft_s}, {"tpot_s", slo.tpot_s}}},
          {"calibration", OverheadsJson(cal)},
          {"rows", planner::ComparisonToJson(calibrated)},
          {"rows_uncalibrated", planner::ComparisonToJson(raw)},
          {"noise", noise}};
}

int RunValidate(const ValidateFlags& f) {
  if (f.threads < 1 || f.input_len < 2 || f.output_len < 2 || f.rounds < 1 ||
      f.sampling_seeds < 0 || f.corun_pairs < 1) {
    return Fail(
        "--threads >= 1, --input-len >= 2, --output-len >= 2, --rounds >= 1, "
        "--sampling-seeds >= 0 and --corun-pairs >= 1");
  }
  auto coeffs = LoadOrProfile(f);
  if (!coeffs.ok()) return Fail(coeffs.status().ToString());
  auto weights = model::LoadModelWeights(f.model);
  if (!weights.ok()) return Fail(weights.status().ToString());
  const model::ModelConfig& mc = weights->config;
  // The serve default: an f32 KV region of 256 MiB.
  const double kv_bytes_per_token = 2.0 * 4 * mc.num_layers * mc.num_kv_heads * mc.head_dim;
  const int64_t kv_tokens = static_cast<int64_t>((256ull << 20) / kv_bytes_per_token);
  UpProcess up;
  if (Status s = StartUp(f, &up); !s.ok()) return Fail(s.ToString());
  auto dep = FindInstances(up.pid);
  if (!dep.ok()) return Fail(dep.status().ToString());
  if (Status s = WarmUp(f); !s.ok()) return Fail(s.ToString());
  std::vector<ProbeSet> sets;
  auto first = RunProbes(f, *coeffs, *dep, 0);
  if (!first.ok()) return Fail(first.status().ToString());
  sets.push_back(*first);
  // The SLOs and the rates come from the first probe set: fixed before any bench round.
  auto cal = Combine(f, sets, false);
  if (!cal.ok()) return Fail(cal.status().ToString());
  planner::Slo slo{f.ttft_slo_s > 0 ? f.ttft_slo_s : 3 * cal->idle_ttft_s,
                   f.tpot_slo_s > 0 ? f.tpot_slo_s : 2 * cal->idle_tpot_s};
  // Uncalibrated, the KV transfer takes no time; calibrated, the probes' transfer time per token.
  planner::ClusterLinks links;
  links.kv_bytes_per_token = kv_bytes_per_token;
  links.intra_node_bw = 1e18;
  std::vector<double> rates = f.rates;
  std::string rate_rule = "rates given with --rate";
  if (rates.empty()) {
    auto capacity = CalibratedCapacity(f, *coeffs, *cal, kv_tokens);
    if (!capacity.ok()) return Fail(capacity.status().ToString());
    const double cap = *capacity;
    for (double share : kLoadShares) rates.push_back(share * cap);
    char rule[320];
    std::snprintf(rule, sizeof(rule),
                  "rates 20/40/60%% of the calibrated capacity %.1f req/s (first probe set; mean "
                  "prompts, prefill steps x co-run, less the client's, router's and its own "
                  "threads' CPU)",
                  cap);
    rate_rule = rule;
  }
  bench::DatasetSpec spec;
  spec.name = "random";
  spec.random_input_len = f.input_len;
  spec.random_output_len = f.output_len;
  spec.random_range_ratio = f.range_ratio;
  std::vector<RateReport> reports(rates.size());
  for (int round = 0; round < f.rounds; ++round) {
    for (size_t i = 0; i < rates.size(); ++i) {
      auto r = BenchRound(f, spec, rates[i], slo, *dep);
      if (!r.ok()) return Fail(r.status().ToString());
      reports[i].rounds.push_back(*r);
    }
    auto set = RunProbes(f, *coeffs, *dep, round + 1);
    if (!set.ok()) return Fail(set.status().ToString());
    sets.push_back(*set);
  }
  up.Stop();
  cal = Combine(f, sets, true);
  if (!cal.ok()) return Fail(cal.status().ToString());
  for (size_t i = 0; i < rates.size(); ++i) {
    reports[i].raw.rate = reports[i].calibrated.rate = rates[i];
    Status s = SimulateRateReport(f, spec, slo, *coeffs, kv_tokens, links, *cal, &reports[i]);
    if (!s.ok()) return Fail(s.ToString());
  }
  PrintReports(f, slo, *cal, reports, rate_rule);
  if (!f.out.empty()) {
    const std::string text = ReportJson(f, slo, *cal, reports).dump(2) + "\n";
    if (Status s = WriteStringToFile(f.out, text); !s.ok()) return Fail(s.ToString());
  }
  return 0;
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
  app->add_option("--tpot", f->tpot_slo_s, "TPOT SLO, s (default: 2x idle TPOT)");
  app->add_option("--max-num-seqs", f->max_num_seqs)->capture_default_str();
  app->add_option("--max-num-batched-tokens", f->max_num_batched_tokens)->capture_default_str();
  app->add_flag("!--no-pin", f->pin_cores, "do not pin the instances to cores");
  app->add_flag("!--no-corun", f->corun,
                "do not measure or simulate the instances slowing each other down");
  app->add_option("--out", f->out, "also write the comparison as JSON");
  app->add_option("--up-log", f->up_log, "where pdserve up's output goes")->capture_default_str();
  return [f] { return RunValidate(*f); };
}

// The name has a dash, so register directly rather than through PD_REGISTER_COMMAND.
const bool kRegistered = RegisterCommand(
    {"validate-sim", "Simulator against the real system: pdserve bench vs the simulator",
     SetUpValidate});

}  // namespace

}  // namespace pd::apps
