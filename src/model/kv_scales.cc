#include "model/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

namespace pd::model {
namespace {

// The scale called `name`, nullopt when the checkpoint has none.
Result<std::optional<float>> ReadScale(const Checkpoint& ckpt, const std::string& name) {
  if (ckpt.FileOf(name).empty()) return std::optional<float>();
  ASSIGN_OR_RETURN(TensorView t, ckpt.Get(name));
  const std::string where = ckpt.FileOf(name) + ": " + name;
  if (t.numel() != 1)
    return InvalidArgument(where + ": expected one element (a per-tensor KV scale), found " +
                           std::to_string(t.numel()));
  if (t.dtype == DType::kF8E4M3)
    return InvalidArgument(where + ": a KV scale must be F32, BF16 or F16, found F8_E4M3");
  const float v = t.At(0);
  if (!std::isfinite(v) || v <= 0.0f)
    return InvalidArgument(where + ": KV scale " + std::to_string(v) +
                           " is not positive and finite");
  return std::optional<float>(v);
}

}  // namespace

std::string KvScaleName(int layer, bool v) {
  return "model.layers." + std::to_string(layer) + ".self_attn." + (v ? "v_scale" : "k_scale");
}

Result<std::vector<KvScales>> LoadKvScales(const Checkpoint& ckpt, int num_layers) {
  std::vector<KvScales> out(static_cast<size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    ASSIGN_OR_RETURN(std::optional<float> k, ReadScale(ckpt, KvScaleName(l, false)));
    ASSIGN_OR_RETURN(std::optional<float> v, ReadScale(ckpt, KvScaleName(l, true)));
    if (!k && !v) continue;
    out[l].k_scale = k ? *k : *v;
    out[l].v_scale = v ? *v : *k;
  }
  return out;
}

std::string DescribeKvScales(const std::vector<KvScales>& scales) {
  const bool all_one =
      std::all_of(scales.begin(), scales.end(), [](const KvScales& s) { return s == KvScales{}; });
  if (all_one)
    return "k_scale/v_scale 1.0 on every layer (the checkpoint carries none: values beyond "
           "+-448 saturate, as vLLM warns)";
  float kmin = scales[0].k_scale, kmax = kmin, vmin = scales[0].v_scale, vmax = vmin;
  for (const KvScales& s : scales) {
    kmin = std::min(kmin, s.k_scale);
    kmax = std::max(kmax, s.k_scale);
    vmin = std::min(vmin, s.v_scale);
    vmax = std::max(vmax, s.v_scale);
  }
  char text[160];
  std::snprintf(text, sizeof(text),
                "the checkpoint's k_scale/v_scale, k_scale %.3g..%.3g, v_scale %.3g..%.3g over %zu "
                "layers",
                kmin, kmax, vmin, vmax, scales.size());
  return text;
}

}  // namespace pd::model
