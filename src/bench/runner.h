// `pdserve bench`: drives an OpenAI-compatible server with a synthetic workload and reports
// what `vllm bench serve` reports.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "bench/client.h"
#include "bench/datasets.h"
#include "bench/report.h"
#include "bench/workloads.h"

namespace pd::bench {

struct BenchOptions {
  Endpoint endpoint;
  std::string endpoint_path = "/v1/completions";
  std::string model;    // empty: the server's
  DatasetSpec dataset;  // name prefix_repetition or multi_turn: the spec below (workloads.h)
  PrefixRepetitionSpec prefix_repetition;
  MultiTurnSpec multi_turn;
  int num_prompts = 100;
  double request_rate = 0;  // <= 0 or inf: all at once
  double burstiness = 1.0;
  int max_concurrency = 0;  // 0: unlimited
  uint64_t seed = 0;
  bool ignore_eos = false;
  std::map<std::string, double> goodput_ms;
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};
  std::vector<double> metric_percentiles = {99};
  // CPUs the client's request threads run on (each one this process may use); empty: anywhere.
  // Keeps the client off the cores the servers compute on when both share a machine.
  std::vector<int> cpus;
};

// The CPUs (--cpus) checked: InvalidArgument names the first one this process may not use.
Status CheckClientCpus(const std::vector<int>& cpus);

// The requests of a run, built once from the options and the server's model and limits: a rate
// sweep sends the same prompts at every rate.
struct PreparedRequests {
  std::string model;
  std::vector<GenerationRequest> requests;
};
// Unavailable when the server cannot be reached; InvalidArgument for a bad dataset or CPU list.
Result<PreparedRequests> PrepareRequests(const BenchOptions& options);

// What SendAtRate measured.
struct SentRequests {
  std::vector<RequestResult> results;  // one per request, in order
  double duration_s = 0;               // first send to last completion
};
// Sends `requests` with arrivals at `rate` (<= 0 or inf: all at once; gaps from the options'
// burstiness and seed), at most options.max_concurrency in flight, and returns when every one
// has completed (none is left outstanding).
SentRequests SendAtRate(const BenchOptions& options, const std::vector<GenerationRequest>& requests,
                        double rate);

// The RunInfo of a run of options at `rate` that took duration_s.
RunInfo MakeRunInfo(const BenchOptions& options, const std::string& model, double rate,
                    double duration_s);

// Runs the benchmark (blocking). Unavailable when the server cannot be reached at all;
// InvalidArgument for a bad options.cpus.
Result<BenchmarkSummary> RunBenchmark(const BenchOptions& options);

}  // namespace pd::bench
