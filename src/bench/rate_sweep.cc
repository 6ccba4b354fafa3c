#include "bench/rate_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

namespace pd::bench {

using json = nlohmann::json;

namespace {

// Summarize's per-request arrays and run settings: per rate, only the figures stay.
constexpr const char* kPerRunFields[] = {"date",
                                         "backend",
                                         "model_id",
                                         "tokenizer_id",
                                         "endpoint",
                                         "dataset_name",
                                         "input_lens",
                                         "output_lens",
                                         "ttfts",
                                         "itls",
                                         "client_run_delays_to_first_token",
                                         "client_cpus_at_first_token",
                                         "first_token_steady_times",
                                         "burstiness",
                                         "max_concurrency",
                                         "host",
                                         "slo_ms"};
constexpr size_t kErrorsKept = 5;

json RateJson(double rate) { return std::isinf(rate) ? json("inf") : json(rate); }

std::string RateText(double rate) {
  char buf[32];
  if (std::isinf(rate)) return "inf";
  std::snprintf(buf, sizeof(buf), "%.4g", rate);
  return buf;
}

std::string AttainmentText(const json& v) {
  if (v.is_null()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * v.get<double>());
  return buf;
}

std::string TableRow(const RatePoint& p) {
  const json& e = p.entry;
  const json& a = e["attainment"];
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-10s %6d %8.2f %9s %9s %9s %9.1f %9.1f %9.2f %9.2f\n",
                RateText(p.rate).c_str(), e.value("completed", 0),
                e.value("request_throughput", 0.0), AttainmentText(a["ttft"]).c_str(),
                AttainmentText(a["tpot"]).c_str(), AttainmentText(a["both"]).c_str(),
                e.value("median_ttft_ms", 0.0), e.value("p99_ttft_ms", 0.0),
                e.value("median_tpot_ms", 0.0), e.value("p99_tpot_ms", 0.0));
  return buf;
}

}  // namespace

Result<std::unique_ptr<RateRunner>> RateRunner::Create(const SweepOptions& options) {
  SweepOptions o = options;
  if (o.bench.goodput_ms.empty()) o.bench.goodput_ms = o.slo_ms;
  for (double p : {50.0, 90.0, 99.0}) {
    auto& ps = o.bench.metric_percentiles;
    if (std::find(ps.begin(), ps.end(), p) == ps.end()) ps.push_back(p);
  }
  if (o.warmup_requests < 0) return InvalidArgument("--warmup-requests must not be negative");
  ASSIGN_OR_RETURN(PreparedRequests prepared, PrepareRequests(o.bench));
  return std::unique_ptr<RateRunner>(new RateRunner(std::move(o), std::move(prepared)));
}

Result<RatePoint> RateRunner::Run(double rate) {
  BenchOptions b = options_.bench;
  if (options_.min_duration_s > 0 && !std::isinf(rate) && rate > 0) {
    const double want =
        std::min<double>(options_.max_prompts, std::ceil(rate * options_.min_duration_s));
    b.num_prompts = std::max(b.num_prompts, static_cast<int>(want));
  }
  if (static_cast<size_t>(b.num_prompts) > prepared_.requests.size()) {
    // More requests (the same seed: the ones already sent come first again).
    ASSIGN_OR_RETURN(prepared_, PrepareRequests(b));
  }
  const std::vector<GenerationRequest> requests(prepared_.requests.begin(),
                                                prepared_.requests.begin() + b.num_prompts);
  if (options_.on_rate) options_.on_rate(rate);
  const size_t warm = std::min<size_t>(options_.warmup_requests, prepared_.requests.size());
  if (warm > 0) {
    const std::vector<GenerationRequest> warmup(prepared_.requests.begin(),
                                                prepared_.requests.begin() + warm);
    (void)SendAtRate(b, warmup, rate);  // not counted; returns once all completed
  }
  const SentRequests sent = SendAtRate(b, requests, rate);  // the cool-down: all done
  RatePoint p;
  p.rate = rate > 0 ? rate : INFINITY;
  p.attainment = ComputeAttainment(sent.results, options_.slo_ms);
  const BenchmarkSummary s =
      Summarize(MakeRunInfo(b, prepared_.model, rate, sent.duration_s), sent.results,
                b.percentile_metrics, b.metric_percentiles, b.goodput_ms);
  json e = s.json;
  json errors = json::array();
  for (size_t i = 0; i < e["errors"].size() && i < kErrorsKept; ++i)
    errors.push_back(e["errors"][i]);
  for (const char* f : kPerRunFields) e.erase(f);
  e["errors"] = errors;  // the first few
  e["request_rate"] = RateJson(p.rate);
  e["order"] = runs_++;
  e["attainment"] = AttainmentJson(p.attainment);
  if (options_.attainment_target > 0)
    e["meets_target"] = p.attainment.both >= options_.attainment_target - 1e-12;
  p.entry = std::move(e);
  return p;
}

RatesReport MakeRatesReport(const SweepOptions& o, const std::string& model,
                            const std::string& mode, std::vector<RatePoint> points) {
  std::stable_sort(points.begin(), points.end(),
                   [](const RatePoint& a, const RatePoint& b) { return a.rate < b.rate; });
  RatesReport r;
  json& j = r.json;
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y%m%d-%H%M%S", std::localtime(&now));
  j["schema"] = "pdserve-bench-rates-v1";
  j["mode"] = mode;
  j["date"] = date;
  j["backend"] = "openai";
  j["model_id"] = model;
  j["endpoint"] = o.bench.endpoint_path;
  j["dataset_name"] = o.bench.dataset.name;
  j["num_prompts"] = o.bench.num_prompts;  // per rate at least; each entry has its own
  j["min_duration_s"] = o.min_duration_s;
  j["warmup_requests"] = o.warmup_requests;
  j["burstiness"] = o.bench.burstiness;
  j["max_concurrency"] =
      o.bench.max_concurrency > 0 ? json(o.bench.max_concurrency) : json(nullptr);
  j["seed"] = o.bench.seed;
  j["slo_ms"] = o.slo_ms;
  j["host"] = HostDescription();
  j["attainment_target"] = o.attainment_target > 0 ? json(o.attainment_target) : json(nullptr);
  j["rates"] = json::array();
  char header[256];
  std::snprintf(header, sizeof(header), "%-10s %6s %8s %9s %9s %9s %9s %9s %9s %9s\n", "rate",
                "done", "req/s", "att TTFT", "att TPOT", "att both", "TTFT p50", "TTFT p99",
                "TPOT p50", "TPOT p99");
  r.text = header;
  for (const RatePoint& p : points) {
    j["rates"].push_back(p.entry);
    r.text += TableRow(p);
  }
  return r;
}

namespace {

// The sampled lengths of the requests every rate sent (the same at each): a simulator's workload.
void AddLengths(const std::vector<GenerationRequest>& requests, json* j) {
  json prompt = json::array(), output = json::array();
  for (const GenerationRequest& r : requests) {
    prompt.push_back(r.prompt_len);
    output.push_back(r.max_tokens);
  }
  (*j)["prompt_lens"] = std::move(prompt);
  (*j)["output_lens"] = std::move(output);
}

}  // namespace

Result<RatesReport> RunSweep(RateRunner* runner, const std::vector<double>& rates) {
  std::vector<RatePoint> points;
  for (double rate : rates) {
    ASSIGN_OR_RETURN(RatePoint p, runner->Run(rate));
    points.push_back(std::move(p));
  }
  RatesReport r = MakeRatesReport(runner->options(), runner->model(), "sweep", std::move(points));
  AddLengths(runner->requests(), &r.json);
  return r;
}

Result<RatesReport> RunGoodputSearch(RateRunner* runner, const GoodputSearchOptions& search,
                                     int devices) {
  std::vector<RatePoint> points;
  auto measure = [&](double rate) -> Result<double> {
    ASSIGN_OR_RETURN(RatePoint p, runner->Run(rate));
    points.push_back(std::move(p));
    return points.back().attainment.both;
  };
  ASSIGN_OR_RETURN(GoodputSearchResult g, SearchGoodput(search, measure));
  RatesReport r =
      MakeRatesReport(runner->options(), runner->model(), "goodput-search", std::move(points));
  json gj;
  gj["goodput"] = g.goodput;
  gj["upper"] = g.upper > 0 ? json(g.upper) : json(nullptr);
  gj["bracketed"] = g.bracketed;
  gj["monotone"] = g.monotone;
  gj["attainment_target"] = search.attainment;
  gj["precision"] = search.precision;
  gj["start_rate"] = search.start_rate;
  gj["probes"] = g.curve.size();
  gj["devices"] = devices > 0 ? json(devices) : json(nullptr);
  gj["goodput_per_device"] = devices > 0 ? json(g.goodput / devices) : json(nullptr);
  r.json["goodput"] = gj;
  AddLengths(runner->requests(), &r.json);
  char line[256];
  std::snprintf(line, sizeof(line), "goodput at %.0f%% attainment: %.4g req/s",
                100 * search.attainment, g.goodput);
  r.text += line;
  if (devices > 0) {
    std::snprintf(line, sizeof(line), " (%.4g req/s per device, %d devices)", g.goodput / devices,
                  devices);
    r.text += line;
  }
  if (g.bracketed) {
    std::snprintf(line, sizeof(line), "; missed at %.4g req/s", g.upper);
    r.text += line;
  } else {
    r.text += g.goodput > 0 ? "; never missed up to the search's highest rate"
                            : "; missed even at the search's lowest rate";
  }
  if (!g.monotone) r.text += "; the curve is not monotone (noise): see the rates";
  r.text += "\n";
  return r;
}

}  // namespace pd::bench
