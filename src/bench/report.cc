#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <set>
#include <thread>

namespace pd::bench {

using json = nlohmann::json;

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(values.size() - 1, lo + 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

double Mean(const std::vector<double>& values) {
  if (values.empty()) return 0.0;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

double StdDev(const std::vector<double>& values) {
  if (values.empty()) return 0.0;
  const double m = Mean(values);
  double sq = 0;
  for (double v : values) sq += (v - m) * (v - m);
  return std::sqrt(sq / static_cast<double>(values.size()));
}

Result<std::map<std::string, double>> ParseGoodput(const std::vector<std::string>& items) {
  std::map<std::string, double> out;
  for (const std::string& item : items) {
    size_t colon = item.find(':');
    if (colon == std::string::npos)
      return InvalidArgument("--goodput: expected NAME:MS, got '" + item + "'");
    std::string name = item.substr(0, colon);
    if (name != "ttft" && name != "tpot" && name != "e2el")
      return InvalidArgument("--goodput: unknown metric '" + name + "' (ttft | tpot | e2el)");
    char* end = nullptr;
    double ms = std::strtod(item.c_str() + colon + 1, &end);
    if (end == item.c_str() + colon + 1 || *end != '\0' || !(ms > 0))
      return InvalidArgument("--goodput: '" + item + "' needs a positive number of milliseconds");
    out[name] = ms;
  }
  return out;
}

Result<std::map<std::string, double>> ParseSlo(const std::string& flag,
                                               const std::vector<std::string>& items) {
  std::map<std::string, double> out;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos)
      return InvalidArgument(flag + ": expected NAME:VALUE with a unit, e.g. ttft:500ms, got '" +
                             item + "'");
    const std::string name = item.substr(0, colon);
    if (name != "ttft" && name != "tpot" && name != "e2el")
      return InvalidArgument(flag + ": unknown SLO '" + name + "' (ttft | tpot | e2el)");
    const char* value = item.c_str() + colon + 1;
    char* end = nullptr;
    const double v = std::strtod(value, &end);
    if (end == value || !(v > 0) || std::isinf(v))
      return InvalidArgument(flag + ": '" + item + "' needs a positive value with a unit (ms | s)");
    const std::string unit = end;
    if (unit.empty())
      return InvalidArgument(flag + ": '" + item + "' has no unit: write e.g. " + name + ":" +
                             std::string(value, static_cast<size_t>(end - value)) +
                             "ms (units: ms | s)");
    if (unit != "ms" && unit != "s")
      return InvalidArgument(flag + ": '" + item + "': unknown unit '" + unit + "' (ms | s)");
    if (out.count(name)) return InvalidArgument(flag + ": '" + name + "' given twice");
    out[name] = unit == "s" ? v * 1000.0 : v;
  }
  return out;
}

Result<std::vector<double>> ParseRequestRates(const std::string& csv) {
  std::vector<double> out;
  size_t pos = 0;
  while (pos <= csv.size()) {
    const size_t comma = csv.find(',', pos);
    const std::string item =
        csv.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    double rate = INFINITY;
    if (item != "inf") {
      char* end = nullptr;
      rate = std::strtod(item.c_str(), &end);
      if (item.empty() || *end != '\0' || !(rate > 0) || std::isinf(rate))
        return InvalidArgument("--request-rate: '" + item +
                               "' is not a positive number of requests per second or inf");
    }
    out.push_back(rate);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

Result<std::vector<std::string>> ParseMetricNames(const std::string& csv) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= csv.size()) {
    size_t comma = csv.find(',', pos);
    std::string name =
        csv.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (name != "ttft" && name != "tpot" && name != "itl" && name != "e2el")
      return InvalidArgument("--percentile-metrics: unknown metric '" + name +
                             "' (ttft | tpot | itl | e2el)");
    out.push_back(name);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

Result<std::vector<double>> ParsePercentiles(const std::string& csv) {
  std::vector<double> out;
  size_t pos = 0;
  while (pos <= csv.size()) {
    size_t comma = csv.find(',', pos);
    std::string item =
        csv.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    double p = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(p > 0 && p <= 100))
      return InvalidArgument("--metric-percentiles: '" + item +
                             "' is not a percentile in (0, 100]");
    out.push_back(p);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

namespace {

std::string PercentileKey(double p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", p);
  std::string s = buf;
  std::replace(s.begin(), s.end(), '.',
               '_');  // never needed for integers; vLLM writes p99_9? keep simple
  return s;
}

std::string Line(const std::string& label, double value, int precision = 2) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%-40s %-10.*f\n", label.c_str(), precision, value);
  return buf;
}

std::string LineInt(const std::string& label, long long value) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%-40s %-10lld\n", label.c_str(), value);
  return buf;
}

std::string Header(const std::string& title, char fill) {
  const int width = 50;
  int pad = std::max(0, width - static_cast<int>(title.size()));
  return std::string(pad / 2, fill) + title + std::string(pad - pad / 2, fill) + "\n";
}

// A request meets the SLO when every goodput target holds.
bool MeetsSlo(const RequestResult& r, double tpot,
              const std::map<std::string, double>& goodput_ms) {
  for (const auto& [name, ms] : goodput_ms) {
    double v = name == "ttft" ? r.ttft : name == "tpot" ? tpot : r.latency;
    if (v * 1000.0 > ms) return false;
  }
  return true;
}

// What the per-request results add up to: the latency samples (seconds) and the totals.
struct Tally {
  std::vector<double> ttfts, tpots, itls, e2els;
  long long total_input = 0, total_output = 0;
  int completed = 0, good = 0;
  std::map<int, int> failures_by_status;
  json input_lens = json::array(), output_lens = json::array(), ttft_list = json::array(),
       itl_list = json::array(), errors = json::array(), run_delays = json::array(),
       cpus = json::array(), first_token_times = json::array();
};

Tally TallyResults(const std::vector<RequestResult>& results,
                   const std::map<std::string, double>& goodput_ms) {
  Tally s;
  for (const RequestResult& r : results) {
    if (!r.success) {
      s.failures_by_status[r.http_status]++;
      s.errors.push_back(r.error);
      continue;
    }
    ++s.completed;
    s.total_input += r.prompt_len;
    s.total_output += r.output_len;
    const double tpot = r.output_len > 1 ? (r.latency - r.ttft) / (r.output_len - 1) : 0.0;
    if (r.output_len > 1) s.tpots.push_back(tpot);
    s.ttfts.push_back(r.ttft);
    s.e2els.push_back(r.latency);
    s.itls.insert(s.itls.end(), r.itl.begin(), r.itl.end());
    if (!goodput_ms.empty() && MeetsSlo(r, tpot, goodput_ms)) ++s.good;
    s.input_lens.push_back(r.prompt_len);
    s.output_lens.push_back(r.output_len);
    s.ttft_list.push_back(r.ttft);
    s.itl_list.push_back(r.itl);
    s.run_delays.push_back(r.client_run_delay_to_first);
    s.cpus.push_back(r.client_cpu_at_first);
    s.first_token_times.push_back(r.first_token_time);
  }
  return s;
}

// The run's settings and totals under vLLM's field names (the latency metrics come later).
json RunJson(const RunInfo& info, size_t num_results, const Tally& s,
             const std::map<std::string, double>& goodput_ms) {
  const double duration = std::max(info.duration, 1e-9);
  json j;
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y%m%d-%H%M%S", std::localtime(&now));
  j["date"] = date;
  j["backend"] = info.backend;
  j["model_id"] = info.model_id;
  j["tokenizer_id"] = info.model_id;
  j["endpoint"] = info.endpoint;
  j["dataset_name"] = info.dataset_name;
  j["num_prompts"] = info.num_prompts;
  j["request_rate"] = std::isinf(info.request_rate) ? json("inf") : json(info.request_rate);
  j["burstiness"] = info.burstiness;
  j["max_concurrency"] = info.max_concurrency > 0 ? json(info.max_concurrency) : json(nullptr);
  j["duration"] = info.duration;
  j["completed"] = s.completed;
  j["failed"] = static_cast<int>(num_results) - s.completed;
  j["total_input_tokens"] = s.total_input;
  j["total_output_tokens"] = s.total_output;
  j["request_throughput"] = s.completed / duration;
  j["request_goodput"] = goodput_ms.empty() ? json(nullptr) : json(s.good / duration);
  j["slo_attainment"] =
      goodput_ms.empty() || num_results == 0 ? json(nullptr) : json(double(s.good) / num_results);
  j["output_throughput"] = s.total_output / duration;
  j["total_token_throughput"] = (s.total_input + s.total_output) / duration;
  j["input_lens"] = s.input_lens;
  j["output_lens"] = s.output_lens;
  j["ttfts"] = s.ttft_list;
  j["itls"] = s.itl_list;
  j["errors"] = s.errors;
  // pdserve's own (not vLLM's), one per successful request as ttfts: see RequestResult.
  j["client_run_delays_to_first_token"] = s.run_delays;
  j["client_cpus_at_first_token"] = s.cpus;
  j["first_token_steady_times"] = s.first_token_times;
  j["host"] = HostDescription();
  if (!goodput_ms.empty()) j["slo_ms"] = goodput_ms;  // the --goodput SLOs, milliseconds
  return j;
}

// The printed report's totals, up to the latency sections.
std::string RunText(const RunInfo& info, size_t num_results, const Tally& s,
                    const std::map<std::string, double>& goodput_ms) {
  const double duration = std::max(info.duration, 1e-9);
  std::string t = Header(" Serving Benchmark Result ", '=');
  t += LineInt("Successful requests:", s.completed);
  t += LineInt("Failed requests:", static_cast<long long>(num_results) - s.completed);
  for (const auto& [status, n] : s.failures_by_status)
    t += LineInt(
        "  failed with HTTP " + (status ? std::to_string(status) : std::string("error")) + ":", n);
  if (info.max_concurrency > 0) t += LineInt("Maximum request concurrency:", info.max_concurrency);
  t += Line("Benchmark duration (s):", info.duration);
  t += LineInt("Total input tokens:", s.total_input);
  t += LineInt("Total generated tokens:", s.total_output);
  t += Line("Request throughput (req/s):", s.completed / duration);
  if (!goodput_ms.empty()) {
    t += Line("Request goodput (req/s):", s.good / duration);
    t += Line("SLO attainment (%):", num_results == 0 ? 0.0 : 100.0 * s.good / num_results);
  }
  t += Line("Output token throughput (tok/s):", s.total_output / duration);
  t += Line("Total Token throughput (tok/s):", (s.total_input + s.total_output) / duration);
  return t;
}

// Mean, median, std and the percentiles of each latency metric into `j`; a section of the printed
// report for each metric in `percentile_metrics`.
void AddLatencyMetrics(const Tally& s, const std::vector<std::string>& percentile_metrics,
                       const std::vector<double>& percentiles, json* j, std::string* t) {
  struct MetricDef {
    const char* key;
    const char* title;
    const char* label;
    const std::vector<double>* values;
  };
  const MetricDef defs[] = {{"ttft", "Time to First Token", "TTFT", &s.ttfts},
                            {"tpot", "Time per Output Token (excl. 1st token)", "TPOT", &s.tpots},
                            {"itl", "Inter-token Latency", "ITL", &s.itls},
                            {"e2el", "End-to-end Latency", "E2EL", &s.e2els}};
  std::set<std::string> selected(percentile_metrics.begin(), percentile_metrics.end());
  for (const MetricDef& d : defs) {
    std::vector<double> ms;
    for (double v : *d.values) ms.push_back(v * 1000.0);
    const std::string k = d.key;
    (*j)["mean_" + k + "_ms"] = Mean(ms);
    (*j)["median_" + k + "_ms"] = Percentile(ms, 50);
    (*j)["std_" + k + "_ms"] = StdDev(ms);
    for (double p : percentiles) (*j)["p" + PercentileKey(p) + "_" + k + "_ms"] = Percentile(ms, p);
    if (!selected.count(k)) continue;
    *t += Header(std::string(d.title), '-');
    *t += Line(std::string("Mean ") + d.label + " (ms):", Mean(ms));
    *t += Line(std::string("Median ") + d.label + " (ms):", Percentile(ms, 50));
    for (double p : percentiles)
      *t += Line("P" + PercentileKey(p) + " " + d.label + " (ms):", Percentile(ms, p));
  }
}

}  // namespace

Attainment ComputeAttainment(const std::vector<RequestResult>& results,
                             const std::map<std::string, double>& slo_ms) {
  Attainment a;
  std::map<std::string, int> met;
  int both = 0;
  for (const RequestResult& r : results) {
    if (!r.success) continue;
    const double tpot = r.output_len > 1 ? (r.latency - r.ttft) / (r.output_len - 1) : 0.0;
    bool all = true;
    for (const auto& [name, ms] : slo_ms) {
      const bool ok = MeetsSlo(r, tpot, {{name, ms}});
      met[name] += ok;
      all = all && ok;
    }
    both += all;
  }
  const double n = std::max<double>(1.0, static_cast<double>(results.size()));
  for (const auto& [name, ms] : slo_ms) a.by_metric[name] = met[name] / n;
  a.both = results.empty() ? 0.0 : both / n;
  return a;
}

json AttainmentJson(const Attainment& a) {
  json j = {{"ttft", nullptr}, {"tpot", nullptr}};
  for (const auto& [name, v] : a.by_metric) j[name] = v;
  j["both"] = a.both;
  return j;
}

BenchmarkSummary Summarize(const RunInfo& info, const std::vector<RequestResult>& results,
                           const std::vector<std::string>& percentile_metrics,
                           const std::vector<double>& percentiles,
                           const std::map<std::string, double>& goodput_ms) {
  const Tally tally = TallyResults(results, goodput_ms);
  json j = RunJson(info, results.size(), tally, goodput_ms);
  std::string t = RunText(info, results.size(), tally, goodput_ms);
  AddLatencyMetrics(tally, percentile_metrics, percentiles, &j, &t);
  t += std::string(50, '=') + "\n";
  return {j, t};
}

std::string HostDescription() {
  std::string model = "unknown CPU";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    const size_t begin =
        colon == std::string::npos ? colon : line.find_first_not_of(" \t", colon + 1);
    if (begin != std::string::npos) model = line.substr(begin);
    break;
  }
  return model + " (" + std::to_string(std::thread::hardware_concurrency()) + " CPUs)";
}

}  // namespace pd::bench
