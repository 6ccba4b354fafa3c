#include "model/config.h"

#include <nlohmann/json.hpp>
#include <string>

#include "common/file_util.h"
#include "model/config_fields.h"

namespace pd::model {
namespace {

using internal::FieldReader;
using internal::Json;
using internal::Positive;

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
  c->qk_norm = c->arch == Arch::kQwen3 || c->arch == Arch::kQwen3Moe;
  return OkStatus();
}

// Features that change the computation and that pdserve does not implement are refused rather
// than silently ignored.
// deepseek_v3's yarn rope_scaling is read (and other types refused) in config_moe.cc.
Status CheckUnsupported(Arch arch, const Json& root, const std::string& source) {
  const char* rope_key = internal::RopeScalingKey(root);
  if (arch != Arch::kDeepseekV3 && rope_key != nullptr) {
    return Unimplemented(source + ": " + rope_key + " " + root[rope_key].dump() +
                         " is not supported for " + std::string(ArchName(arch)) +
                         " (only plain RoPE)");
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
  if (arch == Arch::kDeepseekV3) {  // DeepseekV3Config's defaults
    c.max_position_embeddings = 4096;
    c.bos_token_id = 0;
    c.eos_token_id = 1;
  }
  return c;
}

constexpr const char* kSupported = "llama, qwen2, qwen3, qwen3_moe or deepseek_v3";

Result<ModelConfig> ParseJson(const Json& root, const std::string& source) {
  if (!root.is_object()) return InvalidArgument(source + ": expected a JSON object");
  if (!root.contains("model_type") || !root["model_type"].is_string()) {
    return InvalidArgument(source + ": missing \"model_type\" (expected " + kSupported + ")");
  }
  std::string model_type = root["model_type"].get<std::string>();
  Result<Arch> arch = ParseArch(model_type);
  if (!arch.ok()) {
    return InvalidArgument(source + ": unsupported model_type \"" + model_type +
                           "\" (supported: " + kSupported + ")");
  }
  RETURN_IF_ERROR(CheckUnsupported(*arch, root, source));
  ModelConfig c = Defaults(*arch);
  FieldReader reader(root, source);
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads"}) {
    if (!reader.Has(key)) return InvalidArgument(source + ": missing required field " + key);
  }
  RETURN_IF_ERROR(ReadFields(reader, &c));
  RETURN_IF_ERROR(internal::ReadQuantization(root, source, &c.fp8));
  // transformers v5 writes rope_theta inside rope_parameters.
  if (!reader.Has("rope_theta") && root.contains("rope_parameters") &&
      root["rope_parameters"].is_object()) {
    FieldReader rope(root["rope_parameters"], source, "rope_parameters.");
    RETURN_IF_ERROR(rope.Double("rope_theta", &c.rope_theta));
  }
  if (c.arch == Arch::kQwen3Moe || c.arch == Arch::kDeepseekV3) {
    RETURN_IF_ERROR(internal::ReadMoeFields(root, reader, &c));
  }
  if (!reader.Has("num_key_value_heads")) c.num_kv_heads = c.num_heads;
  if (!reader.Has("head_dim") && c.arch != Arch::kDeepseekV3) {
    // Qwen3Config's default head_dim is 128; the others (Qwen3MoeAttention included) derive it
    // from hidden_size.
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
  // The MoE/MLA checks first: deepseek_v3's head_dim is qk_rope_head_dim, named there.
  if (c.arch == Arch::kQwen3Moe || c.arch == Arch::kDeepseekV3) {
    RETURN_IF_ERROR(internal::ValidateMoe(c, source));
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
  if (model_type == "qwen3_moe") return Arch::kQwen3Moe;
  if (model_type == "deepseek_v3") return Arch::kDeepseekV3;
  return InvalidArgument("unknown arch \"" + std::string(model_type) + "\" (expected " +
                         kSupported + ")");
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
  if (c.arch != Arch::kDeepseekV3) j["head_dim"] = c.head_dim;  // derived there
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
  if (c.arch == Arch::kLlama) {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  } else if (c.arch != Arch::kDeepseekV3) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  if (c.arch == Arch::kQwen3Moe || c.arch == Arch::kDeepseekV3) internal::MoeFieldsToJson(c, &j);
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  internal::QuantizationToJson(c.fp8, &j);
  j["transformers_version"] = "4.51.0";
  return j.dump(2) + "\n";
}

}  // namespace pd::model
