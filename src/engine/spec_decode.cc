#include "engine/spec_decode.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/check.h"

namespace pd::engine {

std::string_view SpecMethodName(SpecMethod method) {
  switch (method) {
    case SpecMethod::kNone:
      return "";
    case SpecMethod::kNgram:
      return "ngram";
    case SpecMethod::kDraftModel:
      return "draft_model";
    case SpecMethod::kMtp:
      return "mtp";
  }
  return "";
}

namespace {

Status Bad(const std::string& field, const std::string& why) {
  return InvalidArgument("--speculative-config: " + field + " " + why);
}

Result<int> IntField(const nlohmann::json& j, const char* field) {
  const nlohmann::json& v = j.at(field);
  if (!v.is_number_integer()) return Bad(field, "must be an integer, got " + v.dump());
  const int64_t x = v.get<int64_t>();
  if (x < 0 || x > (1 << 20)) return Bad(field, "out of range: " + v.dump());
  return static_cast<int>(x);
}

}  // namespace

Status ValidateSpeculativeConfig(const SpeculativeConfig& c) {
  if (c.method == SpecMethod::kNone) return OkStatus();
  const std::string k = std::to_string(c.num_speculative_tokens);
  if (c.num_speculative_tokens < 1 || c.num_speculative_tokens > kMaxSpeculativeTokens) {
    return Bad("num_speculative_tokens",
               "must be in [1, " + std::to_string(kMaxSpeculativeTokens) + "], got " + k);
  }
  if (c.method == SpecMethod::kNgram) {
    if (c.prompt_lookup_min < 1) {
      return Bad("prompt_lookup_min", "must be >= 1, got " + std::to_string(c.prompt_lookup_min));
    }
    if (c.prompt_lookup_max < c.prompt_lookup_min) {
      return Bad("prompt_lookup_max", "(" + std::to_string(c.prompt_lookup_max) +
                                          ") must be >= prompt_lookup_min (" +
                                          std::to_string(c.prompt_lookup_min) + ")");
    }
  }
  if (c.method == SpecMethod::kDraftModel && c.model.empty()) {
    return Bad("model", "is required for method \"draft_model\" (the draft checkpoint directory)");
  }
  return OkStatus();
}

Result<SpeculativeConfig> ParseSpeculativeConfig(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("--speculative-config: not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return InvalidArgument("--speculative-config: must be a JSON object");
  static const std::set<std::string> kKnown = {"method", "num_speculative_tokens", "model",
                                               "prompt_lookup_min", "prompt_lookup_max"};
  for (const auto& [key, value] : j.items()) {
    if (kKnown.count(key) == 0) return Bad("field \"" + key + "\"", "is not supported");
  }
  SpeculativeConfig c;
  if (!j.contains("method") || !j["method"].is_string()) {
    return Bad("method", "is required: \"ngram\", \"draft_model\" or \"mtp\"");
  }
  const std::string method = j["method"].get<std::string>();
  if (method == "ngram") {
    c.method = SpecMethod::kNgram;
  } else if (method == "draft_model") {
    c.method = SpecMethod::kDraftModel;
  } else if (method == "mtp" || method == "deepseek_mtp") {
    c.method = SpecMethod::kMtp;
  } else {
    return Bad("method", "\"" + method + "\" is not one of \"ngram\", \"draft_model\", \"mtp\"");
  }
  if (!j.contains("num_speculative_tokens")) return Bad("num_speculative_tokens", "is required");
  ASSIGN_OR_RETURN(c.num_speculative_tokens, IntField(j, "num_speculative_tokens"));
  if (j.contains("model")) {
    if (!j["model"].is_string()) return Bad("model", "must be a string");
    c.model = j["model"].get<std::string>();
  }
  const bool has_min = j.contains("prompt_lookup_min"), has_max = j.contains("prompt_lookup_max");
  if ((has_min || has_max) && c.method != SpecMethod::kNgram) {
    return Bad("prompt_lookup_min/max", "apply to method \"ngram\" only");
  }
  if (c.method == SpecMethod::kNgram) {
    c.prompt_lookup_min = c.prompt_lookup_max = 5;  // vLLM's default when neither is given
    if (has_min) {
      ASSIGN_OR_RETURN(c.prompt_lookup_min, IntField(j, "prompt_lookup_min"));
    }
    if (has_max) {
      ASSIGN_OR_RETURN(c.prompt_lookup_max, IntField(j, "prompt_lookup_max"));
    }
    if (has_min && !has_max) c.prompt_lookup_max = c.prompt_lookup_min;
    if (has_max && !has_min) c.prompt_lookup_min = c.prompt_lookup_max;
  }
  RETURN_IF_ERROR(ValidateSpeculativeConfig(c));
  return c;
}

std::vector<int32_t> NgramPropose(std::span<const int32_t> tokens, int min_n, int max_n, int k) {
  const int total = static_cast<int>(tokens.size());
  if (k <= 0 || min_n < 1 || total < min_n + 1) return {};
  // Longest n first; for each, the earliest start s < total - n where tokens[s, s + n) equals the
  // last n tokens (the match may overlap the suffix, as in vLLM).
  for (int n = std::min(max_n, total - 1); n >= min_n; --n) {
    const std::span<const int32_t> suffix = tokens.last(n);
    for (int s = 0; s + n < total; ++s) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + s)) continue;
      const int begin = s + n, end = std::min(total, begin + k);
      return std::vector<int32_t>(tokens.begin() + begin, tokens.begin() + end);
    }
  }
  return {};
}

RejectionResult RejectionSample(std::span<const double> p, std::span<const double> q, int32_t draft,
                                double u_accept, double u_resample) {
  PD_CHECK(p.size() == q.size() && draft >= 0 && size_t(draft) < p.size());
  const double pd = p[draft], qd = q[draft];
  PD_CHECK(qd > 0.0) << "draft token " << draft << " has no mass under the draft distribution";
  if (u_accept * qd < pd) return {draft, true};  // u < min(1, p/q)
  double total = 0.0;
  for (size_t i = 0; i < p.size(); ++i) total += std::max(p[i] - q[i], 0.0);
  if (total <= 0.0) return {draft, true};  // p == q: nothing to correct (rounding only)
  const double target = u_resample * total;
  double cum = 0.0;
  int32_t last = draft;
  for (size_t i = 0; i < p.size(); ++i) {
    const double r = std::max(p[i] - q[i], 0.0);
    if (r <= 0.0) continue;
    last = static_cast<int32_t>(i);
    cum += r;
    if (target < cum) return {last, false};
  }
  return {last, false};  // rounding: the last token with residual mass
}

SpecDecodeCounters& SpecDecodeCounters::operator+=(const SpecDecodeCounters& other) {
  num_drafts += other.num_drafts;
  num_draft_tokens += other.num_draft_tokens;
  num_accepted_tokens += other.num_accepted_tokens;
  num_draft_prompt_tokens += other.num_draft_prompt_tokens;
  if (accepted_per_pos.size() < other.accepted_per_pos.size()) {
    accepted_per_pos.resize(other.accepted_per_pos.size(), 0);
  }
  for (size_t j = 0; j < other.accepted_per_pos.size(); ++j) {
    accepted_per_pos[j] += other.accepted_per_pos[j];
  }
  return *this;
}

}  // namespace pd::engine
