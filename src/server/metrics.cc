#include "server/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/check.h"

namespace pd::server {

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatSampleValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", value);
    return buf;
  }
  // The shortest decimal that reads back as the same double, like Python's repr.
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  return buf;
}

namespace {

// {a="x",b="y"} with `extra` appended (the histogram's le), or "" when there are no labels.
std::string LabelText(const Labels& labels, const std::pair<std::string, std::string>* extra) {
  if (labels.empty() && extra == nullptr) return "";
  std::string out = "{";
  bool first = true;
  auto add = [&](const std::string& k, const std::string& v) {
    if (!first) out += ",";
    first = false;
    out += k + "=\"" + EscapeLabelValue(v) + "\"";
  };
  for (const auto& [k, v] : labels) add(k, v);
  if (extra != nullptr) add(extra->first, extra->second);
  return out + "}";
}

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

MetricFamily::MetricFamily(std::string name, std::string help, MetricType type,
                           std::vector<double> buckets)
    : name_(std::move(name)), help_(std::move(help)), type_(type), buckets_(std::move(buckets)) {
  for (size_t i = 1; i < buckets_.size(); ++i) PD_CHECK(buckets_[i - 1] < buckets_[i]) << name_;
}

MetricFamily::Series& MetricFamily::GetSeries(const Labels& labels) {
  auto [it, inserted] = series_.try_emplace(labels);
  if (inserted && type_ == MetricType::kHistogram)
    it->second.bucket_counts.assign(buckets_.size(), 0);
  return it->second;
}

void MetricFamily::Increment(const Labels& labels, double delta) {
  PD_CHECK(type_ != MetricType::kHistogram) << name_;
  PD_CHECK(type_ == MetricType::kGauge || delta >= 0) << name_ << ": counters only go up";
  MutexLock lock(&mu_);
  GetSeries(labels).value += delta;
}

void MetricFamily::Set(const Labels& labels, double value) {
  PD_CHECK(type_ == MetricType::kGauge) << name_;
  MutexLock lock(&mu_);
  GetSeries(labels).value = value;
}

void MetricFamily::SetTotal(const Labels& labels, double total) {
  PD_CHECK(type_ == MetricType::kCounter) << name_;
  MutexLock lock(&mu_);
  Series& s = GetSeries(labels);
  s.value = std::max(s.value, total);
}

void MetricFamily::Observe(const Labels& labels, double value) {
  PD_CHECK(type_ == MetricType::kHistogram) << name_;
  MutexLock lock(&mu_);
  Series& s = GetSeries(labels);
  s.value += value;
  s.count += 1;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (value <= buckets_[i]) {
      s.bucket_counts[i] += 1;
      break;
    }
  }
}

void MetricFamily::Touch(const Labels& labels) {
  MutexLock lock(&mu_);
  GetSeries(labels);
}

double MetricFamily::Value(const Labels& labels) const {
  MutexLock lock(&mu_);
  auto it = series_.find(labels);
  return it == series_.end() ? 0.0 : it->second.value;
}

uint64_t MetricFamily::SampleCount(const Labels& labels) const {
  MutexLock lock(&mu_);
  auto it = series_.find(labels);
  return it == series_.end() ? 0 : it->second.count;
}

void MetricFamily::AppendText(std::string* out) const {
  MutexLock lock(&mu_);
  *out += "# HELP " + name_ + " " + help_ + "\n";
  *out += "# TYPE " + name_ + " " + std::string(TypeName(type_)) + "\n";
  for (const auto& [labels, s] : series_) {
    if (type_ != MetricType::kHistogram) {
      *out += name_ + LabelText(labels, nullptr) + " " + FormatSampleValue(s.value) + "\n";
      continue;
    }
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= buckets_.size(); ++i) {
      cumulative += i < buckets_.size() ? s.bucket_counts[i] : 0;
      std::pair<std::string, std::string> le{
          "le", i < buckets_.size() ? FormatSampleValue(buckets_[i]) : "+Inf"};
      if (i == buckets_.size()) cumulative = s.count;
      *out += name_ + "_bucket" + LabelText(labels, &le) + " " +
              FormatSampleValue(static_cast<double>(cumulative)) + "\n";
    }
    *out += name_ + "_sum" + LabelText(labels, nullptr) + " " + FormatSampleValue(s.value) + "\n";
    *out += name_ + "_count" + LabelText(labels, nullptr) + " " +
            FormatSampleValue(static_cast<double>(s.count)) + "\n";
  }
}

MetricFamily* Registry::AddCounter(const std::string& name, const std::string& help) {
  MutexLock lock(&mu_);
  families_.push_back(std::make_unique<MetricFamily>(name, help, MetricType::kCounter));
  return families_.back().get();
}

MetricFamily* Registry::AddGauge(const std::string& name, const std::string& help) {
  MutexLock lock(&mu_);
  families_.push_back(std::make_unique<MetricFamily>(name, help, MetricType::kGauge));
  return families_.back().get();
}

MetricFamily* Registry::AddHistogram(const std::string& name, const std::string& help,
                                     std::vector<double> buckets) {
  MutexLock lock(&mu_);
  families_.push_back(
      std::make_unique<MetricFamily>(name, help, MetricType::kHistogram, std::move(buckets)));
  return families_.back().get();
}

void Registry::AddCollectHook(std::function<void()> hook) {
  MutexLock lock(&mu_);
  hooks_.push_back(std::move(hook));
}

std::string Registry::Render() const {
  MutexLock lock(&mu_);
  for (const auto& hook : hooks_) hook();
  std::string out;
  for (const auto& family : families_) family->AppendText(&out);
  return out;
}

const std::vector<double>& TtftBuckets() {
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                        0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                        20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
  return b;
}

const std::vector<double>& InterTokenLatencyBuckets() {
  static const std::vector<double> b = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                        0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
  return b;
}

const std::vector<double>& RequestLatencyBuckets() {
  static const std::vector<double> b = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                        5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return b;
}

ServingMetrics::ServingMetrics(std::string name) : model_name(std::move(name)) {
  const std::string p = "pdserve:";
  ttft = registry.AddHistogram(p + "time_to_first_token_seconds",
                               "Histogram of time to first token in seconds.", TtftBuckets());
  inter_token_latency = registry.AddHistogram(p + "inter_token_latency_seconds",
                                              "Histogram of inter-token latency in seconds.",
                                              InterTokenLatencyBuckets());
  e2e_latency = registry.AddHistogram(p + "e2e_request_latency_seconds",
                                      "Histogram of e2e request latency in seconds.",
                                      RequestLatencyBuckets());
  queue_time = registry.AddHistogram(p + "request_queue_time_seconds",
                                     "Histogram of time spent in WAITING phase for request.",
                                     RequestLatencyBuckets());
  num_running = registry.AddGauge(p + "num_requests_running",
                                  "Number of requests in model execution batches.");
  num_waiting =
      registry.AddGauge(p + "num_requests_waiting", "Number of requests waiting to be processed.");
  kv_cache_usage =
      registry.AddGauge(p + "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.");
  prompt_tokens =
      registry.AddCounter(p + "prompt_tokens_total", "Number of prefill tokens processed.");
  generation_tokens =
      registry.AddCounter(p + "generation_tokens_total", "Number of generation tokens processed.");
  request_success =
      registry.AddCounter(p + "request_success_total", "Count of successfully processed requests.");
  prefix_cache_queries =
      registry.AddCounter(p + "prefix_cache_queries_total",
                          "Prefix cache queries, in terms of number of queried tokens.");
  prefix_cache_hits = registry.AddCounter(
      p + "prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.");
  spec_decode_num_drafts =
      registry.AddCounter(p + "spec_decode_num_drafts_total", "Number of spec decoding drafts.");
  spec_decode_num_draft_tokens =
      registry.AddCounter(p + "spec_decode_num_draft_tokens_total", "Number of draft tokens.");
  spec_decode_num_accepted_tokens = registry.AddCounter(p + "spec_decode_num_accepted_tokens_total",
                                                        "Number of accepted tokens.");
  spec_decode_num_accepted_tokens_per_pos = registry.AddCounter(
      p + "spec_decode_num_accepted_tokens_per_pos_total", "Accepted tokens per draft position.");
  spec_decode_draft_prompt_tokens =
      registry.AddCounter(p + "spec_decode_draft_prompt_tokens_total",
                          "Prompt tokens the draft model computed on this instance.");
  const Labels labels = model_labels();
  for (MetricFamily* f :
       {ttft, inter_token_latency, e2e_latency, queue_time, num_running, num_waiting,
        kv_cache_usage, prompt_tokens, generation_tokens, prefix_cache_queries, prefix_cache_hits,
        spec_decode_num_drafts, spec_decode_num_draft_tokens, spec_decode_num_accepted_tokens,
        spec_decode_draft_prompt_tokens}) {
    f->Touch(labels);
  }
  for (const char* reason : {"stop", "length", "abort"}) {
    Labels l = labels;
    l.emplace_back("finished_reason", reason);
    request_success->Touch(l);
  }
}

void ServingMetrics::RecordFinished(const std::string& finished_reason) {
  Labels l = model_labels();
  l.emplace_back("finished_reason", finished_reason);
  request_success->Increment(l);
}

}  // namespace pd::server
