// Internal to config*.cc: typed reads of config.json fields whose errors name the file, the field
// and the value, shared by the dense parser (config.cc) and the MoE/MLA one (config_moe.cc).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"

namespace pd::model::internal {

using Json = nlohmann::json;

// Reads optional fields of one JSON object: an absent or null field leaves *out as it was.
// `prefix` is put before field names in errors ("rope_scaling." for the nested object).
class FieldReader {
 public:
  FieldReader(const Json& root, const std::string& source, std::string prefix = "")
      : root_(root), source_(source), prefix_(std::move(prefix)) {}

  bool Has(const char* key) const { return root_.contains(key) && !root_[key].is_null(); }

  Status Int(const char* key, int* out) const;
  Status Double(const char* key, double* out) const;
  Status Bool(const char* key, bool* out) const;
  Status String(const char* key, std::string* out) const;
  // An int, or a non-empty list of ints of which the first is taken (eos_token_id).
  Status IntOrFirstOfList(const char* key, int* out) const;
  // A list of ints (mlp_only_layers).
  Status IntList(const char* key, std::vector<int>* out) const;

  // "SOURCE: PREFIXkey must be EXPECTED, found VALUE".
  Status Bad(const char* key, const char* expected, const Json& v) const;
  // "PREFIXkey" as errors name it.
  std::string Name(const char* key) const { return prefix_ + key; }
  const std::string& source() const { return source_; }

 private:
  Status IntValue(const char* key, const Json& v, int* out) const;

  const Json& root_;
  const std::string& source_;
  std::string prefix_;
};

// The key of the config's RoPE scaling object, or nullptr when it has none: "rope_scaling" when not
// null, else "rope_parameters" (how transformers v5 writes RoPE: rope_type, rope_theta and the
// scaling fields in one object) unless its rope_type is "default".
const char* RopeScalingKey(const Json& root);

Status Positive(const std::string& source, const std::string& key, int value);
Status Positive(const std::string& source, const std::string& key, double value);

// config_quant.cc: quantization_config (FP8 block quantisation, or absent) into *out, and back.
Status ReadQuantization(const Json& root, const std::string& source, Fp8Quantization* out);
void QuantizationToJson(const Fp8Quantization& q, Json* j);

// config_moe.cc: the qwen3_moe / deepseek_v3 fields (MoE, MLA, yarn rope_scaling). ReadMoeFields
// runs after the common fields are read; ValidateMoe after the common checks.
Status ReadMoeFields(const Json& root, const FieldReader& r, ModelConfig* c);
Status ValidateMoe(const ModelConfig& c, const std::string& source);
// Adds the qwen3_moe / deepseek_v3 keys HF's config.json has to `j`.
void MoeFieldsToJson(const ModelConfig& c, Json* j);

}  // namespace pd::model::internal
