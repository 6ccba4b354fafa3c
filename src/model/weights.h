// The tensors of a Llama / Qwen2 / Qwen3 decoder, looked up by their HF names and validated against
// the config: every tensor present, with the expected shape, and one floating dtype throughout.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace pd::model {

struct LayerWeights {
  TensorView input_norm;  // (hidden)                model.layers.i.input_layernorm.weight
  TensorView q_proj;      // (num_heads*head_dim, hidden)
  TensorView k_proj;      // (num_kv_heads*head_dim, hidden)
  TensorView v_proj;      // (num_kv_heads*head_dim, hidden)
  std::optional<TensorView> q_bias, k_bias, v_bias;  // (q_size) / (kv_size): attention_bias
  std::optional<TensorView> o_bias;  // (hidden): attention_bias on llama/qwen3 (HF puts a bias
                                     // on o_proj too there; qwen2 never has one)
  std::optional<TensorView> q_norm, k_norm;  // (head_dim): qk_norm (qwen3)
  TensorView o_proj;                         // (hidden, num_heads*head_dim)
  TensorView post_norm;  // (hidden)                post_attention_layernorm.weight
  TensorView gate_proj;  // (intermediate, hidden)
  TensorView up_proj;    // (intermediate, hidden)
  TensorView down_proj;  // (hidden, intermediate)
};

struct ModelWeights {
  ModelConfig config;
  DType dtype = DType::kF32;  // the dtype of every tensor
  TensorView embed_tokens;    // (vocab, hidden)
  std::vector<LayerWeights> layers;
  TensorView final_norm;                   // (hidden)                model.norm.weight
  TensorView lm_head;                      // (vocab, hidden): embed_tokens when tie_word_embeddings
  std::unique_ptr<Checkpoint> checkpoint;  // owns the mapped memory the views point into
};

// Loads DIR/config.json and the checkpoint, and checks every tensor. Errors name the file, the
// tensor and what was expected, e.g.
// "model.safetensors: model.layers.3.mlp.up_proj.weight: expected shape [64, 32], found [64, 31]".
Result<ModelWeights> LoadModelWeights(const std::string& model_dir);

// The HF names and shapes a config requires, in checkpoint order (used by the loader, the
// synthetic writer and the handshake hash).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<TensorSpec> RequiredTensors(const ModelConfig& config);
// HF's LlamaAttention and Qwen3Attention build o_proj with bias=attention_bias; Qwen2's never has
// one.
bool HasOutputBias(const ModelConfig& config);

}  // namespace pd::model
