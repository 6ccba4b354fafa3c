// The tensors of a Llama / Qwen2 / Qwen3 / Qwen3-MoE / DeepSeek-V3 decoder, looked up by their HF
// names and validated against the config: every tensor present, with the expected shape, and one
// floating dtype throughout (except deepseek_v3's e_score_correction_bias, which checkpoints keep
// in f32 whatever the rest is).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/kv_scales.h"
#include "model/safetensors.h"

namespace pd::model {

// One SwiGLU MLP: a dense layer's mlp, a routed expert (mlp.experts.{e}.) or the shared expert
// (mlp.shared_experts.).
struct MlpWeights {
  TensorView gate_proj;  // (inter, hidden)   gate_proj.weight
  TensorView up_proj;    // (inter, hidden)   up_proj.weight
  TensorView down_proj;  // (hidden, inter)   down_proj.weight
};

// The sparse MoE block of a layer (ModelConfig::IsMoeLayer).
struct MoeWeights {
  TensorView router;                        // (num_experts, hidden)  mlp.gate.weight
  std::optional<TensorView> router_bias;    // (num_experts) mlp.gate.e_score_correction_bias:
                                            // deepseek_v3, any float dtype
  std::vector<MlpWeights> experts;          // num_experts, mlp.experts.{e}.
  std::optional<MlpWeights> shared_expert;  // mlp.shared_experts.: deepseek_v3 n_shared_experts > 0
};

// Multi-head Latent Attention of a deepseek_v3 layer (self_attn.).
struct MlaWeights {
  // q_lora_rank > 0: q_a_proj (q_lora_rank, hidden), q_a_layernorm (q_lora_rank), q_b_proj
  // (num_heads*qk_head_dim, q_lora_rank); else q_proj (num_heads*qk_head_dim, hidden).
  std::optional<TensorView> q_proj, q_a_proj, q_a_norm, q_b_proj;
  TensorView kv_a_proj;  // (kv_lora_rank + qk_rope_head_dim, hidden) kv_a_proj_with_mqa.weight
  TensorView kv_a_norm;  // (kv_lora_rank)                            kv_a_layernorm.weight
  TensorView kv_b_proj;  // (num_heads*(qk_nope_head_dim + v_head_dim), kv_lora_rank)
  TensorView o_proj;     // (hidden, num_heads*v_head_dim)
};

struct LayerWeights {
  TensorView input_norm;  // (hidden)                model.layers.i.input_layernorm.weight
  // GQA attention (every arch but deepseek_v3): q/k/v/o below. deepseek_v3: `mla` instead, and
  // q/k/v/o_proj are empty views.
  TensorView q_proj;                                 // (num_heads*head_dim, hidden)
  TensorView k_proj;                                 // (num_kv_heads*head_dim, hidden)
  TensorView v_proj;                                 // (num_kv_heads*head_dim, hidden)
  std::optional<TensorView> q_bias, k_bias, v_bias;  // (q_size) / (kv_size): attention_bias
  std::optional<TensorView> o_bias;  // (hidden): attention_bias on llama/qwen3 (HF puts a bias
                                     // on o_proj too there; qwen2 never has one)
  std::optional<TensorView> q_norm, k_norm;  // (head_dim): qk_norm (qwen3)
  TensorView o_proj;                         // (hidden, num_heads*head_dim)
  std::optional<MlaWeights> mla;             // deepseek_v3
  TensorView post_norm;  // (hidden)                post_attention_layernorm.weight
  // The dense MLP (intermediate_size); empty views on a MoE layer, which has `moe` instead.
  TensorView gate_proj;  // (intermediate, hidden)
  TensorView up_proj;    // (intermediate, hidden)
  TensorView down_proj;  // (hidden, intermediate)
  std::optional<MoeWeights> moe;
};

// A deepseek_v3 multi-token-prediction layer, model.layers.{num_hidden_layers + i}.: loaded,
// validated and kept for speculative decoding; the forward pass does not run it.
struct MtpWeights {
  TensorView embed_tokens;      // (vocab, hidden)     embed_tokens.weight
  TensorView enorm, hnorm;      // (hidden)            enorm.weight, hnorm.weight
  TensorView eh_proj;           // (hidden, 2*hidden)  eh_proj.weight
  LayerWeights layer;           // the decoder layer's own tensors (MLA, MoE)
  TensorView shared_head_norm;  // (hidden)            shared_head.norm.weight
  TensorView shared_head_head;  // (vocab, hidden)     shared_head.head.weight
};

struct ModelWeights {
  ModelConfig config;
  DType dtype = DType::kF32;  // the dtype of every tensor (FP8: of those not quantised)
  bool fp8 = false;           // some linear weights are F8_E4M3 (their views carry scale_inv)
  TensorView embed_tokens;    // (vocab, hidden)
  std::vector<LayerWeights> layers;
  TensorView final_norm;  // (hidden)                model.norm.weight
  TensorView lm_head;     // (vocab, hidden): embed_tokens when tie_word_embeddings
  // deepseek_v3 with num_nextn_predict_layers > 0 and the layers in the checkpoint; empty when the
  // checkpoint has none (it loads without them).
  std::vector<MtpWeights> mtp;
  // One per layer: the FP8 KV-cache scales the checkpoint carries, else 1.0 (kv_scales.h).
  std::vector<KvScales> kv_scales;
  std::unique_ptr<Checkpoint> checkpoint;  // owns the mapped memory the views point into
};

// Loads DIR/config.json and the checkpoint, and checks every tensor. An FP8 checkpoint (config
// quantization_config) may store each fp8_quantizable weight as F8_E4M3, whose `_scale_inv` must
// then be present, f32 and of ScaleInvShape; errors name the weight. Errors name the file, the
// tensor and what was expected, e.g.
// "model.safetensors: model.layers.3.mlp.up_proj.weight: expected shape [64, 32], found [64, 31]".
Result<ModelWeights> LoadModelWeights(const std::string& model_dir);

// The HF names and shapes a config requires, in checkpoint order (used by the loader, the
// synthetic writer and the handshake hash).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  // A linear layer's weight (n, k) that FP8 checkpoints store as F8_E4M3 plus `<name>_scale_inv`
  // (attention and MLP projections, experts, eh_proj); false for what they keep in bf16
  // (embeddings, norms, biases, the MoE router, lm_head).
  bool fp8_quantizable = false;
};
// The name of a quantised weight's block scales: "<name>_scale_inv".
std::string ScaleInvName(const std::string& weight_name);
// The shape of W (n, k)'s block scales: (ceil(n/128), ceil(k/128)).
std::vector<int64_t> ScaleInvShape(const std::vector<int64_t>& weight_shape);
// Everything but the MTP layers: those are optional (see MtpTensors), and leaving them out keeps
// the handshake fingerprint of one config the same whether or not a checkpoint carries them (the
// forward pass, and so the KV cache, does not depend on them).
std::vector<TensorSpec> RequiredTensors(const ModelConfig& config);
// The tensors of the config's num_nextn_predict_layers MTP layers (deepseek_v3), in checkpoint
// order: a checkpoint has all of them or none.
std::vector<TensorSpec> MtpTensors(const ModelConfig& config);
// HF's LlamaAttention and Qwen3Attention build o_proj with bias=attention_bias; Qwen2's never has
// one.
bool HasOutputBias(const ModelConfig& config);

}  // namespace pd::model
