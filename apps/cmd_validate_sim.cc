// `pdserve validate-sim`: the cluster simulator against the real system on this machine.
//
//   pdserve validate-sim --model models/qwen3-small [--profile FILE] [--threads 1]
//       [--rate 0.5 --rate 1 --rate 2] [--seed 1] [--out FILE]
//
// 1. The latency model: --profile FILE (from `pdserve profile` on the same model and threads),
//    or a quick profile run here, pinned to core 0 like the prefill instance.
// 2. `pdserve up` (1 prefill + 1 decode, --pin-cores: each on its own core) as a child process.
// 3. Idle probes (one request at a time): the real system's fixed TTFT cost (HTTP, router,
//    hand-over messages), its per-prompt-token cost beyond the model (the KV transfer over the
//    loopback fabric) and its per-decode-step cost beyond the forward pass (scheduling, sampling,
//    streaming). These are measured, not assumed, and feed the simulator.
// 4. Per rate: `pdserve bench`'s own runner (Poisson arrivals, the random dataset, a fixed seed,
//    ignore_eos) against the router, and the simulator on the same requests (the same lengths
//    and arrival times, regenerated from the seed with the bench's generators), running
//    engine::Scheduler with the instances' policy and pdserve's hand-over (first token sampled by
//    the decode instance).
// 5. Side by side: SLO attainment and p50/p90 TTFT and TPOT, simulated vs measured.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
#include "engine/model_runner.h"
#include "model/weights.h"
#ifdef PD_PLANNER_HAS_ENGINE_SCHEDULER
#include "planner/engine_scheduler.h"
#endif
#include "planner/profiler.h"
#include "planner/simulator.h"
#include "planner/validate.h"

namespace pd::apps {
namespace {

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
  std::string out;
  std::string up_log = "/tmp/pdserve-validate-sim-up.log";
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "pdserve validate-sim: %s\n", message.c_str());
  return 1;
}

void PinThisThread(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (core >= 0) {
    CPU_SET(core, &set);
  } else {
    for (int c = 0; c < static_cast<int>(std::thread::hardware_concurrency()); ++c)
      CPU_SET(c, &set);
  }
  sched_setaffinity(0, sizeof(set), &set);
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
  if (f.pin_cores) PinThisThread(0);
  auto runner = engine::ModelRunner::Create(weights, ro);
  if (!runner.ok()) return runner.status();
  auto r = planner::ProfileRunner(**runner, po);
  runner->reset();
  PinThisThread(-1);
  if (!r.ok()) return r.status();
  std::printf("%s", planner::FormatProfile(*r).c_str());
  return r->coeffs;
}

struct UpProcess {
  pid_t pid = -1;
  ~UpProcess() { Stop(); }
  void Stop() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 300; ++i) {  // up stops its children within 10 s
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

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
  if (f.pin_cores) args.push_back("--pin-cores");
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

bench::GenerationRequest ProbeRequest(int prompt_len, int max_tokens, uint64_t salt) {
  std::mt19937_64 rng(salt);
  bench::GenerationRequest r;
  r.prompt_ids = bench::SyntheticPromptIds(prompt_len, rng);
  r.prompt_len = prompt_len;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Modelled idle TTFT: the prefill step, then the decode step that samples the first token.
double ModelledTtftS(const planner::StepCoeffs& c, int prompt) {
  return (c.PrefillMs(prompt, double(prompt) * prompt) + c.DecodeMs(1, prompt + 1)) * 1e-3;
}

struct Calibration {
  planner::RealOverheads overheads;
  double idle_ttft_s = 0.0;  // at the mean prompt
  double idle_tpot_s = 0.0;
};

// Idle probes: prompts of 16 tokens and of the dataset's mean and 2x mean, two tokens each
// (TTFT), and one of the mean with output_len tokens (TPOT); the median of three each.
Result<Calibration> Calibrate(const ValidateFlags& f, const planner::StepCoeffs& c) {
  bench::Endpoint ep;
  ep.port = f.port;
  ASSIGN_OR_RETURN(bench::ServerInfo info, bench::GetServerInfo(ep));
  std::vector<planner::IdleProbe> probes;
  Calibration cal;
  uint64_t salt = 1;
  for (int len : {16, f.input_len, 2 * f.input_len}) {
    std::vector<double> ttft;
    for (int rep = 0; rep < 4; ++rep) {
      bench::GenerationRequest r = ProbeRequest(len, 2, salt++);
      r.model = info.model_id;
      bench::RequestResult m = bench::SendStreaming(ep, r);
      if (!m.success) return Unavailable("idle probe failed: " + m.error);
      if (rep > 0) ttft.push_back(m.ttft);  // the first warms up
    }
    probes.push_back({len, Median(ttft), ModelledTtftS(c, len)});
    if (len == f.input_len) cal.idle_ttft_s = probes.back().measured_ttft_s;
  }
  std::vector<double> tpot;
  for (int rep = 0; rep < 3; ++rep) {
    bench::GenerationRequest r = ProbeRequest(f.input_len, f.output_len, salt++);
    r.model = info.model_id;
    bench::RequestResult m = bench::SendStreaming(ep, r);
    if (!m.success || m.output_len < 2) return Unavailable("idle TPOT probe failed: " + m.error);
    tpot.push_back((m.latency - m.ttft) / (m.output_len - 1));
  }
  cal.idle_tpot_s = Median(tpot);
  const double modelled_tpot = c.DecodeMs(1, f.input_len + f.output_len / 2) * 1e-3;
  ASSIGN_OR_RETURN(cal.overheads, planner::SolveOverheads(probes, cal.idle_tpot_s, modelled_tpot));
  std::printf("idle probes (measured vs latency model):\n");
  for (const auto& p : probes) {
    std::printf("  prompt %5d: TTFT %.2f ms measured, %.2f ms modelled\n", p.prompt_len,
                p.measured_ttft_s * 1e3, p.modelled_ttft_s * 1e3);
  }
  std::printf("  TPOT %.2f ms measured, %.2f ms modelled (forward pass only)\n",
              cal.idle_tpot_s * 1e3, modelled_tpot * 1e3);
  std::printf(
      "real-system costs fed to the simulator (measured): fixed %.2f ms per request (HTTP, "
      "router, hand-over), %.4f ms per prompt token (KV transfer), %.3f ms per decode step "
      "per sequence (sampling, detokenising, streaming)\n",
      cal.overheads.fixed_s * 1e3, cal.overheads.per_token_s * 1e3, cal.overheads.decode_step_ms);
  return cal;
}

// The two instances as `pdserve up` runs them: engine policy, KV capacity of the default region.
std::vector<planner::InstanceConfig> Instances(const ValidateFlags& f, planner::StepCoeffs c,
                                               const Calibration& cal, int64_t kv_tokens) {
  // Sampling, detokenising and streaming are work per sequence in a step: the batch term.
  c.decode_small[2] += cal.overheads.decode_step_ms;
  c.decode_large[2] += cal.overheads.decode_step_ms;
  planner::InstanceConfig p;
  p.role = planner::Role::kPrefill;
  p.coeffs = c;
  p.policy.max_num_seqs = f.max_num_seqs;
  p.policy.max_num_batched_tokens = f.max_num_batched_tokens;
  p.policy.enable_chunked_prefill = true;
  p.policy.kv_capacity_tokens = kv_tokens;
  planner::InstanceConfig d = p;
  d.role = planner::Role::kDecode;
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

Result<planner::ComparisonRow> RunRate(const ValidateFlags& f, const bench::DatasetSpec& spec,
                                       double rate, const planner::Slo& slo,
                                       std::span<const planner::InstanceConfig> insts,
                                       const planner::ClusterLinks& links, const Calibration& cal) {
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
  ASSIGN_OR_RETURN(bench::BenchmarkSummary real, bench::RunBenchmark(bo));
  ASSIGN_OR_RETURN(auto measured, planner::MeasuredFromBenchJson(real.json, "bench result"));
  ASSIGN_OR_RETURN(auto reqs, BenchRequests(spec, n, rate, f.seed));
  planner::SimOptions so;
  so.slo = slo;
  so.first_token_on_decode = true;
#ifdef PD_PLANNER_HAS_ENGINE_SCHEDULER
  so.make_scheduler = planner::EngineSchedulerFactory();
#endif
  ASSIGN_OR_RETURN(planner::SimResult sim, planner::Simulate(insts, links, reqs, so));
  for (auto& r : sim.requests) {  // the fixed cost: on the way in and the first token's way out
    if (r.first_token_s >= 0) r.first_token_s += cal.overheads.fixed_s;
    if (r.finish_s >= 0) r.finish_s += cal.overheads.fixed_s;
  }
  planner::ComparisonRow row;
  row.rate = rate;
  row.simulated = planner::Summarize(sim.requests, slo);
  row.measured = planner::Summarize(measured, slo);
  return row;
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
  auto cal = Calibrate(f, *coeffs);
  if (!cal.ok()) return Fail(cal.status().ToString());
  planner::Slo slo{f.ttft_slo_s > 0 ? f.ttft_slo_s : 3 * cal->idle_ttft_s,
                   f.tpot_slo_s > 0 ? f.tpot_slo_s : 2 * cal->idle_tpot_s};
  const auto insts = Instances(f, *coeffs, *cal, kv_tokens);
  planner::ClusterLinks links;
  links.kv_bytes_per_token = kv_bytes_per_token;
  links.intra_node_bw =
      cal->overheads.per_token_s > 0 ? kv_bytes_per_token / cal->overheads.per_token_s : 1e18;
  std::vector<double> rates = f.rates;
  if (rates.empty()) {
    // Capacity: the slower of prefill (one mean prompt per step) and decode (a full batch).
    const double prefill_s =
        insts[0].coeffs.PrefillMs(f.input_len, double(f.input_len) * f.input_len) * 1e-3;
    const int b = std::min(f.max_num_seqs, 16);
    const double decode_s =
        insts[1].coeffs.DecodeMs(b, int64_t(b) * (f.input_len + f.output_len / 2)) * 1e-3;
    const double cap = std::min(1.0 / prefill_s, b / (decode_s * f.output_len));
    rates = {0.25 * cap, 0.5 * cap, 0.75 * cap};
  }
  bench::DatasetSpec spec;
  spec.name = "random";
  spec.random_input_len = f.input_len;
  spec.random_output_len = f.output_len;
  spec.random_range_ratio = f.range_ratio;
  std::vector<planner::ComparisonRow> rows;
  for (double rate : rates) {
    auto row = RunRate(f, spec, rate, slo, insts, links, *cal);
    if (!row.ok()) return Fail(row.status().ToString());
    rows.push_back(*row);
  }
  up.Stop();
  std::printf(
      "\n%s, 1 prefill + 1 decode, %d thread(s) each%s; random dataset %d/%d tokens (range "
      "%.2g), Poisson, seed %llu; SLO TTFT %.1f ms, TPOT %.1f ms\n",
      f.model.c_str(), f.threads, f.pin_cores ? ", pinned" : "", f.input_len, f.output_len,
      f.range_ratio, static_cast<unsigned long long>(f.seed), slo.ttft_s * 1e3, slo.tpot_s * 1e3);
  std::printf("%s", planner::FormatComparison(rows).c_str());
  if (!f.out.empty()) {
    nlohmann::json j = {{"model", f.model},
                        {"threads", f.threads},
                        {"slo", {{"ttft_s", slo.ttft_s}, {"tpot_s", slo.tpot_s}}},
                        {"overheads",
                         {{"fixed_s", cal->overheads.fixed_s},
                          {"per_token_s", cal->overheads.per_token_s},
                          {"decode_step_ms", cal->overheads.decode_step_ms}}},
                        {"rows", planner::ComparisonToJson(rows)}};
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
