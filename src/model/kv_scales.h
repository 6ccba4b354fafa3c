// The FP8 KV-cache scales of each attention layer, as vLLM reads them from a checkpoint: a cache
// of dtype fp8_e4m3 stores e4m3(K / k_scale) and e4m3(V / v_scale) and reads code * scale back
// (an MLA latent row: k_scale). Checkpoints quantised with a calibrated KV cache carry them as
// model.layers.{i}.self_attn.k_scale / v_scale (one element each); others do not, and the scales
// are then 1.0.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "model/safetensors.h"

namespace pd::model {

struct KvScales {
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  bool operator==(const KvScales&) const = default;
};

// The names vLLM loads a layer's scales from.
std::string KvScaleName(int layer, bool v);  // model.layers.{layer}.self_attn.{k,v}_scale

// One KvScales per layer (num_layers of them). Per layer, as vLLM decides: both tensors present:
// their values; neither: 1.0; one: both take its value (vLLM's single kv_scale). A tensor with
// more than one element (a per-head scale vLLM refuses too), of dtype F8_E4M3, or not positive and
// finite is InvalidArgument naming the file and tensor.
Result<std::vector<KvScales>> LoadKvScales(const Checkpoint& ckpt, int num_layers);

// For the log line of an fp8_e4m3 cache: "k_scale/v_scale 1.0 on every layer (the checkpoint
// carries none: values beyond +-448 saturate, as vLLM warns)" or "the checkpoint's k_scale/v_scale,
// k_scale 0.021..0.034, v_scale 0.008..0.012 over 16 layers".
std::string DescribeKvScales(const std::vector<KvScales>& scales);

}  // namespace pd::model
