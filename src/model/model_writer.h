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

// Presets: "tiny", "small", "qwen3-0.6b" (Qwen3-0.6B's shapes), "llama-1b" (TinyLlama-1.1B's).
Result<ModelConfig> PresetConfig(Arch arch, std::string_view preset);

struct SyntheticModelOptions {
  Arch arch = Arch::kQwen3;
  std::string preset = "tiny";
  DType dtype = DType::kBF16;
  uint64_t seed = 0;
  std::string out_dir;
  std::optional<int> num_kv_heads;  // overrides (tests sweep KV head counts)
  std::optional<int> num_layers;
  size_t max_shard_bytes = 0;  // 0: one model.safetensors; else sharded with an index
};

// Deterministic for a given options value. Weights are scaled so logits are far from uniform.
Status WriteSyntheticModel(const SyntheticModelOptions& options);

}  // namespace pd::model
