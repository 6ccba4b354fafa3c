// pdserve bench: `vllm bench serve` for pdserve (or any OpenAI-compatible server).
//
//   pdserve bench --base-url http://127.0.0.1:8000 --dataset-name sharegpt-like --length-scale 0.1
//       --num-prompts 100 --request-rate 4 --goodput ttft:500 tpot:100 --save-result
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "apps/command.h"
#include "bench/rate_sweep.h"
#include "bench/runner.h"
#include "common/thread_util.h"

namespace pd::apps {
namespace {

constexpr const char* kDatasetHelp =
    "random | sharegpt-like | humaneval-like | longbench-like.\n"
    "random: --random-input-len/--random-output-len scaled by U[1-r,1+r] (r = "
    "--random-range-ratio).\n"
    "sharegpt-like: log-normal fits to DistServe's ShareGPT sample for OPT-13B\n"
    "  (data/distserve/sharegpt-opt13b-lengths.csv: prompt mean 759 / median 680,\n"
    "  output mean 186 / median 77 tokens).\n"
    "humaneval-like: log-normal around DistServe's (OSDI'24) reported HumanEval averages,\n"
    "  prompt ~171 / output ~98 tokens (code completion).\n"
    "longbench-like: log-normal around DistServe's reported LongBench averages,\n"
    "  prompt ~1738 / output ~90 tokens (summarization).\n"
    "The -like lengths are multiplied by --length-scale (to fit a CPU) and clamped to the\n"
    "server's max_model_len.\n"
    "prefix_repetition (vLLM's): --prefix-repetition-num-prefixes random prefixes of\n"
    "  --prefix-repetition-prefix-len tokens, each request one of them followed by\n"
    "  --prefix-repetition-suffix-len tokens of its own (a prefix cache's workload).\n"
    "multi_turn: conversations of --multi-turn-num-turns turns; each turn resends the\n"
    "  conversation so far (the earlier messages and the server's replies) and adds\n"
    "  --multi-turn-user-len tokens; --num-prompts counts the turns.";

struct BenchFlags {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model;
  std::string dataset_name = "random";
  int random_input_len = 1024;
  bench::PrefixRepetitionSpec prefix_repetition;
  bench::MultiTurnSpec multi_turn;
  int random_output_len = 128;
  double random_range_ratio = 0.0;
  double length_scale = 1.0;
  int num_prompts = 1000;
  std::string request_rate = "inf";
  double burstiness = 1.0;
  int max_concurrency = 0;
  uint64_t seed = 0;
  bool ignore_eos = false;
  std::vector<std::string> goodput;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  bool save_result = false;
  std::string result_filename;
  std::string result_dir = ".";
  std::string api_key;
  std::string cpus;  // empty: the client's threads run anywhere
  // Rate sweeps and the goodput search (bench/rate_sweep.h).
  std::vector<std::string> slo;             // NAME:VALUE with a unit
  std::vector<std::string> goodput_search;  // the SLOs of the search
  double attainment = -1;                   // < 0: not given (the search's target is 0.9)
  double precision = 0.05;
  double min_rate = 0;  // 0: the search's default floor
  int devices = 0;
  int warmup_requests = 2;
  double min_duration_s = 0;
};

// What RunBench does with the flags.
struct Plan {
  bench::BenchOptions bench;
  std::vector<double> rates;
  bool rates_document = false;  // a sweep or a search: the pdserve-bench-rates-v1 document
  bench::SweepOptions sweep;
  bool search = false;
  bench::GoodputSearchOptions search_options;
};

// A flag's value as the user wrote it, near enough ("1.5", not "1.500000").
std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "bench: %s\n", message.c_str());
  return 2;
}

// The benchmark's options from the flags; InvalidArgument names the flag that is wrong.
Result<bench::BenchOptions> MakeOptions(const BenchFlags& f) {
  bench::BenchOptions o;
  ASSIGN_OR_RETURN(o.endpoint, bench::ParseBaseUrl(f.base_url));
  o.endpoint.api_key = f.api_key;
  if (f.endpoint != "/v1/completions" && f.endpoint != "/v1/chat/completions")
    return InvalidArgument("--endpoint must be /v1/completions or /v1/chat/completions");
  o.endpoint_path = f.endpoint;
  o.model = f.model;
  o.dataset.name = f.dataset_name;
  o.dataset.random_input_len = f.random_input_len;
  o.dataset.random_output_len = f.random_output_len;
  o.dataset.random_range_ratio = f.random_range_ratio;
  o.dataset.length_scale = f.length_scale;
  o.prefix_repetition = f.prefix_repetition;
  o.multi_turn = f.multi_turn;
  if (f.num_prompts < 1) return InvalidArgument("--num-prompts must be at least 1");
  o.num_prompts = f.num_prompts;
  ASSIGN_OR_RETURN(std::vector<double> rates, bench::ParseRequestRates(f.request_rate));
  o.request_rate = rates.front();
  if (!(f.burstiness > 0)) return InvalidArgument("--burstiness must be positive");
  o.burstiness = f.burstiness;
  o.max_concurrency = f.max_concurrency;
  o.seed = f.seed;
  o.ignore_eos = f.ignore_eos;
  ASSIGN_OR_RETURN(o.goodput_ms, bench::ParseGoodput(f.goodput));
  ASSIGN_OR_RETURN(o.percentile_metrics, bench::ParseMetricNames(f.percentile_metrics));
  ASSIGN_OR_RETURN(o.metric_percentiles, bench::ParsePercentiles(f.metric_percentiles));
  if (!f.cpus.empty()) {
    auto cpus = ParseCpuList(f.cpus);
    if (!cpus.ok()) return InvalidArgument("--cpus: " + cpus.status().message());
    o.cpus = *cpus;
    RETURN_IF_ERROR(bench::CheckClientCpus(o.cpus));
  }
  return o;
}

// The sweep / search settings on top of MakeOptions'; InvalidArgument names the flag.
Result<Plan> MakePlan(const BenchFlags& f) {
  Plan p;
  ASSIGN_OR_RETURN(p.bench, MakeOptions(f));
  ASSIGN_OR_RETURN(p.rates, bench::ParseRequestRates(f.request_rate));
  if (f.attainment >= 0 && !(f.attainment > 0 && f.attainment <= 1))
    return InvalidArgument("--attainment must be in (0, 1], got " + Num(f.attainment));
  if (!(f.precision > 0 && f.precision < 1))
    return InvalidArgument("--precision must be in (0, 1), got " + Num(f.precision));
  if (f.devices < 0) return InvalidArgument("--devices must be positive");
  if (f.warmup_requests < 0) return InvalidArgument("--warmup-requests must not be negative");
  p.search = !f.goodput_search.empty();
  if (p.search && !f.slo.empty())
    return InvalidArgument("--slo and --goodput-search both give the SLOs: give them once");
  if (f.devices > 0 && !p.search) return InvalidArgument("--devices goes with --goodput-search");
  ASSIGN_OR_RETURN(p.sweep.slo_ms, p.search ? bench::ParseSlo("--goodput-search", f.goodput_search)
                                            : bench::ParseSlo("--slo", f.slo));
  p.rates_document = p.search || p.rates.size() > 1 || !f.slo.empty();
  p.sweep.bench = p.bench;
  p.sweep.warmup_requests = f.warmup_requests;
  if (!(f.min_duration_s >= 0)) return InvalidArgument("--min-duration must not be negative");
  p.sweep.min_duration_s = f.min_duration_s;
  p.sweep.attainment_target = f.attainment > 0 ? f.attainment : p.search ? 0.9 : 0;
  if (p.search) {
    if (p.rates.size() > 1)
      return InvalidArgument("--request-rate: --goodput-search takes one rate (where it starts)");
    p.search_options.attainment = p.sweep.attainment_target;
    p.search_options.precision = f.precision;
    p.search_options.start_rate = std::isinf(p.rates.front()) ? 1.0 : p.rates.front();
    p.search_options.max_rate = std::max(1e4, p.search_options.start_rate);
    if (f.min_rate != 0) {
      if (!(f.min_rate > 0 && f.min_rate <= p.search_options.start_rate))
        return InvalidArgument("--min-rate must be in (0, the start --request-rate], got " +
                               Num(f.min_rate));
      p.search_options.min_rate = f.min_rate;
    }
  } else if (f.min_rate != 0) {
    return InvalidArgument("--min-rate goes with --goodput-search");
  }
  return p;
}

// --save-result / --result-filename: the summary's JSON into --result-dir; 1 when it cannot be
// written.
int SaveResult(const BenchFlags& f, const nlohmann::json& json) {
  std::string name = f.result_filename;
  if (name.empty()) {
    std::string model = json.value("model_id", "model");
    for (char& c : model)
      if (c == '/') c = '-';
    const std::string what =
        json.contains("schema") ? json.value("mode", "rates") : f.request_rate + "qps";
    name = "pdserve-" + what + "-" + model + "-" + json.value("date", "now") + ".json";
  }
  const std::string path =
      f.result_dir.empty() || name.front() == '/' ? name : f.result_dir + "/" + name;
  std::ofstream out(path);
  out << json.dump(2) << "\n";
  if (!out) {
    std::fprintf(stderr, "bench: cannot write %s\n", path.c_str());
    return 1;
  }
  std::printf("saved results to %s\n", path.c_str());
  return 0;
}

// A sweep over the rates, or the goodput search: the table, and the rates document saved.
int RunRates(const BenchFlags& f, Plan& plan) {
  plan.sweep.on_rate = [](double rate) { std::fprintf(stderr, "bench: rate %g req/s\n", rate); };
  auto runner = bench::RateRunner::Create(plan.sweep);
  if (!runner.ok()) {
    std::fprintf(stderr, "bench: %s\n", runner.status().ToString().c_str());
    return runner.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  Result<bench::RatesReport> report =
      plan.search ? bench::RunGoodputSearch(runner->get(), plan.search_options, f.devices)
                  : bench::RunSweep(runner->get(), plan.rates);
  if (!report.ok()) {
    std::fprintf(stderr, "bench: %s\n", report.status().ToString().c_str());
    return 1;
  }
  std::fputs(report->text.c_str(), stdout);
  if (f.save_result || !f.result_filename.empty()) return SaveResult(f, report->json);
  return 0;
}

int RunBench(const BenchFlags& f) {
  // A server that sheds load closes connections we may still be writing to: that is a failed
  // request, not a reason to die.
  ::signal(SIGPIPE, SIG_IGN);
  auto plan = MakePlan(f);
  if (!plan.ok()) return Usage(plan.status().message());
  if (plan->rates_document) return RunRates(f, *plan);
  auto summary = bench::RunBenchmark(plan->bench);
  if (!summary.ok()) {
    std::fprintf(stderr, "bench: %s\n", summary.status().ToString().c_str());
    return 1;
  }
  std::fputs(summary->text.c_str(), stdout);
  if (f.save_result || !f.result_filename.empty()) return SaveResult(f, summary->json);
  return 0;
}

}  // namespace

PD_REGISTER_COMMAND(
    bench, "Benchmark an OpenAI-compatible server (like `vllm bench serve`)", [](CLI::App* app) {
      auto f = std::make_shared<BenchFlags>();
      app->add_option("--base-url", f->base_url, "server URL")->capture_default_str();
      app->add_option("--endpoint", f->endpoint, "/v1/completions | /v1/chat/completions")
          ->capture_default_str();
      app->add_option("--model", f->model, "model name (default: the server's)");
      app->add_option("--dataset-name", f->dataset_name, kDatasetHelp)->capture_default_str();
      app->add_option("--random-input-len", f->random_input_len, "random: prompt tokens")
          ->capture_default_str();
      app->add_option("--random-output-len", f->random_output_len, "random: output tokens")
          ->capture_default_str();
      app->add_option("--random-range-ratio", f->random_range_ratio,
                      "random: length spread in [0, 1)")
          ->capture_default_str();
      app->add_option("--length-scale", f->length_scale, "multiply -like dataset lengths by this")
          ->capture_default_str();
      app->add_option("--prefix-repetition-prefix-len", f->prefix_repetition.prefix_len,
                      "prefix_repetition: tokens of each shared prefix")
          ->capture_default_str();
      app->add_option("--prefix-repetition-suffix-len", f->prefix_repetition.suffix_len,
                      "prefix_repetition: tokens after the prefix, each request's own")
          ->capture_default_str();
      app->add_option("--prefix-repetition-num-prefixes", f->prefix_repetition.num_prefixes,
                      "prefix_repetition: distinct prefixes")
          ->capture_default_str();
      app->add_option("--prefix-repetition-output-len", f->prefix_repetition.output_len,
                      "prefix_repetition: output tokens")
          ->capture_default_str();
      app->add_option("--multi-turn-num-turns", f->multi_turn.num_turns,
                      "multi_turn: turns per conversation")
          ->capture_default_str();
      app->add_option("--multi-turn-user-len", f->multi_turn.user_len,
                      "multi_turn: tokens of each new user message")
          ->capture_default_str();
      app->add_option("--multi-turn-output-len", f->multi_turn.output_len,
                      "multi_turn: output tokens per turn")
          ->capture_default_str();
      app->add_option("--num-prompts", f->num_prompts, "requests to send")->capture_default_str();
      app->add_option("--request-rate", f->request_rate,
                      "requests per second, or inf (all at once); a list (1,2,4,inf) sweeps the "
                      "rates in turn; with --goodput-search, the rate it starts from (default 1)")
          ->capture_default_str();
      app->add_option("--burstiness", f->burstiness, "gamma shape of arrivals (1: Poisson)")
          ->capture_default_str();
      app->add_option("--max-concurrency", f->max_concurrency,
                      "requests in flight at most (0: no limit)")
          ->capture_default_str();
      app->add_option("--seed", f->seed, "random seed")->capture_default_str();
      app->add_flag("--ignore-eos", f->ignore_eos, "generate exactly the sampled output lengths");
      app->add_option("--goodput", f->goodput,
                      "SLOs as NAME:MS pairs, e.g. ttft:500 tpot:100 (e2el too)");
      app->add_option("--percentile-metrics", f->percentile_metrics, "ttft,tpot,itl,e2el")
          ->capture_default_str();
      app->add_option("--metric-percentiles", f->metric_percentiles, "e.g. 50,90,99")
          ->capture_default_str();
      app->add_flag("--save-result", f->save_result, "save the results as JSON");
      app->add_option("--result-filename", f->result_filename,
                      "JSON file name (implies --save-result)");
      app->add_option("--result-dir", f->result_dir, "directory for the JSON file")
          ->capture_default_str();
      app->add_option("--api-key", f->api_key, "sent as 'Authorization: Bearer KEY'");
      app->add_option("--cpus", f->cpus,
                      "CPUs the client's request threads run on, e.g. 0 or 2-3 (default: any); "
                      "keeps the client off the cores the servers compute on");
      app->add_option("--slo", f->slo,
                      "SLOs with units for the per-rate attainment, e.g. ttft:500ms tpot:100ms "
                      "(ttft | tpot | e2el; ms | s); writes the rates document")
          ->expected(1, 3);
      app->add_option("--goodput-search", f->goodput_search,
                      "find the highest rate whose attainment of these SLOs reaches "
                      "--attainment, e.g. ttft:500ms tpot:100ms: doubling or halving from the "
                      "start rate to a bracket, then bisection to --precision")
          ->expected(1, 3);
      app->add_option("--attainment", f->attainment,
                      "attainment target in (0, 1] (default 0.9 for --goodput-search)");
      app->add_option("--precision", f->precision,
                      "goodput search: stop when the bracket is narrower than this share of its "
                      "low end")
          ->capture_default_str();
      app->add_option("--min-rate", f->min_rate,
                      "goodput search: halving stops below this rate (req/s) and the goodput is "
                      "reported as 0 (default 0.001)");
      app->add_option(
          "--devices", f->devices,
          "goodput search: devices (cores) the deployment uses, for goodput per device");
      app->add_option("--warmup-requests", f->warmup_requests,
                      "sweep / search: requests sent before each rate, not counted")
          ->capture_default_str();
      app->add_option("--min-duration", f->min_duration_s,
                      "sweep / search: seconds of arrivals per rate at least (more requests than "
                      "--num-prompts at high rates; 0: --num-prompts)")
          ->capture_default_str();
      return [f] { return RunBench(*f); };
    });

}  // namespace pd::apps
