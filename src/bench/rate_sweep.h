// Rate sweeps and goodput searches of `pdserve bench`: the same prompts sent at one rate after
// another against the same server, each rate after a warm-up (requests not counted) and ended by
// a cool-down (every request of the rate completed, none outstanding, before the next starts).
// The results are one JSON document with an entry per rate (attainment of each SLO and of all,
// latency percentiles), sorted by rate, that a plotting script draws as attainment-versus-rate
// curves (schema "pdserve-bench-rates-v1", docs/benchmarks.md).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/goodput_search.h"
#include "bench/runner.h"

namespace pd::bench {

struct SweepOptions {
  BenchOptions bench;  // bench.goodput_ms defaults to slo_ms; bench.request_rate is unused
  std::map<std::string, double> slo_ms;  // ttft / tpot / e2el, milliseconds
  int warmup_requests = 2;               // per rate, sent at that rate, not counted
  double attainment_target = 0;          // > 0: each entry says whether it met the target
  // > 0: a rate sends at least rate * min_duration_s requests (more than bench.num_prompts when
  // needed, at most max_prompts), so that a high rate is not one short burst the server absorbs.
  double min_duration_s = 0;
  int max_prompts = 10000;
  // Called before each rate's warm-up: progress lines, or a test's fake server told its load.
  std::function<void(double rate)> on_rate;
};

// One rate measured.
struct RatePoint {
  double rate = 0;  // inf allowed
  Attainment attainment;
  nlohmann::json entry;  // the "rates" entry of the JSON document
};

// Sends the prepared requests at any rate. Thread safety: one Run at a time.
class RateRunner {
 public:
  // Reaches the server and builds the requests: Unavailable / InvalidArgument as PrepareRequests.
  static Result<std::unique_ptr<RateRunner>> Create(const SweepOptions& options);
  // Warm-up, then the measured requests at `rate`; returns once none is outstanding.
  // Unavailable when more requests had to be built and the server could not be reached.
  Result<RatePoint> Run(double rate);
  const SweepOptions& options() const { return options_; }
  const std::string& model() const { return prepared_.model; }
  const std::vector<GenerationRequest>& requests() const { return prepared_.requests; }

 private:
  RateRunner(SweepOptions options, PreparedRequests prepared)
      : options_(std::move(options)), prepared_(std::move(prepared)) {}
  SweepOptions options_;
  PreparedRequests prepared_;
  int runs_ = 0;
};

struct RatesReport {
  nlohmann::json json;
  std::string text;  // a table, a row per rate (and the goodput line of a search)
};

// Each rate in turn, in the order given.
Result<RatesReport> RunSweep(RateRunner* runner, const std::vector<double>& rates);

// The goodput search (SearchGoodput) with RateRunner::Run's attainment of all SLOs as the
// measure; devices > 0 adds the goodput per device. Errors as SearchGoodput's.
Result<RatesReport> RunGoodputSearch(RateRunner* runner, const GoodputSearchOptions& search,
                                     int devices);

// The JSON document and table from measured points (sorted by rate here).
RatesReport MakeRatesReport(const SweepOptions& options, const std::string& model,
                            const std::string& mode, std::vector<RatePoint> points);

}  // namespace pd::bench
