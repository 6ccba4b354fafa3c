#include "model/config.h"

#include <nlohmann/json.hpp>
#include <string>

#include "common/file_util.h"

namespace pd::model {
namespace {

using Json = nlohmann::json;

// Reads one optional config.json field, with the error naming the file, the field and the value.
class FieldReader {
 public:
  FieldReader(const Json& root, const std::string& source) : root_(root), source_(source) {}

  bool Has(const char* key) const { return root_.contains(key) && !root_[key].is_null(); }

  Status Int(const char* key, int* out) const {
    if (!Has(key)) return OkStatus();
    return IntValue(key, root_[key], out);
  }

  Status Double(const char* key, double* out) const {
    if (!Has(key)) return OkStatus();
    const Json& v = root_[key];
    if (!v.is_number()) return Bad(key, "a number", v);
    *out = v.get<double>();
    return OkStatus();
  }

  Status Bool(const char* key, bool* out) const {
    if (!Has(key)) return OkStatus();
    const Json& v = root_[key];
    if (!v.is_boolean()) return Bad(key, "true or false", v);
    *out = v.get<bool>();
    return OkStatus();
  }

  Status String(const char* key, std::string* out) const {
    if (!Has(key)) return OkStatus();
    const Json& v = root_[key];
    if (!v.is_string()) return Bad(key, "a string", v);
    *out = v.get<std::string>();
    return OkStatus();
  }

  // An int, or a non-empty list of ints of which the first is taken (eos_token_id).
  Status IntOrFirstOfList(const char* key, int* out) const {
    if (!Has(key)) return OkStatus();
    const Json& v = root_[key];
    if (v.is_array()) {
      if (v.empty() || !v[0].is_number_integer())
        return Bad(key, "an integer or a list of them", v);
      return IntValue(key, v[0], out);
    }
    return Int(key, out);
  }

 private:
  // An unsigned JSON integer above INT64_MAX must not wrap to a negative int64 (-1 would read
  // as "absent" for a token id), so the range is checked on the stored kind.
  Status IntValue(const char* key, const Json& v, int* out) const {
    if (!v.is_number_integer()) return Bad(key, "an integer", v);
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() <= INT32_MAX
                          : v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
    if (!fits) return Bad(key, "an integer that fits in 32 bits", v);
    *out = static_cast<int>(v.get<int64_t>());
    return OkStatus();
  }

  Status Bad(const char* key, const char* expected, const Json& v) const {
    return InvalidArgument(source_ + ": " + key + " must be " + expected + ", found " + v.dump());
  }

  const Json& root_;
  const std::string& source_;
};

Status ReadFields(const FieldReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(r.Int("vocab_size", &c->vocab_size));
  RETURN_IF_ERROR(r.Int("hidden_size", &c->hidden_size));
  RETURN_IF_ERROR(r.Int("intermediate_size", &c->intermediate_size));
  RETURN_IF_ERROR(r.Int("num_hidden_layers", &c->num_layers));
  RETURN_IF_ERROR(r.Int("num_attention_heads", &c->num_heads));
  RETURN_IF_ERROR(r.Int("num_key_value_heads", &c->num_kv_heads));
  RETURN_IF_ERROR(r.Int("head_dim", &c->head_dim));
  RETURN_IF_ERROR(r.Int("max_position_embeddings", &c->max_position_embeddings));
  RETURN_IF_ERROR(r.Double("rope_theta", &c->rope_theta));
  RETURN_IF_ERROR(r.Double("rms_norm_eps", &c->rms_norm_eps));
  RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings));
  RETURN_IF_ERROR(r.IntOrFirstOfList("bos_token_id", &c->bos_token_id));
  RETURN_IF_ERROR(r.IntOrFirstOfList("eos_token_id", &c->eos_token_id));
  // Newer transformers write "dtype" instead of "torch_dtype".
  RETURN_IF_ERROR(r.String("dtype", &c->torch_dtype));
  RETURN_IF_ERROR(r.String("torch_dtype", &c->torch_dtype));
  if (c->arch == Arch::kQwen2) {
    c->attention_bias = true;  // Qwen2 always has q/k/v biases
  } else {
    RETURN_IF_ERROR(r.Bool("attention_bias", &c->attention_bias));
  }
  c->qk_norm = c->arch == Arch::kQwen3;
  return OkStatus();
}

// Features that change the computation and that pdserve does not implement are refused rather
// than silently ignored.
Status CheckUnsupported(const Json& root, const std::string& source) {
  if (root.contains("rope_scaling") && !root["rope_scaling"].is_null()) {
    return Unimplemented(source + ": rope_scaling " + root["rope_scaling"].dump() +
                         " is not supported (only plain RoPE)");
  }
  if (root.contains("hidden_act") && root["hidden_act"] != "silu") {
    return Unimplemented(source + ": hidden_act " + root["hidden_act"].dump() +
                         " is not supported (only \"silu\")");
  }
  if (root.contains("use_sliding_window") && root["use_sliding_window"] == true) {
    return Unimplemented(source + ": use_sliding_window true is not supported");
  }
  return OkStatus();
}

Status Positive(const std::string& source, const char* key, int value) {
  if (value > 0) return OkStatus();
  return InvalidArgument(source + ": " + key + " must be positive, found " + std::to_string(value));
}

Status Positive(const std::string& source, const char* key, double value) {
  if (value > 0) return OkStatus();
  return InvalidArgument(source + ": " + key + " must be positive, found " + Json(value).dump());
}

Status Validate(const ModelConfig& c, const std::string& source) {
  RETURN_IF_ERROR(Positive(source, "vocab_size", c.vocab_size));
  RETURN_IF_ERROR(Positive(source, "hidden_size", c.hidden_size));
  RETURN_IF_ERROR(Positive(source, "intermediate_size", c.intermediate_size));
  RETURN_IF_ERROR(Positive(source, "num_hidden_layers", c.num_layers));
  RETURN_IF_ERROR(Positive(source, "num_attention_heads", c.num_heads));
  RETURN_IF_ERROR(Positive(source, "num_key_value_heads", c.num_kv_heads));
  RETURN_IF_ERROR(Positive(source, "head_dim", c.head_dim));
  RETURN_IF_ERROR(Positive(source, "max_position_embeddings", c.max_position_embeddings));
  RETURN_IF_ERROR(Positive(source, "rope_theta", c.rope_theta));
  RETURN_IF_ERROR(Positive(source, "rms_norm_eps", c.rms_norm_eps));
  if (c.num_heads % c.num_kv_heads != 0) {
    return InvalidArgument(source + ": num_key_value_heads (" + std::to_string(c.num_kv_heads) +
                           ") must divide num_attention_heads (" + std::to_string(c.num_heads) +
                           ")");
  }
  // q_size() and kv_size() are ints: their products must not overflow.
  if (int64_t{c.num_heads} * c.head_dim > INT32_MAX) {
    return InvalidArgument(source + ": num_attention_heads (" + std::to_string(c.num_heads) +
                           ") x head_dim (" + std::to_string(c.head_dim) +
                           ") does not fit in 32 bits");
  }
  if (c.head_dim % 2 != 0) {
    return InvalidArgument(source + ": head_dim (" + std::to_string(c.head_dim) +
                           ") must be even for RoPE");
  }
  for (int id : {c.bos_token_id, c.eos_token_id}) {
    if (id < -1 || id >= c.vocab_size) {
      return InvalidArgument(source + ": token id " + std::to_string(id) +
                             " (bos_token_id/eos_token_id) is outside the vocabulary [0, " +
                             std::to_string(c.vocab_size) + ")");
    }
  }
  return OkStatus();
}

// HF's defaults for fields a config.json may omit.
ModelConfig Defaults(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.num_kv_heads = 0;  // 0: resolved to num_heads after parsing
  c.head_dim = 0;      // 0: resolved after parsing
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.max_position_embeddings = arch == Arch::kLlama ? 2048 : 32768;
  return c;
}

Result<ModelConfig> ParseJson(const Json& root, const std::string& source) {
  if (!root.is_object()) return InvalidArgument(source + ": expected a JSON object");
  if (!root.contains("model_type") || !root["model_type"].is_string()) {
    return InvalidArgument(source + ": missing \"model_type\" (expected llama, qwen2 or qwen3)");
  }
  std::string model_type = root["model_type"].get<std::string>();
  Result<Arch> arch = ParseArch(model_type);
  if (!arch.ok()) {
    return InvalidArgument(source + ": unsupported model_type \"" + model_type +
                           "\" (supported: llama, qwen2, qwen3)");
  }
  RETURN_IF_ERROR(CheckUnsupported(root, source));
  ModelConfig c = Defaults(*arch);
  FieldReader reader(root, source);
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads"}) {
    if (!reader.Has(key)) return InvalidArgument(source + ": missing required field " + key);
  }
  RETURN_IF_ERROR(ReadFields(reader, &c));
  if (!reader.Has("num_key_value_heads")) c.num_kv_heads = c.num_heads;
  if (!reader.Has("head_dim")) {
    // Qwen3Config's default head_dim is 128; the others derive it from hidden_size.
    if (c.arch == Arch::kQwen3) {
      c.head_dim = 128;
    } else {
      if (c.num_heads <= 0 || c.hidden_size % c.num_heads != 0) {
        return InvalidArgument(source + ": hidden_size (" + std::to_string(c.hidden_size) +
                               ") must be a multiple of num_attention_heads (" +
                               std::to_string(c.num_heads) + ") when head_dim is absent");
      }
      c.head_dim = c.hidden_size / c.num_heads;
    }
  }
  RETURN_IF_ERROR(Validate(c, source));
  return c;
}

}  // namespace

std::string_view ArchName(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "llama";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
    case Arch::kQwen3Moe:
      return "qwen3_moe";
    case Arch::kDeepseekV3:
      return "deepseek_v3";
  }
  return "?";
}

bool ModelConfig::IsMoeLayer(int layer) const {
  if (!is_moe()) return false;
  if (arch == Arch::kDeepseekV3) return layer >= moe.first_k_dense_replace;
  for (int l : moe.mlp_only_layers)
    if (l == layer) return false;
  return moe.decoder_sparse_step > 0 && (layer + 1) % moe.decoder_sparse_step == 0;
}

Result<Arch> ParseArch(std::string_view model_type) {
  if (model_type == "llama") return Arch::kLlama;
  if (model_type == "qwen2") return Arch::kQwen2;
  if (model_type == "qwen3") return Arch::kQwen3;
  return InvalidArgument("unknown arch \"" + std::string(model_type) +
                         "\" (expected llama, qwen2 or qwen3)");
}

Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source) {
  Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgument(source + ": not valid JSON");
  try {
    return ParseJson(root, source);
  } catch (const std::exception& e) {  // a JSON type surprise not caught above
    return InvalidArgument(source + ": " + e.what());
  }
}

Result<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  std::string path = model_dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseModelConfig(text, path);
}

std::string ModelConfigToJson(const ModelConfig& c) {
  static constexpr const char* kArchitectures[] = {"LlamaForCausalLM", "Qwen2ForCausalLM",
                                                   "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                                                   "DeepseekV3ForCausalLM"};
  Json j;
  j["architectures"] = {kArchitectures[static_cast<int>(c.arch)]};
  j["model_type"] = std::string(ArchName(c.arch));
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  if (c.arch != Arch::kQwen2) j["attention_bias"] = c.attention_bias;
  if (c.arch != Arch::kLlama) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  } else {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  j["transformers_version"] = "4.51.0";
  return j.dump(2) + "\n";
}

}  // namespace pd::model
