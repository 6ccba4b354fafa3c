// A small Prometheus registry (text exposition format 0.0.4) and the serving metrics of pdserve,
// named as vLLM names them ("vllm:time_to_first_token_seconds") under the "pdserve:" prefix.
//
// Thread safety: every method of Counter, Gauge, Histogram, Registry and ServingMetrics may be
// called from any thread; each metric family has its own mutex.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"

namespace pd::server {

// Label pairs in the order they are written, e.g. {{"model_name", "m"}, {"finished_reason",
// "stop"}}.
using Labels = std::vector<std::pair<std::string, std::string>>;

// Escapes a label value: backslash, double quote and newline (Prometheus text format).
std::string EscapeLabelValue(const std::string& value);
// Formats a sample value the way Prometheus clients do: integers without a fraction, +Inf, NaN.
std::string FormatSampleValue(double value);

enum class MetricType { kCounter, kGauge, kHistogram };

// One metric family: a name, help text, type and one series per label set.
class MetricFamily {
 public:
  MetricFamily(std::string name, std::string help, MetricType type,
               std::vector<double> buckets = {});

  // Counter: adds delta (>= 0). Gauge: sets or adds. Histogram: observes.
  void Increment(const Labels& labels, double delta = 1.0) EXCLUDES(mu_);
  void Set(const Labels& labels, double value) EXCLUDES(mu_);
  void Observe(const Labels& labels, double value) EXCLUDES(mu_);
  // Counter that mirrors a running total kept elsewhere (e.g. the engine's): sets it to `total`,
  // never lower than it already is.
  void SetTotal(const Labels& labels, double total) EXCLUDES(mu_);
  // Creates the series with value 0 so it is exported before its first event.
  void Touch(const Labels& labels) EXCLUDES(mu_);
  // Counter / gauge value (0 when absent).
  double Value(const Labels& labels) const EXCLUDES(mu_);
  // Histogram count (0 when absent).
  uint64_t SampleCount(const Labels& labels) const EXCLUDES(mu_);

  const std::string& name() const { return name_; }
  void AppendText(std::string* out) const EXCLUDES(mu_);

 private:
  struct Series {
    double value = 0.0;                   // counter / gauge; histogram sum
    uint64_t count = 0;                   // histogram
    std::vector<uint64_t> bucket_counts;  // histogram, non-cumulative, one per bucket
  };
  Series& GetSeries(const Labels& labels) REQUIRES(mu_);

  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<double> buckets_;  // upper bounds, ascending; +Inf implied
  mutable Mutex mu_;
  std::map<Labels, Series> series_ GUARDED_BY(mu_);
};

class Registry {
 public:
  MetricFamily* AddCounter(const std::string& name, const std::string& help) EXCLUDES(mu_);
  MetricFamily* AddGauge(const std::string& name, const std::string& help) EXCLUDES(mu_);
  MetricFamily* AddHistogram(const std::string& name, const std::string& help,
                             std::vector<double> buckets) EXCLUDES(mu_);
  // Called before each scrape, e.g. to read gauges from the engine.
  void AddCollectHook(std::function<void()> hook) EXCLUDES(mu_);
  // The whole registry in Prometheus text format, families in registration order.
  std::string Render() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::vector<std::unique_ptr<MetricFamily>> families_ GUARDED_BY(mu_);
  std::vector<std::function<void()>> hooks_ GUARDED_BY(mu_);
};

// vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
const std::vector<double>& TtftBuckets();
const std::vector<double>& InterTokenLatencyBuckets();
const std::vector<double>& RequestLatencyBuckets();

// The metrics a colocated server exports, each labelled model_name=<served model name>.
struct ServingMetrics {
  explicit ServingMetrics(std::string model_name);

  Labels model_labels() const { return {{"model_name", model_name}}; }
  void RecordFinished(const std::string& finished_reason);

  std::string model_name;
  Registry registry;
  MetricFamily* ttft;                 // pdserve:time_to_first_token_seconds
  MetricFamily* inter_token_latency;  // pdserve:inter_token_latency_seconds
  MetricFamily* e2e_latency;          // pdserve:e2e_request_latency_seconds
  MetricFamily* queue_time;           // pdserve:request_queue_time_seconds
  MetricFamily* num_running;          // pdserve:num_requests_running
  MetricFamily* num_waiting;          // pdserve:num_requests_waiting
  MetricFamily* kv_cache_usage;       // pdserve:kv_cache_usage_perc (0..1)
  MetricFamily* prompt_tokens;        // pdserve:prompt_tokens_total
  MetricFamily* generation_tokens;    // pdserve:generation_tokens_total
  MetricFamily* request_success;      // pdserve:request_success_total{finished_reason}
  // vLLM v1's prefix cache counters, in tokens: the prompts looked up and the part found cached.
  MetricFamily* prefix_cache_queries;  // pdserve:prefix_cache_queries_total
  MetricFamily* prefix_cache_hits;     // pdserve:prefix_cache_hits_total
  // vLLM v1's speculative decoding counters (present, zero, when speculation is off).
  MetricFamily* spec_decode_num_drafts;           // pdserve:spec_decode_num_drafts_total
  MetricFamily* spec_decode_num_draft_tokens;     // pdserve:spec_decode_num_draft_tokens_total
  MetricFamily* spec_decode_num_accepted_tokens;  // ..._num_accepted_tokens_total
  // pdserve:spec_decode_num_accepted_tokens_per_pos_total{position}
  MetricFamily* spec_decode_num_accepted_tokens_per_pos;
  // pdserve:spec_decode_draft_prompt_tokens_total (SpecDecodeCounters::num_draft_prompt_tokens)
  MetricFamily* spec_decode_draft_prompt_tokens;
};

}  // namespace pd::server
