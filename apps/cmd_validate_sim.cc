// `pdserve validate-sim`: the cluster simulator against the real system on this machine.
//
//   pdserve validate-sim --model models/qwen3-small [--profile FILE] [--threads 1]
//       [--rate 0.5 --rate 1 --rate 2] [--seed 1] [--out FILE]
//
// 1. The latency model: --profile FILE (from `pdserve profile` on the same model and threads),
//    or a quick profile run here, pinned to core 0 like the prefill instance.
// 2. `pdserve up` (1 prefill + 1 decode, --pin-cores: each on its own core) as a child process.
// 3. Calibration through the deployment, measured each run and printed: idle TTFT probes at three
//    prompt lengths fit a fixed cost per request (HTTP, router, hand-over messages) and a scale
//    on the profile's prefill step (the prefill instance computes slower than the isolated
//    runner `pdserve profile` timed; the KV transfer grows with the prompt too); decode probes at
//    batch 1 and 8 fit a cost per decode step and per sequence per step beyond the forward pass
//    (scheduling, sampling, detokenising, streaming); co-run probes, how much each instance slows
//    down while the other computes; and the CPU the bench client and router spend.
// 4. Per rate: `pdserve bench`'s own runner (Poisson arrivals, the random dataset, a fixed seed,
//    ignore_eos) against the router, and the simulator on the same requests (the same lengths
//    and arrival times, regenerated from the seed with the bench's generators), running
//    engine::Scheduler with the instances' policy and pdserve's hand-over (first token sampled by
//    the decode instance): with the latency model alone, calibrated, and calibrated with each
//    instance's steps scaled by the CPU contention (schedstat) of the run against the probes'.
// 5. Side by side: SLO attainment and p50/p90 TTFT and TPOT, simulated vs measured.
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

namespace pd::apps {
namespace {

using validate_sim::BatchTpot;
using validate_sim::ClientRouterCpuSeconds;
using validate_sim::ContentionWindow;
using validate_sim::Deployment;
using validate_sim::FindInstances;
using validate_sim::MeasureCorun;
using validate_sim::Median;
using validate_sim::ProbeRequest;
using validate_sim::Stretches;
using validate_sim::UpProcess;

struct ValidateFlags {
  std::string model;
  std::string profile;  // "" : profile here (--quick)
  int threads = 1;
  std::vector<double> rates;  // empty: 25%, 50%, 75% of the modelled capacity
  int port = 8700;
  uint64_t seed = 1;
  int input_len = 128;
  int output_len = 32;
  double range_ratio = 0.5;
  double seconds_per_rate = 60.0;
  int max_prompts = 200;
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
  double client_router_cpu_s = 0.0;  // CPU seconds of bench client + router per idle request
  Stretches stretch;                 // of the instances during the probes
};

// Idle TTFT probes: prompts of 16 tokens and of the dataset's mean and 2x mean, two tokens each
// (the median of seven after a warm-up). Decode probes: one request of the mean prompt with
// output_len tokens, and `batch` requests of 16-token prompts with 4x output_len tokens sent
// together (the median of three each).
Result<Calibration> Calibrate(const ValidateFlags& f, const planner::StepCoeffs& c,
                              const Deployment& dep) {
  const pid_t up_pid = dep.up;
  bench::Endpoint ep;
  ep.port = f.port;
  ASSIGN_OR_RETURN(bench::ServerInfo info, bench::GetServerInfo(ep));
  std::vector<planner::IdleProbe> probes;
  Calibration cal;
  const ContentionWindow window(dep);
  uint64_t salt = 1;
  // Round-robin over the lengths, so that a burst of load from elsewhere on the machine hits every
  // length alike; the first round warms up, the median of the next seven counts.
  const std::vector<int> lens = {16, f.input_len, 2 * f.input_len};
  std::vector<std::vector<double>> ttft(lens.size());
  for (int round = 0; round < 8; ++round) {
    for (size_t k = 0; k < lens.size(); ++k) {
      bench::GenerationRequest r = ProbeRequest(lens[k], 2, salt++);
      r.model = info.model_id;
      bench::RequestResult m = bench::SendStreaming(ep, r);
      if (!m.success) return Unavailable("idle probe failed: " + m.error);
      if (round > 0) ttft[k].push_back(m.ttft);
    }
  }
  for (size_t k = 0; k < lens.size(); ++k) {
    probes.push_back(
        {lens[k], Median(ttft[k]), ModelledTtftS(c, lens[k]), ModelledPrefillS(c, lens[k])});
  }
  cal.idle_ttft_s = probes[1].measured_ttft_s;
  std::vector<double> tpot;
  const double cpu0 = ClientRouterCpuSeconds(up_pid);
  for (int rep = 0; rep < 3; ++rep) {
    bench::GenerationRequest r = ProbeRequest(f.input_len, f.output_len, salt++);
    r.model = info.model_id;
    bench::RequestResult m = bench::SendStreaming(ep, r);
    if (!m.success || m.output_len < 2) return Unavailable("idle TPOT probe failed: " + m.error);
    tpot.push_back((m.latency - m.ttft) / (m.output_len - 1));
  }
  cal.client_router_cpu_s = (ClientRouterCpuSeconds(up_pid) - cpu0) / 3;
  cal.idle_tpot_s = Median(tpot);
  std::vector<planner::DecodeProbe> decode = {
      {1, cal.idle_tpot_s, c.DecodeMs(1, f.input_len + f.output_len / 2) * 1e-3}};
  const int batch = std::min(8, f.max_num_seqs);
  if (batch > 1) {
    const int out = 4 * f.output_len;
    std::vector<double> batch_tpot;
    for (int rep = 0; rep < 3; ++rep) {
      ASSIGN_OR_RETURN(double t, BatchTpot(ep, info.model_id, batch, 16, out, salt));
      salt += batch;
      batch_tpot.push_back(t);
    }
    decode.push_back(
        {batch, Median(batch_tpot), c.DecodeMs(batch, int64_t(batch) * (16 + out / 2)) * 1e-3});
  }
  cal.stretch = window.Finish();
  ASSIGN_OR_RETURN(cal.overheads, planner::SolveOverheads(probes, decode));
  if (f.corun) {
    ASSIGN_OR_RETURN(cal.overheads,
                     MeasureCorun(ep, info.model_id, f.input_len, f.output_len, cal.overheads));
  }
  std::printf("idle probes through the deployment (measured vs latency model):\n");
  for (const auto& p : probes) {
    std::printf("  prompt %5d: TTFT %.2f ms measured, %.2f ms modelled (prefill step %.2f ms)\n",
                p.prompt_len, p.measured_ttft_s * 1e3, p.modelled_ttft_s * 1e3,
                p.modelled_prefill_s * 1e3);
  }
  for (const auto& d : decode) {
    std::printf("  batch %2d: TPOT %.3f ms measured, %.3f ms modelled (forward pass only)\n",
                d.batch, d.measured_tpot_s * 1e3, d.modelled_tpot_s * 1e3);
  }
  const planner::RealOverheads& o = cal.overheads;
  std::printf(
      "calibrated from these probes (fed to the calibrated simulation): prefill steps x%.3f "
      "(this deployment's prefill instance vs the profile), fixed %.2f ms per request (HTTP, "
      "router, hand-over), decode %.3f ms per step + %.3f ms per sequence per step (sampling, "
      "detokenising, streaming); bench client + router use %.2f ms CPU per request; waiting "
      "for a core stretched the prefill instance's work x%.3f, the decode instance's x%.3f\n",
      o.prefill_scale, o.fixed_s * 1e3, o.decode_fixed_ms, o.decode_seq_ms,
      cal.client_router_cpu_s * 1e3, cal.stretch.prefill, cal.stretch.decode);
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

// The step times of each instance scaled by how much more (or less) waiting for a core stretched
// its work during the run than during the probes the calibration came from.
std::vector<planner::InstanceConfig> Slowed(std::vector<planner::InstanceConfig> insts,
                                            const Stretches& factor) {
  for (auto& inst : insts) {
    const double k = inst.role == planner::Role::kPrefill ? factor.prefill : factor.decode;
    for (auto* form : {&inst.coeffs.prefill, &inst.coeffs.decode_small, &inst.coeffs.decode_large})
      for (double& v : *form) v *= k;
  }
  return insts;
}

struct RateResult {
  planner::ComparisonRow raw;         // the latency model alone
  planner::ComparisonRow steady;      // calibrated by the probes
  planner::ComparisonRow calibrated;  // and scaled by the per-run CPU contention
  Stretches stretch;                  // of the instances during the run (measured)
  Stretches contention;               // the step-time factors the calibrated simulation used
  double client_router_cores = 0;     // measured during the run
};

Result<RateResult> RunRate(const ValidateFlags& f, const bench::DatasetSpec& spec, double rate,
                           const planner::Slo& slo, const planner::StepCoeffs& coeffs,
                           int64_t kv_tokens, const planner::ClusterLinks& links,
                           const Calibration& cal, const Deployment& dep) {
  const pid_t up_pid = dep.up;
  const int n = std::clamp(static_cast<int>(rate * f.seconds_per_rate), 20, f.max_prompts);
  std::fprintf(stderr, "validate-sim: rate %.3g req/s, %d requests\n", rate, n);
  bench::BenchOptions bo;
  bo.endpoint.port = f.port;
  bo.dataset = spec;
  bo.num_prompts = n;
  bo.request_rate = rate;
  bo.seed = f.seed;
  bo.ignore_eos = true;
  bo.goodput_ms = {{"ttft", slo.ttft_s * 1e3}, {"tpot", slo.tpot_s * 1e3}};
  const double cpu0 = ClientRouterCpuSeconds(up_pid);
  const auto wall0 = std::chrono::steady_clock::now();
  const ContentionWindow window(dep);
  ASSIGN_OR_RETURN(bench::BenchmarkSummary real, bench::RunBenchmark(bo));
  RateResult out;
  out.stretch = window.Finish();
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  out.client_router_cores = (ClientRouterCpuSeconds(up_pid) - cpu0) / std::max(wall_s, 1e-9);
  ASSIGN_OR_RETURN(auto measured, planner::MeasuredFromBenchJson(real.json, "bench result"));
  ASSIGN_OR_RETURN(auto reqs, BenchRequests(spec, n, rate, f.seed));
  out.contention = {out.stretch.prefill / cal.stretch.prefill,
                    out.stretch.decode / cal.stretch.decode};
  const auto raw_insts = Instances(f, coeffs, planner::RealOverheads{}, kv_tokens);
  const auto cal_insts = Slowed(Instances(f, coeffs, cal.overheads, kv_tokens), out.contention);
  out.raw.rate = out.calibrated.rate = out.steady.rate = rate;
  out.raw.measured = out.calibrated.measured = out.steady.measured =
      planner::Summarize(measured, slo);
  ASSIGN_OR_RETURN(out.steady.simulated,
                   SimulateRate(Instances(f, coeffs, cal.overheads, kv_tokens), links, reqs, slo,
                                cal.overheads.fixed_s));
  ASSIGN_OR_RETURN(out.raw.simulated, SimulateRate(raw_insts, links, reqs, slo, 0.0));
  ASSIGN_OR_RETURN(out.calibrated.simulated,
                   SimulateRate(cal_insts, links, reqs, slo, cal.overheads.fixed_s));
  return out;
}

nlohmann::json OverheadsJson(const Calibration& cal) {
  const planner::RealOverheads& o = cal.overheads;
  return {{"fixed_s", o.fixed_s},
          {"prefill_scale", o.prefill_scale},
          {"decode_fixed_ms", o.decode_fixed_ms},
          {"decode_seq_ms", o.decode_seq_ms},
          {"corun_prefill", o.corun_prefill},
          {"corun_decode", o.corun_decode},
          {"client_router_cpu_s_per_request", cal.client_router_cpu_s},
          {"probe_stretch", {{"prefill", cal.stretch.prefill}, {"decode", cal.stretch.decode}}}};
}

std::vector<double> DefaultRates(const ValidateFlags& f, const planner::StepCoeffs& c,
                                 const Calibration& cal, int64_t kv_tokens) {
  // Capacity (calibrated): the slower of prefill (one mean prompt per step) and decode (a full
  // batch).
  const auto insts = Instances(f, c, cal.overheads, kv_tokens);
  const double prefill_s =
      insts[0].coeffs.PrefillMs(f.input_len, double(f.input_len) * f.input_len) * 1e-3;
  const int b = std::min(f.max_num_seqs, 16);
  const double decode_s =
      insts[1].coeffs.DecodeMs(b, int64_t(b) * (f.input_len + f.output_len / 2)) * 1e-3;
  const double cap = std::min(1.0 / prefill_s, b / (decode_s * f.output_len));
  return {0.25 * cap, 0.5 * cap, 0.75 * cap};
}

int RunValidate(const ValidateFlags& f) {
  if (f.threads < 1 || f.input_len < 2 || f.output_len < 2) {
    return Fail("--threads >= 1, --input-len >= 2 and --output-len >= 2");
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
  auto cal = Calibrate(f, *coeffs, *dep);
  if (!cal.ok()) return Fail(cal.status().ToString());
  planner::Slo slo{f.ttft_slo_s > 0 ? f.ttft_slo_s : 3 * cal->idle_ttft_s,
                   f.tpot_slo_s > 0 ? f.tpot_slo_s : 2 * cal->idle_tpot_s};
  // The KV transfer is part of what the prefill calibration measured (it grows with the prompt).
  planner::ClusterLinks links;
  links.kv_bytes_per_token = kv_bytes_per_token;
  links.intra_node_bw = 1e18;
  const std::vector<double> rates =
      f.rates.empty() ? DefaultRates(f, *coeffs, *cal, kv_tokens) : f.rates;
  bench::DatasetSpec spec;
  spec.name = "random";
  spec.random_input_len = f.input_len;
  spec.random_output_len = f.output_len;
  spec.random_range_ratio = f.range_ratio;
  std::vector<planner::ComparisonRow> raw, steady, calibrated;
  std::string contention;
  for (double rate : rates) {
    auto r = RunRate(f, spec, rate, slo, *coeffs, kv_tokens, links, *cal, *dep);
    if (!r.ok()) return Fail(r.status().ToString());
    raw.push_back(r->raw);
    calibrated.push_back(r->calibrated);
    steady.push_back(r->steady);
    char line[320];
    std::snprintf(line, sizeof(line),
                  "  rate %.3g: bench client + router used %.2f cores; waiting for a core "
                  "stretched prefill x%.3f, decode x%.3f (measured); calibrated steps scaled "
                  "x%.3f (prefill), x%.3f (decode) against the probes\n",
                  rate, r->client_router_cores, r->stretch.prefill, r->stretch.decode,
                  r->contention.prefill, r->contention.decode);
    contention += line;
  }
  up.Stop();
  std::printf(
      "\n%s, 1 prefill + 1 decode, %d thread(s) each%s; random dataset %d/%d tokens (range "
      "%.2g), Poisson, seed %llu; SLO TTFT %.1f ms, TPOT %.1f ms\n",
      f.model.c_str(), f.threads, f.pin_cores ? ", pinned" : "", f.input_len, f.output_len,
      f.range_ratio, static_cast<unsigned long long>(f.seed), slo.ttft_s * 1e3, slo.tpot_s * 1e3);
  std::printf("\nthe latency model alone (the profile, nothing calibrated):\n%s",
              planner::FormatComparison(raw).c_str());
  std::printf(
      "\ncalibrated through this deployment by the probes (prefill x%.3f, fixed %.2f ms, decode "
      "+%.3f ms/step +%.3f ms/seq, co-run prefill x%.3f decode x%.3f):\n%s",
      cal->overheads.prefill_scale, cal->overheads.fixed_s * 1e3, cal->overheads.decode_fixed_ms,
      cal->overheads.decode_seq_ms, cal->overheads.corun_prefill, cal->overheads.corun_decode,
      planner::FormatComparison(steady).c_str());
  std::printf(
      "\nthe same, each instance's steps also scaled by the CPU contention of each run against "
      "the probes' (experimental):\n%s%s",
      planner::FormatComparison(calibrated).c_str(), contention.c_str());
  if (!f.out.empty()) {
    nlohmann::json j = {{"model", f.model},
                        {"threads", f.threads},
                        {"slo", {{"ttft_s", slo.ttft_s}, {"tpot_s", slo.tpot_s}}},
                        {"calibration", OverheadsJson(*cal)},
                        {"rows", planner::ComparisonToJson(steady)},
                        {"rows_uncalibrated", planner::ComparisonToJson(raw)},
                        {"rows_with_contention", planner::ComparisonToJson(calibrated)}};
    if (Status s = WriteStringToFile(f.out, j.dump(2) + "\n"); !s.ok()) return Fail(s.ToString());
  }
  return 0;
}

CommandRunner SetUpValidate(CLI::App* app) {
  auto f = std::make_shared<ValidateFlags>();
  app->add_option("--model", f->model, "model directory")->required();
  app->add_option("--profile,--latency-model", f->profile,
                  "latency model from `pdserve profile` (default: a quick profile here)");
  app->add_option("--threads", f->threads, "compute threads per instance")->capture_default_str();
  app->add_option("--rate", f->rates, "request rates (default: 25/50/75% of capacity)");
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
  app->add_option("--max-prompts", f->max_prompts, "requests per rate at most")
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
