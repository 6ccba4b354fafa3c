// Writes random-weight checkpoints in exactly the Hugging Face layout (config.json, safetensors,
// tokenizer.json, tokenizer_config.json): the test and benchmark models of pdserve.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "model/config.h"
#include "model/dtype.h"

namespace pd::model {

// Presets: "tiny", "small" (every arch), "qwen3-0.6b" (Qwen3-0.6B's shapes), "llama-1b"
// (TinyLlama-1.1B's). For qwen3_moe and deepseek_v3, tiny and small have both dense and MoE layers;
// deepseek_v3's have q_lora_rank > 0, yarn rope_scaling and one MTP layer. "deepseek-v3-1g"
// (deepseek_v3) and "qwen3-moe-1g" (qwen3_moe): DeepSeek-V3's and Qwen3-30B-A3B's proportions
// scaled to about 1 GB of bf16, for benchmarks.
Result<ModelConfig> PresetConfig(Arch arch, std::string_view preset);

struct SyntheticModelOptions {
  Arch arch = Arch::kQwen3;
  std::string preset = "tiny";
  DType dtype = DType::kBF16;
  uint64_t seed = 0;
  std::string out_dir;
  std::optional<int> num_kv_heads;  // overrides (tests sweep KV head counts)
  std::optional<int> num_layers;
  // qwen3_moe / deepseek_v3 overrides (the reference-logits tests sweep them).
  std::optional<int> q_lora_rank;               // deepseek_v3; 0: a plain q_proj
  std::optional<bool> yarn;                     // deepseek_v3; false: rope_scaling null
  std::optional<int> num_nextn_predict_layers;  // deepseek_v3 MTP layers
  std::optional<bool> rope_interleave;          // deepseek_v3
  std::optional<bool> norm_topk_prob;
  size_t max_shard_bytes = 0;  // 0: one model.safetensors; else sharded with an index
};

// Parameter counts of a config: `total` over RequiredTensors (MTP layers apart, in `mtp`), and
// `active` per token: total less the routed experts a token does not use in each MoE layer.
struct ParameterCounts {
  int64_t total = 0;
  int64_t active = 0;
  int64_t mtp = 0;
};
ParameterCounts CountParameters(const ModelConfig& config);

// Deterministic for a given options value. Weights are scaled so logits are far from uniform.
Status WriteSyntheticModel(const SyntheticModelOptions& options);

}  // namespace pd::model
