// A model's shapes and hyper-parameters, parsed from Hugging Face config.json.
#pragma once

#include <string>

#include "common/status.h"

namespace pd::model {

enum class Arch { kLlama, kQwen2, kQwen3 };

std::string_view ArchName(Arch arch);  // "llama", "qwen2", "qwen3" (HF model_type)
Result<Arch> ParseArch(std::string_view model_type);

struct ModelConfig {
  Arch arch = Arch::kLlama;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;    // num_hidden_layers
  int num_heads = 0;     // num_attention_heads
  int num_kv_heads = 0;  // num_key_value_heads (defaults to num_heads)
  int head_dim = 0;      // head_dim (defaults to hidden_size / num_heads)
  int max_position_embeddings = 0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases: true for qwen2, llama's attention_bias flag
  bool qk_norm = false;         // per-head RMSNorm on q and k: qwen3
  int bos_token_id = -1;        // -1 when absent
  int eos_token_id = -1;        // first of a list when config.json gives several
  std::string torch_dtype;      // as written, e.g. "bfloat16"

  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
};

// Parses config.json text. `source` names the file in error messages.
Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source);
// Reads DIR/config.json.
Result<ModelConfig> LoadModelConfig(const std::string& model_dir);
// The config.json text HF would write for this config (used by make-model).
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace pd::model
