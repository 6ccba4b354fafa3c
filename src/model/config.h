// A model's shapes and hyper-parameters, parsed from Hugging Face config.json.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace pd::model {

enum class Arch { kLlama, kQwen2, kQwen3, kQwen3Moe, kDeepseekV3 };

// "llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3" (HF model_type)
std::string_view ArchName(Arch arch);
Result<Arch> ParseArch(std::string_view model_type);

// rope_scaling {"type" (or "rope_type"): "yarn", ...} as transformers' _compute_yarn_parameters
// reads it: `factor` as config.json gives it; original_max_position_embeddings (when given) sets
// the correction range (DeepSeek-V3 configs have max_position_embeddings == factor * original).
struct YarnScaling {
  double factor = 1.0;
  int original_max_position_embeddings = 0;  // 0: absent (max_position_embeddings is used)
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;            // 0: absent
  double mscale_all_dim = 0.0;    // 0: absent
  double attention_factor = 0.0;  // 0: absent (derived from mscale / mscale_all_dim)
  bool truncate = true;
};

// Sparse mixture-of-experts MLP (qwen3_moe, deepseek_v3). num_experts == 0: a dense model.
struct MoeConfig {
  enum class Scoring { kSoftmax, kSigmoid };  // qwen3_moe: softmax; deepseek_v3: scoring_func
  int num_experts = 0;                        // qwen3_moe num_experts; deepseek_v3 n_routed_experts
  int num_experts_per_tok = 0;                // top-k
  int moe_intermediate_size = 0;  // each routed expert's (and shared expert's unit) width
  bool norm_topk_prob = false;    // renormalise the top-k weights to sum to 1
  Scoring scoring = Scoring::kSoftmax;
  // qwen3_moe: layer i is sparse unless i is in mlp_only_layers, when (i+1) % decoder_sparse_step
  // == 0.
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  // deepseek_v3 (topk_method "noaux_tc"): experts in n_group groups, the topk_group best groups
  // (by the sum of their two best biased scores) eligible; selection on sigmoid scores plus the
  // router's e_score_correction_bias, weights from the unbiased scores, times
  // routed_scaling_factor. Layers below first_k_dense_replace are dense.
  int n_group = 1;
  int topk_group = 1;
  double routed_scaling_factor = 1.0;
  int n_shared_experts = 0;  // shared expert of width n_shared_experts * moe_intermediate_size
  int first_k_dense_replace = 0;
};

// Multi-head Latent Attention (deepseek_v3). kv_lora_rank == 0: not MLA.
struct MlaConfig {
  int q_lora_rank =
      0;  // 0 (null in config.json): plain q_proj; else q_a_proj/q_a_layernorm/q_b_proj
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool rope_interleave =
      true;  // rotary pairs (2i, 2i+1) as transformers applies it; false: (i, i+d/2)

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Values the latent KV cache holds per token per layer: the normalised latent, then the rotated
  // rope key.
  int latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

// quantization_config of an FP8 checkpoint (quant_method "fp8", fmt "e4m3", activation_scheme
// "dynamic", weight_block_size [128, 128]): its linear weights may be F8_E4M3 with block scales.
struct Fp8Quantization {
  bool enabled = false;
};

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
  // rope_scaling of type yarn (every DeepSeek-V3 config): yarn is true and yarn_scaling holds it.
  bool yarn = false;
  YarnScaling yarn_scaling;
  MoeConfig moe;
  // deepseek_v3: MLA shapes. num_kv_heads is num_heads and head_dim is qk_rope_head_dim there (as
  // transformers sets them); q_size()/kv_size() do not describe MLA projections.
  MlaConfig mla;
  int num_nextn_predict_layers = 0;  // deepseek_v3 MTP layers, under model.layers.{num_layers + i}.
  Fp8Quantization fp8;               // quantization_config, when the checkpoint is FP8

  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  bool is_moe() const { return moe.num_experts > 0; }
  // Whether decoder layer `layer`'s MLP is the sparse MoE block (qwen3_moe's decoder_sparse_step
  // and mlp_only_layers, deepseek_v3's first_k_dense_replace).
  bool IsMoeLayer(int layer) const;
};

// Parses config.json text. `source` names the file in error messages.
Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source);
// Reads DIR/config.json.
Result<ModelConfig> LoadModelConfig(const std::string& model_dir);
// The config.json text HF would write for this config (used by make-model).
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace pd::model
