// FP8 block quantisation as DeepSeek-V3's and Qwen3-FP8's checkpoints store it: per 128x128 block
// of W (n, k) (edge blocks partial), scale_inv = amax / 448 and q = e4m3(W / scale_inv), so that
// W ~ q * scale_inv. `pdserve quantize` and `make-model --dtype fp8` write such checkpoints.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace pd::model {

// W (n, k) f32 -> q (n, k) e4m3 codes and scale_inv (ceil(n/128), ceil(k/128)). An all-zero block
// gets scale_inv 1 (its codes are 0).
void QuantizeFp8Blocks(const float* w, int64_t n, int64_t k, uint8_t* q, float* scale_inv);

struct QuantizeOptions {
  std::string model_dir;  // a bf16/f32/f16 checkpoint pdserve loads
  std::string out_dir;
  size_t max_shard_bytes = 0;  // 0: one model.safetensors
};

// Writes model_dir's checkpoint with every fp8_quantizable weight (weights.h) as F8_E4M3 plus its
// `_scale_inv`, the other tensors as bf16 (deepseek_v3's e_score_correction_bias stays f32), and
// config.json with quantization_config and torch_dtype "bfloat16"; the tokenizer and every other
// file are copied. Refuses a checkpoint that is already quantised.
Status QuantizeCheckpoint(const QuantizeOptions& options);

}  // namespace pd::model
