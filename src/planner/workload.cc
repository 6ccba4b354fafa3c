#include "planner/workload.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/file_util.h"

namespace pd::planner {
namespace {

using nlohmann::json;

Result<json> ParseArray(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(source + ": not valid JSON");
  return j;
}

Result<double> Number(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number()) {
    return InvalidArgument(where + ": field '" + key + "' missing or not a number");
  }
  return it->get<double>();
}

}  // namespace

Result<std::vector<LengthPair>> ParseLengthsCsv(const std::string& text,
                                                const std::string& source) {
  std::vector<LengthPair> out;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line == "\r" || line.rfind("prompt_len", 0) == 0) continue;
    LengthPair p;
    if (std::sscanf(line.c_str(), "%d,%d", &p.prompt_len, &p.output_len) != 2 || p.prompt_len < 1 ||
        p.output_len < 1) {
      return InvalidArgument(source + ":" + std::to_string(line_no) +
                             ": expected two positive integers prompt_len,output_len, got '" +
                             line + "'");
    }
    out.push_back(p);
  }
  if (out.empty()) return InvalidArgument(source + ": no length pairs");
  return out;
}

Result<std::vector<LengthPair>> LoadLengthsCsv(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseLengthsCsv(text, path);
}

Result<std::vector<SimRequest>> ParseTraceJson(const std::string& text, const std::string& source) {
  ASSIGN_OR_RETURN(json j, ParseArray(text, source));
  if (!j.is_array() || j.empty()) return InvalidArgument(source + ": must be a non-empty array");
  std::vector<SimRequest> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string where = source + "[" + std::to_string(i) + "]";
    SimRequest r;
    r.id = static_cast<int64_t>(i);
    ASSIGN_OR_RETURN(double p, Number(j[i], "prompt_len", where));
    ASSIGN_OR_RETURN(double o, Number(j[i], "output_len", where));
    ASSIGN_OR_RETURN(r.arrival_s, Number(j[i], "start_time", where));
    r.prompt_len = static_cast<int>(p);
    r.output_len = static_cast<int>(o);
    if (r.prompt_len < 1 || r.output_len < 1 || r.arrival_s < 0) {
      return InvalidArgument(where + ": lengths must be >= 1 and start_time >= 0");
    }
    out.push_back(r);
  }
  std::stable_sort(out.begin(), out.end(), [](const SimRequest& a, const SimRequest& b) {
    return a.arrival_s < b.arrival_s;
  });
  return out;
}

Result<std::vector<SimRequest>> LoadTraceJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseTraceJson(text, path);
}

std::vector<SimRequest> MakeUnitRateWorkload(std::span<const LengthPair> lengths,
                                             const ArrivalOptions& options) {
  std::vector<SimRequest> out;
  if (lengths.empty() || options.num_requests <= 0) return out;
  std::mt19937_64 rng(options.seed);
  const double cv = options.cv > 0 ? options.cv : 1.0;
  const double shape = 1.0 / (cv * cv);
  std::gamma_distribution<double> gap(shape, 1.0 / shape);  // mean 1
  std::uniform_int_distribution<size_t> pick(0, lengths.size() - 1);
  double t = 0.0;
  for (int i = 0; i < options.num_requests; ++i) {
    const LengthPair& lp = lengths[pick(rng)];
    out.push_back({i, t, lp.prompt_len, lp.output_len});
    t += gap(rng);
  }
  return out;
}

std::vector<SimRequest> AtRate(std::span<const SimRequest> unit_rate, double rate) {
  std::vector<SimRequest> out(unit_rate.begin(), unit_rate.end());
  for (auto& r : out) r.arrival_s /= rate;
  return out;
}

Result<std::vector<MeasuredRequest>> ParseMeasuredJson(const std::string& text,
                                                       const std::string& source) {
  ASSIGN_OR_RETURN(json j, ParseArray(text, source));
  auto it = j.is_object() ? j.find("requests") : j.end();
  if (it == j.end() || !it->is_array()) {
    return InvalidArgument(source + ": missing array field 'requests'");
  }
  std::vector<MeasuredRequest> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& r = (*it)[i];
    const std::string where = source + ": requests[" + std::to_string(i) + "]";
    MeasuredRequest m;
    ASSIGN_OR_RETURN(double p, Number(r, "prompt_len", where));
    ASSIGN_OR_RETURN(double o, Number(r, "output_len", where));
    ASSIGN_OR_RETURN(m.issue_s, Number(r, "issue_time", where));
    ASSIGN_OR_RETURN(double ttft_ms, Number(r, "ttft_ms", where));
    ASSIGN_OR_RETURN(double tpot_ms, Number(r, "tpot_ms", where));
    m.prompt_len = static_cast<int>(p);
    m.output_len = static_cast<int>(o);
    m.ttft_s = ttft_ms * 1e-3;
    m.tpot_s = tpot_ms * 1e-3;
    out.push_back(m);
  }
  std::stable_sort(out.begin(), out.end(), [](const MeasuredRequest& a, const MeasuredRequest& b) {
    return a.issue_s < b.issue_s;
  });
  return out;
}

Result<std::vector<MeasuredRequest>> LoadMeasuredJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseMeasuredJson(text, path);
}

std::vector<RequestResult> MeasuredResults(std::span<const MeasuredRequest> measured) {
  std::vector<RequestResult> out;
  out.reserve(measured.size());
  for (const MeasuredRequest& m : measured) {
    RequestResult q;
    q.output_len = m.output_len;
    q.first_token_s = m.ttft_s;
    q.finish_s = m.ttft_s + m.tpot_s * std::max(0, m.output_len - 1);
    out.push_back(q);
  }
  return out;
}

}  // namespace pd::planner
