#include "planner/validate_sim.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench/datasets.h"
#include "bench/runner.h"
#include "common/file_util.h"
#include "common/subprocess.h"
#include "common/thread_util.h"
#include "common/trace.h"
#include "common/trace_reader.h"
#include "model/config.h"
#include "planner/latency_model.h"
#include "planner/validate_calibration.h"
#include "planner/validate_probes.h"

namespace pd::planner {
namespace {

constexpr int kPreRoundProbeSets = 3;
constexpr int kLoadRunPrompts = 300;
constexpr int64_t kTraceMaxEvents = 8'000'000;  // five 600-request rounds trace ~1.6 M
constexpr double kCellTolerance = 0.10;
constexpr double kSecondsPerRound = 60;  // requests per round: the rate x this, at most max_prompts

// A calibration run: at least 100 requests, and a rate's runs together as many as a round.
int CalRunPrompts(const ValidateSimOptions& o) {
  return std::max(100, (o.max_prompts + o.rounds - 1) / o.rounds);
}
int PromptsAt(const ValidateSimOptions& o, double rate) {
  return std::clamp(static_cast<int>(rate * kSecondsPerRound), 20, o.max_prompts);
}

// `pdserve up` as a child process, stopped (SIGTERM, then SIGKILL after 15 s) when it goes.
class UpProcess {
 public:
  ~UpProcess() { Stop(); }
  Status Start(const ValidateSimOptions& o) {
    SubprocessOptions so;
    so.path = "/proc/self/exe";
    so.argv = {"pdserve", "up",    "--prefill", "1",      "--decode", "1",
               "--model", o.model, "--matmul",  o.matmul, "--trace",  o.trace};
    const auto add = [&so](const char* flag, int64_t v) {
      so.argv.insert(so.argv.end(), {flag, std::to_string(v)});
    };
    add("--threads", o.threads);
    add("--port", o.port);
    add("--max-num-seqs", o.max_num_seqs);
    add("--max-num-batched-tokens", o.max_num_batched_tokens);
    add("--trace-max-events", kTraceMaxEvents);
    if (o.pin_cores) so.argv.insert(so.argv.end(), {"--pin-cores", "--pin-whole-instances"});
    // The simulator sends every prompt to the prefill instance: so does the deployment it is
    // checked against (no short prompt computed on the decode instance).
    add("--local-prefill-max-tokens", -1);
    so.die_with_parent = true;
    const int log = open(o.up_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log < 0) return IoError(o.up_log + ": " + std::strerror(errno));
    so.stdout_fd = log;
    so.stderr_fd = log;
    Result<Subprocess> child = Subprocess::Spawn(so);
    close(log);
    if (!child.ok()) return child.status();
    child_ = std::move(child).value();
    bench::Endpoint ep;
    ep.port = o.port;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    while (std::chrono::steady_clock::now() < end) {
      ASSIGN_OR_RETURN(const std::optional<ExitStatus> exited, child_.Poll());
      if (exited.has_value()) {
        return Unavailable("pdserve up " + exited->ToString() + " during start-up; see " +
                           o.up_log);
      }
      if (bench::GetServerInfo(ep).ok()) return OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return DeadlineExceeded("pdserve up did not answer within 300 s; see " + o.up_log);
  }
  void Stop() {
    if (child_.running()) (void)child_.Terminate(std::chrono::seconds(15));
  }
  pid_t pid() const { return child_.pid(); }

 private:
  Subprocess child_;
};

bench::DatasetSpec SpecOf(const ValidateSimOptions& o) {
  bench::DatasetSpec spec;
  spec.name = "random";
  spec.random_input_len = o.input_len;
  spec.random_output_len = o.output_len;
  spec.random_range_ratio = o.range_ratio;
  return spec;
}

// The bench's requests regenerated with its own generators: the simulated side's.
Result<std::vector<SimRequest>> BenchRequests(const ValidateSimOptions& o, int n, double rate,
                                              uint64_t seed) {
  ASSIGN_OR_RETURN(std::vector<bench::LengthPair> lengths,
                   bench::SampleLengths(SpecOf(o), n, seed));
  const std::vector<double> arrivals = bench::ArrivalTimes(n, rate, 1.0, seed);
  std::vector<SimRequest> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({i, arrivals[i], lengths[i].prompt_len, lengths[i].output_len});
  }
  return out;
}

// One bench run against the deployment, its window on the traces' clock.
struct BenchRun {
  double rate = 0;
  int n = 0;
  uint64_t seed = 0;
  double begin_s = 0, end_s = 0;
  Summary measured;
  std::vector<ClientRequest> client;  // empty when a request failed
};
Result<BenchRun> RunBench(const ValidateSimOptions& o, int n, double rate, uint64_t seed,
                          const Slo& slo) {
  bench::BenchOptions bo;
  bo.endpoint.port = o.port;
  bo.dataset = SpecOf(o);
  bo.num_prompts = n;
  bo.request_rate = rate;
  bo.seed = seed;
  bo.ignore_eos = true;
  BenchRun run;
  run.rate = rate;
  run.n = n;
  run.seed = seed;
  run.begin_s = Tracer::NowNs() * 1e-9;
  ASSIGN_OR_RETURN(bench::BenchmarkSummary b, bench::RunBenchmark(bo));
  run.end_s = Tracer::NowNs() * 1e-9;
  ASSIGN_OR_RETURN(std::vector<RequestResult> results, MeasuredFromBenchJson(b.json, "bench"));
  run.measured = Summarize(results, slo);
  const nlohmann::json& lens = b.json["input_lens"];
  if (b.json.value("failed", 0) == 0 && lens.is_array() && lens.size() == results.size()) {
    const std::vector<double> arrivals = bench::ArrivalTimes(n, rate, 1.0, seed);
    for (size_t i = 0; i < results.size(); ++i) {
      run.client.push_back({arrivals[i], lens[i].get<int>(), results[i].first_token_s,
                            results[i].finish_s - results[i].first_token_s});
    }
  }
  return run;
}

// The rate at which the prefill instance (or the decode one, whichever first) is busy all the
// time: mean prompts, co-run steps, and the share of its core the client and router take.
double Capacity(const ValidateSimOptions& o, const StepCoeffs& m, const ProbeCalibration& c) {
  const RealOverheads& ov = c.overheads;
  const double shared = c.client_cpu_s / std::max<size_t>(1, CurrentThreadCpus().size());
  const double prefill_s =
      m.PrefillMs(o.input_len, double(o.input_len) * o.input_len) * 1e-3 * ov.prefill_scale;
  const int b = std::min(o.max_num_seqs, 16);
  const double step_s = m.DecodeMs(b, int64_t(b) * (o.input_len + o.output_len / 2)) * 1e-3 +
                        (ov.decode_fixed_ms + b * ov.decode_seq_ms) * 1e-3;
  return 1.0 / std::max(prefill_s * ov.corun_prefill + shared,
                        step_s * ov.corun_decode * o.output_len / b + shared);
}

// One rate: per round its calibration run (run k just before round k) and the round, then each
// run's calibration and the paired comparison.
struct RateResult {
  double rate = 0;
  std::vector<BenchRun> cal_runs, rounds;
  std::vector<RunCalibration> run_cals;
  std::vector<ComparisonRow> round_rows;
  ComparisonRow paired;  // per metric the median over the rounds of each side
};

// The traces read once: every request and step (co-run marked) of both instances.
struct Traces {
  std::vector<TracedRequest> requests;
  std::vector<StepRecord> prefill_steps, decode_steps;
};
Result<Traces> ReadTraces(const std::string& path) {
  std::vector<TraceEvent> events[2];
  const char* names[] = {"prefill0", "decode0"};
  for (int k = 0; k < 2; ++k) {
    const std::string file = TracePathFor(path, names[k]);
    ASSIGN_OR_RETURN(const std::string text, ReadFileToString(file));
    ASSIGN_OR_RETURN(events[k], ParseTraceEvents(text));
    const uint64_t dropped = TraceDroppedEvents(text).value_or(0);
    if (dropped > 0) {
      std::printf("WARNING: %s dropped %llu events; the runs after its last one lack figures\n",
                  file.c_str(), static_cast<unsigned long long>(dropped));
    }
  }
  Traces t;
  t.requests = TracedRequests(events[0], events[1]);
  ASSIGN_OR_RETURN(t.prefill_steps, EngineSteps(events[0]));
  ASSIGN_OR_RETURN(t.decode_steps, EngineSteps(events[1]));
  MarkCorun(t.decode_steps, t.prefill_steps);
  return t;
}

// What the comparison needs besides the options: the model, the probes' calibration, the KV.
struct Setup {
  StepCoeffs model;
  Calibration probes;
  SchedPolicy policy;
  double kv_bytes_per_token = 0;
  Slo slo;
};

Result<SimResult> Simulate(const ValidateSimOptions& o, const Setup& s, const Calibration& cal,
                           const BenchRun& run, bool record_steps) {
  ASSIGN_OR_RETURN(const auto reqs, BenchRequests(o, run.n, run.rate, run.seed));
  const auto insts = CalibratedInstances(s.model, cal, s.policy);
  return SimulateCalibrated(insts, CalibratedLinks(s.kv_bytes_per_token, cal.overheads), reqs,
                            cal.outside, record_steps);
}

// Each calibration run's figures, each round simulated with its run's (the paired rule).
// A traced bench run's figures (CalibrateRun against its requests simulated with the probes').
Result<RunCalibration> CalibrateBenchRun(const ValidateSimOptions& o, const Setup& s,
                                         const Traces& t, const BenchRun& run) {
  const auto start = &StepRecord::start_s;
  const TracedRun traced{InWindow(t.prefill_steps, start, run.begin_s, run.end_s),
                         InWindow(t.decode_steps, start, run.begin_s, run.end_s),
                         InWindow(t.requests, &TracedRequest::sent_s, run.begin_s, run.end_s),
                         run.client};
  ASSIGN_OR_RETURN(const SimResult unstretched, Simulate(o, s, s.probes, run, true));
  const double fixed_s =
      (s.model.decode_small[0] + s.probes.overheads.decode_fixed_ms + s.model.overhead_ms) * 1e-3;
  return CalibrateRun(traced, unstretched, fixed_s);
}

// Each round simulated with the figures of the calibration run just before it (the paired
// rule); a figure that run could not give, the load run's (`base`), else the probes'.
Status CompareRate(const ValidateSimOptions& o, const Setup& s, const Traces& t,
                   const Calibration& base, RateResult* r) {
  std::vector<Summary> simulated, measured;
  for (size_t k = 0; k < r->rounds.size(); ++k) {
    ASSIGN_OR_RETURN(RunCalibration run, CalibrateBenchRun(o, s, t, r->cal_runs[k]));
    r->run_cals.push_back(std::move(run));
    const Calibration cal = WithRun(base, r->run_cals.back(), o.corun, o.seed);
    ASSIGN_OR_RETURN(const SimResult sim, Simulate(o, s, cal, r->rounds[k], false));
    simulated.push_back(Summarize(sim.requests, s.slo));
    measured.push_back(r->rounds[k].measured);
    r->round_rows.push_back({r->rate, simulated.back(), measured.back()});
  }
  r->paired = {r->rate, MedianSummary(simulated), MedianSummary(measured)};
  return OkStatus();
}

// A run's figures; null where it gave none.
nlohmann::json RunJson(const RunCalibration& c) {
  using nlohmann::json;
  const auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(); };
  const std::vector<double>& o = c.outside.outside_s;
  return {{"prefill_stretch", opt(c.prefill_stretch)},
          {"prefill_loop_gap_s", opt(c.prefill_loop_gap_s)},
          {"kv_ready_fraction", opt(c.kv_ready_fraction)},
          {"decode_step_stretch", c.decode ? json(c.decode->step_stretch) : json()},
          {"decode_seq_stretch", c.decode ? json(c.decode->seq_stretch) : json()},
          {"decode_corun", c.decode ? json(c.decode->corun) : json()},
          {"decode_step_factors", c.decode_step_factors.size()},
          {"outside_p50_s", o.empty() ? json() : json(Percentile(o, 0.5))},
          {"outside_p90_s", o.empty() ? json() : json(Percentile(o, 0.9))}};
}

// Prints the comparison and returns its JSON.
nlohmann::json Report(const Setup& s, const ProbeCalibration& pc, const std::string& rate_rule,
                      const std::vector<RateResult>& results) {
  std::vector<ComparisonRow> rows;
  nlohmann::json rates = nlohmann::json::array();
  for (const RateResult& r : results) {
    nlohmann::json runs = nlohmann::json::array();
    std::vector<Summary> measured;
    for (size_t k = 0; k < r.rounds.size(); ++k) {
      runs.push_back(RunJson(r.run_cals[k]));
      measured.push_back(r.rounds[k].measured);
    }
    const Summary m = RelativeSpread(measured);
    std::printf(
        "\nrounds 1-%zu at %.3g req/s, each simulated with the calibration run before it:\n%s"
        "the rounds' spread (the machine): att %.0f%%, TTFT p50 %.0f%% p90 %.0f%%, TPOT p50 %.0f%% "
        "p90 %.0f%%\ntheir calibration runs: %s\n",
        r.rounds.size(), r.rate, FormatComparison(r.round_rows).c_str(), 100 * m.attainment,
        100 * m.ttft_p50_s, 100 * m.ttft_p90_s, 100 * m.tpot_p50_s, 100 * m.tpot_p90_s,
        runs.dump().c_str());
    rows.push_back(r.paired);
    rates.push_back(
        {{"rate", r.rate}, {"rounds", ComparisonToJson(r.round_rows)}, {"calibration_runs", runs}});
  }
  const RealOverheads& ov = pc.overheads;
  nlohmann::json probes;
  for (const auto& [key, v] : std::initializer_list<std::pair<const char*, double>>{
           {"idle_ttft_s", pc.idle_ttft_s},
           {"idle_tpot_s", pc.idle_tpot_s},
           {"batch_tpot_s", pc.batch_tpot_s},
           {"client_router_cpu_s", pc.client_cpu_s},
           {"prefill_scale", ov.prefill_scale},
           {"fixed_s", ov.fixed_s},
           {"decode_fixed_ms", ov.decode_fixed_ms},
           {"decode_seq_ms", ov.decode_seq_ms},
           {"transfer_s_per_token", ov.transfer_s_per_token},
           {"corun_prefill", ov.corun_prefill},
           {"corun_decode", ov.corun_decode}}) {
    probes[key] = v;
  }
  std::printf(
      "\nprobes (median of the probe sets): %s\nSLO: TTFT %.2f ms, TPOT %.3f ms; %s\nthe paired "
      "rule: each round simulated with the calibration run just before it; per metric the median "
      "over the rounds:\n%s",
      probes.dump().c_str(), s.slo.ttft_s * 1e3, s.slo.tpot_s * 1e3, rate_rule.c_str(),
      FormatComparison(rows).c_str());
  const int cells = CellsWithin(rows, kCellTolerance);
  std::printf("cells within %.0f%%: %d of %zu\n", 100 * kCellTolerance, cells, 5 * rows.size());
  return {{"slo", {{"ttft_s", s.slo.ttft_s}, {"tpot_s", s.slo.tpot_s}}},
          {"rate_rule", rate_rule},
          {"probes", probes},
          {"comparison", ComparisonToJson(rows)},
          {"cells_within_10pct", cells},
          {"rates", rates}};
}

// The rates: given, or 20/40/60% of the median of the pre-round probe sets' capacities (near
// capacity a slower spell of the machine saturates a rate, and its rounds disagree far more than
// any model error).
Result<std::vector<double>> ChooseRates(const ValidateSimOptions& o, const StepCoeffs& model,
                                        const std::vector<ProbeSet>& sets, std::string* rule) {
  *rule = "rates given";
  if (!o.rates.empty()) return o.rates;
  std::vector<double> caps;
  for (const ProbeSet& set : sets) {
    ASSIGN_OR_RETURN(const ProbeCalibration one, CombineProbes({set}));
    caps.push_back(Capacity(o, model, one));
  }
  const double cap = UpperMedian(caps);
  *rule = "rates 20/40/60% of the calibrated capacity " + std::to_string(cap) + " req/s";
  return std::vector<double>{0.2 * cap, 0.4 * cap, 0.6 * cap};
}

}  // namespace

Status RunValidateSim(const ValidateSimOptions& o) {
  if (o.profile.empty()) return InvalidArgument("--profile: a latency model from pdserve profile");
  if (o.threads < 1 || o.input_len < 2 || o.output_len < 2 || o.rounds < 1 || o.max_prompts < 20) {
    return InvalidArgument(
        "--threads >= 1, --input-len and --output-len >= 2, --rounds >= 1, "
        "--max-prompts >= 20");
  }
  Setup s;
  ASSIGN_OR_RETURN(const auto profile, LoadProfile(o.profile, ""));
  ASSIGN_OR_RETURN(s.model, profile->Coeffs(1));
  ASSIGN_OR_RETURN(const model::ModelConfig mc, model::LoadModelConfig(o.model));
  // The serve default: an f32 KV region of 256 MiB.
  s.kv_bytes_per_token = 2.0 * 4 * mc.num_layers * mc.num_kv_heads * mc.head_dim;
  s.policy.kv_capacity_tokens = static_cast<int64_t>((256ull << 20) / s.kv_bytes_per_token);
  s.policy.max_num_seqs = o.max_num_seqs;
  s.policy.max_num_batched_tokens = o.max_num_batched_tokens;
  s.policy.enable_chunked_prefill = true;

  UpProcess up;
  RETURN_IF_ERROR(up.Start(o));
  ASSIGN_OR_RETURN(const Deployment dep, FindInstances(up.pid()));
  // Warm the KV pages, caches and connections as the rounds will find them.
  RETURN_IF_ERROR(RunBench(o, 60, 20, o.seed + 7919, {1e9, 1e9}).status());  // 60 at 20 req/s
  std::vector<ProbeSet> sets;
  for (int k = 0; k < kPreRoundProbeSets; ++k) {
    ASSIGN_OR_RETURN(ProbeSet set, RunProbes(o, s.model, dep, k));
    sets.push_back(std::move(set));
  }
  ASSIGN_OR_RETURN(const ProbeCalibration pre, CombineProbes(sets));
  s.slo = {o.ttft_slo_s > 0 ? o.ttft_slo_s : 3 * pre.idle_ttft_s,
           o.tpot_slo_s > 0 ? o.tpot_slo_s : pre.batch_tpot_s};
  std::string rate_rule;
  ASSIGN_OR_RETURN(const std::vector<double> rates, ChooseRates(o, s.model, sets, &rate_rule));
  // The load run: the highest rate, before the rounds (not compared), for the figures a round's
  // own calibration run cannot give.
  ASSIGN_OR_RETURN(const BenchRun load,
                   RunBench(o, kLoadRunPrompts, rates.back(), o.seed + 104729, s.slo));
  std::vector<RateResult> results(rates.size());
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t i = 0; i < rates.size(); ++i) {
      results[i].rate = rates[i];
      std::fprintf(stderr, "validate-sim: round %d, %.3g req/s\n", round + 1, rates[i]);
      ASSIGN_OR_RETURN(BenchRun cal, RunBench(o, CalRunPrompts(o), rates[i],
                                              o.seed + 104729 + 1009ull * (round + 1), s.slo));
      results[i].cal_runs.push_back(std::move(cal));
      ASSIGN_OR_RETURN(BenchRun r, RunBench(o, PromptsAt(o, rates[i]), rates[i], o.seed, s.slo));
      results[i].rounds.push_back(std::move(r));
    }
    ASSIGN_OR_RETURN(ProbeSet set, RunProbes(o, s.model, dep, kPreRoundProbeSets + round));
    sets.push_back(std::move(set));
  }
  up.Stop();
  ASSIGN_OR_RETURN(const ProbeCalibration pc, CombineProbes(sets));
  s.probes.overheads = pc.overheads;
  s.probes.outside = OutsideLatency::Constant(pc.overheads.fixed_s);
  ASSIGN_OR_RETURN(const Traces traces, ReadTraces(o.trace));
  ASSIGN_OR_RETURN(const RunCalibration load_cal, CalibrateBenchRun(o, s, traces, load));
  const Calibration base = WithRun(s.probes, load_cal, o.corun, o.seed);
  for (RateResult& r : results) RETURN_IF_ERROR(CompareRate(o, s, traces, base, &r));
  std::printf("\nthe load run (%d requests at %.3g req/s): %s\n", load.n, load.rate,
              RunJson(load_cal).dump().c_str());
  nlohmann::json report = Report(s, pc, rate_rule, results);
  report["load_run"] = RunJson(load_cal);
  if (o.out.empty()) return OkStatus();
  return WriteStringToFile(o.out, report.dump(2) + "\n");
}

}  // namespace pd::planner
