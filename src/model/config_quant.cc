// quantization_config: the FP8 block quantisation of DeepSeek-V3's and Qwen3-FP8's checkpoints
// (transformers' FineGrainedFP8Config) is read; every other method is refused by name.
#include <string>

#include "model/config_fields.h"
#include "model/dtype.h"

namespace pd::model::internal {

Status ReadQuantization(const Json& root, const std::string& source, Fp8Quantization* out) {
  *out = Fp8Quantization{};
  if (!root.contains("quantization_config") || root["quantization_config"].is_null())
    return OkStatus();
  const Json& q = root["quantization_config"];
  const std::string where = source + ": quantization_config " + q.dump();
  if (!q.is_object()) return InvalidArgument(where + ": expected a JSON object");
  if (!q.contains("quant_method") || q["quant_method"] != "fp8")
    return Unimplemented(where + " is not supported (only quant_method \"fp8\")");
  if (q.contains("fmt") && !q["fmt"].is_null() && q["fmt"] != "e4m3")
    return Unimplemented(where + ": fmt " + q["fmt"].dump() + " is not supported (only \"e4m3\")");
  if (q.contains("activation_scheme") && !q["activation_scheme"].is_null() &&
      q["activation_scheme"] != "dynamic")
    return Unimplemented(where + ": activation_scheme " + q["activation_scheme"].dump() +
                         " is not supported (only \"dynamic\")");
  const Json block = q.contains("weight_block_size") ? q["weight_block_size"] : Json();
  const Json expected = Json::array({kFp8BlockSize, kFp8BlockSize});
  if (block != expected)
    return Unimplemented(where + ": weight_block_size " + block.dump() +
                         " is not supported (only [128, 128] blocks)");
  out->enabled = true;
  return OkStatus();
}

void QuantizationToJson(const Fp8Quantization& q, Json* j) {
  if (!q.enabled) return;
  (*j)["quantization_config"] = {{"activation_scheme", "dynamic"},
                                 {"fmt", "e4m3"},
                                 {"quant_method", "fp8"},
                                 {"weight_block_size", {kFp8BlockSize, kFp8BlockSize}}};
}

}  // namespace pd::model::internal
