// Results of a benchmark run, computed like `vllm bench serve`: per-request TTFT, TPOT, ITL and
// E2EL, their mean / median / std / percentiles in milliseconds, throughputs, goodput and SLO
// attainment; printed as vLLM prints them and saved as JSON with vLLM's field names.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace pd::bench {

// What one request measured (seconds), from the SSE stream.
struct RequestResult {
  bool success = false;
  int http_status = 0;
  std::string error;
  int prompt_len = 0;  // from the server's usage when it sent one
  int output_len = 0;
  double ttft = 0;          // send -> first token
  double latency = 0;       // send -> last byte
  std::vector<double> itl;  // gaps between streamed chunks after the first
  double start_time = 0;    // seconds since the benchmark started
  // Where the client's reader thread was when the first token arrived (diagnostics, Linux; -1
  // when unknown): the time it spent runnable but waiting for a CPU between reading the response
  // headers and reading that token (schedstat's run delay, seconds: mostly its wake-up for the
  // token, as a server sends the headers first), and the CPU it read it on.
  double client_run_delay_to_first = -1;
  int client_cpu_at_first = -1;
  // When the first token was read, on the steady clock (seconds since boot, CLOCK_MONOTONIC as in
  // pdserve's --trace files, so a request's server-side events pair with it); -1 when none came.
  double first_token_time = -1;
  std::string text = {};  // the reply (a multi-turn conversation resends it)
};

// numpy.percentile with linear interpolation; 0 for an empty input.
double Percentile(std::vector<double> values, double p);
double Mean(const std::vector<double>& values);
double StdDev(const std::vector<double>& values);  // population, like numpy.std

// "ttft:200 tpot:50 e2el:1000" -> {"ttft": 200, ...} (milliseconds).
Result<std::map<std::string, double>> ParseGoodput(const std::vector<std::string>& items);
// The SLOs of --slo / --goodput-search, each NAME:VALUE with a unit: "ttft:500ms tpot:0.1s" ->
// {"ttft": 500, "tpot": 100} (milliseconds). `flag` names the flag in the errors (an unknown name,
// a missing or unknown unit, a value that is not positive).
Result<std::map<std::string, double>> ParseSlo(const std::string& flag,
                                               const std::vector<std::string>& items);
// --request-rate: "4" or "1,2,4,inf" -> rates (inf as INFINITY); each must be positive.
Result<std::vector<double>> ParseRequestRates(const std::string& csv);
// "ttft,tpot,itl" -> list; checks the names.
Result<std::vector<std::string>> ParseMetricNames(const std::string& csv);
// "50,90,99" -> list; checks 0 < p <= 100.
Result<std::vector<double>> ParsePercentiles(const std::string& csv);

struct RunInfo {
  std::string backend = "openai";
  std::string model_id;
  std::string endpoint;
  std::string dataset_name;
  int num_prompts = 0;
  double request_rate = 0;  // inf allowed
  double burstiness = 1.0;
  int max_concurrency = 0;  // 0: none
  double duration = 0;      // seconds
};

// The share of all requests (failed ones count as misses) that met each SLO, and all of them.
// A request with one output token has no TPOT and meets any TPOT SLO (as vLLM counts it).
struct Attainment {
  std::map<std::string, double> by_metric;  // one entry per SLO given
  double both = 0;                          // every SLO given (1 when none is)
};
Attainment ComputeAttainment(const std::vector<RequestResult>& results,
                             const std::map<std::string, double>& slo_ms);
// {"ttft": x, "tpot": y, "both": z}: the metrics without an SLO are null.
nlohmann::json AttainmentJson(const Attainment& attainment);

// The machine the client runs on, for the saved JSON's "host" (a plot's title names it): the CPU
// model from /proc/cpuinfo and the number of CPUs, "Intel(R) Xeon(R) ... (2 CPUs)".
std::string HostDescription();

struct BenchmarkSummary {
  nlohmann::json json;  // vLLM's field names
  std::string text;     // the printed report
};

BenchmarkSummary Summarize(const RunInfo& info, const std::vector<RequestResult>& results,
                           const std::vector<std::string>& percentile_metrics,
                           const std::vector<double>& percentiles,
                           const std::map<std::string, double>& goodput_ms);

}  // namespace pd::bench
