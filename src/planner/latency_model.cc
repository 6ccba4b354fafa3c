#include "planner/latency_model.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace pd::planner {
namespace {

using nlohmann::json;

Result<std::array<double, 3>> ParseTriple(const json& obj, const char* key,
                                          const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return InvalidArgument(where + ": missing field '" + key + "'");
  if (!it->is_array() || it->size() != 3) {
    return InvalidArgument(where + ": field '" + key + "' must be an array of 3 numbers");
  }
  std::array<double, 3> out{};
  for (int i = 0; i < 3; ++i) {
    if (!(*it)[i].is_number()) {
      return InvalidArgument(where + ": field '" + key + "' must be an array of 3 numbers");
    }
    out[i] = (*it)[i].get<double>();
  }
  return out;
}

Result<StepCoeffs> ParseCoeffs(const json& obj, const std::string& where) {
  if (!obj.is_object()) return InvalidArgument(where + ": must be an object");
  StepCoeffs c;
  ASSIGN_OR_RETURN(c.prefill, ParseTriple(obj, "prefill", where));
  ASSIGN_OR_RETURN(c.decode_small, ParseTriple(obj, "decoding_smallbs", where));
  ASSIGN_OR_RETURN(c.decode_large, ParseTriple(obj, "decoding_largebs", where));
  auto it = obj.find("decoding_large_small_bs_threshold");
  if (it != obj.end()) {
    if (!it->is_number_integer() || it->get<int>() < 1) {
      return InvalidArgument(where +
                             ": decoding_large_small_bs_threshold must be a positive integer");
    }
    c.decode_threshold = it->get<int>();
  }
  return c;
}

// Parses {"1": {...}, "2": {...}} into per-TP coefficients.
Result<std::map<int, StepCoeffs>> ParseByTp(const json& obj, const std::string& where) {
  if (!obj.is_object() || obj.empty()) {
    return InvalidArgument(where + ": must be a non-empty object keyed by TP degree");
  }
  std::map<int, StepCoeffs> out;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    int tp = 0;
    try {
      size_t used = 0;
      tp = std::stoi(it.key(), &used);
      if (used != it.key().size()) tp = 0;
    } catch (const std::exception&) {
      tp = 0;
    }
    if (tp < 1) return InvalidArgument(where + ": key '" + it.key() + "' is not a TP degree");
    ASSIGN_OR_RETURN(out[tp], ParseCoeffs(it.value(), where + "[" + it.key() + "]"));
  }
  return out;
}

Result<json> ParseJson(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(source + ": not valid JSON");
  return j;
}

}  // namespace

double ExpectedActivatedExperts(double tokens, int num_experts, int top_k) {
  if (tokens <= 0 || num_experts <= 0 || top_k <= 0) return 0.0;
  const double e = num_experts;
  return e * (1.0 - std::pow(1.0 - std::min(1.0, top_k / e), tokens));
}

double StepCoeffs::PrefillMs(int64_t tokens, double sq) const {
  if (tokens == 0) return 0.0;
  return prefill[0] + prefill[1] * static_cast<double>(tokens) + prefill[2] * sq + moe.Ms(tokens);
}

double StepCoeffs::DecodeMs(int batch, int64_t context) const {
  if (batch == 0) return 0.0;
  const auto& c = batch < decode_threshold ? decode_small : decode_large;
  return c[0] + c[1] * static_cast<double>(context) + c[2] * batch + moe.Ms(batch);
}

double StepCoeffs::StepMs(const StepShape& shape) const {
  if (shape.prefill_tokens == 0) return DecodeMs(shape.decode_seqs, shape.decode_context);
  // One expert read serves the prompt tokens and the decoding sequences alike.
  double ms = PrefillMs(shape.prefill_tokens, shape.prefill_sq) - moe.Ms(shape.prefill_tokens) +
              moe.Ms(shape.prefill_tokens + shape.decode_seqs);
  if (shape.decode_seqs > 0) {
    const auto& c = shape.decode_seqs < decode_threshold ? decode_small : decode_large;
    ms += c[1] * static_cast<double>(shape.decode_context) + c[2] * shape.decode_seqs;
  }
  return ms;
}

StageTimes PipelineTimes(const StepCoeffs& coeffs, const StepShape& shape, int pp) {
  const double step_ms = coeffs.StepMs(shape);
  double overhead_ms = 0.0;  // first stage only
  if (!shape.empty()) {
    overhead_ms =
        coeffs.overhead_ms + coeffs.overhead_per_token_ms *
                                 static_cast<double>(shape.decode_context + shape.prefill_tokens);
  }
  StageTimes t;
  if (pp <= 1) {
    t.stage_s = t.step_s = (step_ms + overhead_ms) * 1e-3;
    return t;
  }
  double stage_ms = step_ms / pp;
  if (shape.prefill_tokens > 0) stage_ms += kPpStageOverheadMs;
  t.stage_s = (stage_ms + overhead_ms) * 1e-3;
  t.step_s = (stage_ms * pp + overhead_ms) * 1e-3;
  return t;
}

Result<StepCoeffs> TableLatencyModel::Coeffs(int tp) const {
  auto it = by_tp_.find(tp);
  if (it == by_tp_.end()) {
    return NotFound(name_ + ": no step-time coefficients for TP " + std::to_string(tp));
  }
  return it->second;
}

Result<std::unique_ptr<TableLatencyModel>> ParseDistServeProfile(const std::string& json_text,
                                                                 const std::string& model,
                                                                 const std::string& source) {
  ASSIGN_OR_RETURN(json j, ParseJson(json_text, source));
  if (!j.is_object()) return InvalidArgument(source + ": top level must be an object");
  auto it = j.find(model);
  if (it == j.end()) {
    std::string known;
    for (auto m = j.begin(); m != j.end(); ++m) known += (known.empty() ? "" : ", ") + m.key();
    return NotFound(source + ": no model '" + model + "' (has: " + known + ")");
  }
  ASSIGN_OR_RETURN(auto by_tp, ParseByTp(*it, source + ": " + model));
  for (auto& [tp, c] : by_tp) {
    c.overhead_ms = kDistServeOverheadMs;
    c.overhead_per_token_ms = kDistServeOverheadPerTokenMs;
  }
  return std::make_unique<TableLatencyModel>(source + ":" + model, std::move(by_tp));
}

Result<std::unique_ptr<TableLatencyModel>> LoadDistServeProfile(const std::string& path,
                                                                const std::string& model) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseDistServeProfile(text, model, path);
}

std::string ToPdserveProfileJson(const TableLatencyModel& model, const std::string& device) {
  json j;
  j["format"] = "pdserve-profile-v1";
  j["model"] = model.Describe();
  j["device"] = device;
  json tp = json::object();
  for (const auto& [degree, c] : model.by_tp()) {
    tp[std::to_string(degree)] = {{"prefill", c.prefill},
                                  {"decoding_smallbs", c.decode_small},
                                  {"decoding_largebs", c.decode_large},
                                  {"decoding_large_small_bs_threshold", c.decode_threshold}};
  }
  j["tp"] = tp;
  return j.dump(2) + "\n";
}

Result<std::unique_ptr<TableLatencyModel>> ParsePdserveProfile(const std::string& json_text,
                                                               const std::string& source) {
  ASSIGN_OR_RETURN(json j, ParseJson(json_text, source));
  if (!j.is_object() || j.value("format", "") != "pdserve-profile-v1") {
    return InvalidArgument(source + ": field 'format' must be \"pdserve-profile-v1\"");
  }
  auto tp = j.find("tp");
  if (tp == j.end()) return InvalidArgument(source + ": missing field 'tp'");
  ASSIGN_OR_RETURN(auto by_tp, ParseByTp(*tp, source + ": tp"));
  std::string name = j.value("model", std::string("profile"));
  return std::make_unique<TableLatencyModel>(name, std::move(by_tp));
}

Result<std::unique_ptr<TableLatencyModel>> LoadProfile(const std::string& path,
                                                       const std::string& model) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  if (text.find("pdserve-profile-v1") != std::string::npos) return ParsePdserveProfile(text, path);
  return ParseDistServeProfile(text, model, path);
}

}  // namespace pd::planner
