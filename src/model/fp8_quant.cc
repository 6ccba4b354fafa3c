#include "model/fp8_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/file_util.h"
#include "model/dtype.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace pd::model {

void QuantizeFp8Blocks(const float* w, int64_t n, int64_t k, uint8_t* q, float* scale_inv) {
  const int64_t bn = (n + kFp8BlockSize - 1) / kFp8BlockSize;
  const int64_t bk = (k + kFp8BlockSize - 1) / kFp8BlockSize;
  for (int64_t i = 0; i < bn; ++i)
    for (int64_t j = 0; j < bk; ++j) {
      const int64_t r0 = i * kFp8BlockSize, r1 = std::min(n, r0 + kFp8BlockSize);
      const int64_t c0 = j * kFp8BlockSize, c1 = std::min(k, c0 + kFp8BlockSize);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * k + c]));
      const float s = amax > 0 ? amax / kFp8E4m3Max : 1.0f;
      scale_inv[i * bk + j] = s;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) q[r * k + c] = F32ToFp8E4m3(w[r * k + c] / s);
    }
}

namespace {

// The tensors of the output, in the input's order, each quantised weight followed by its scales.
struct Plan {
  std::vector<NamedTensor> tensors;
  std::vector<std::string> sources;  // the input tensor each output tensor comes from
};

Result<Plan> MakePlan(const ModelConfig& c, const Checkpoint& ckpt) {
  std::map<std::string, bool> quantizable;
  for (const std::vector<TensorSpec>& specs : {RequiredTensors(c), MtpTensors(c)})
    for (const TensorSpec& t : specs) quantizable[t.name] = t.fp8_quantizable;
  Plan plan;
  for (const std::string& name : ckpt.Names()) {
    ASSIGN_OR_RETURN(TensorView t, ckpt.Get(name));
    if (t.dtype == DType::kF8E4M3)
      return InvalidArgument(ckpt.FileOf(name) + ": " + name + " is already F8_E4M3");
    auto it = quantizable.find(name);
    if (it != quantizable.end() && it->second) {
      plan.tensors.push_back({name, DType::kF8E4M3, t.shape, {}});
      plan.sources.push_back(name);
      plan.tensors.push_back({ScaleInvName(name), DType::kF32, ScaleInvShape(t.shape), {}});
      plan.sources.push_back(name);
      continue;
    }
    const bool keep_f32 = name.ends_with("e_score_correction_bias");
    plan.tensors.push_back({name, keep_f32 ? t.dtype : DType::kBF16, t.shape, {}});
    plan.sources.push_back(name);
  }
  return plan;
}

Status CopyOtherFiles(const std::string& in, const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(in, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name.ends_with(".safetensors") ||
        name == "model.safetensors.index.json")
      continue;
    fs::copy_file(e.path(), fs::path(out) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return IoError(e.path().string() + ": copy to " + out + " failed: " + ec.message());
  }
  if (ec) return IoError(in + ": cannot list: " + ec.message());
  return OkStatus();
}

Status WriteConfig(const std::string& in, const std::string& out) {
  const std::string path = in + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument(path + ": not a JSON object");
  ModelConfig q;
  q.fp8.enabled = true;
  nlohmann::json quant = nlohmann::json::parse(ModelConfigToJson(q), nullptr, false);
  j["quantization_config"] = quant["quantization_config"];
  j["torch_dtype"] = "bfloat16";
  if (j.contains("dtype")) j["dtype"] = "bfloat16";
  return WriteStringToFile(out + "/config.json", j.dump(2) + "\n");
}

}  // namespace

Status QuantizeCheckpoint(const QuantizeOptions& o) {
  if (o.out_dir.empty()) return InvalidArgument("quantize: no output directory given");
  std::error_code ec;
  if (std::filesystem::equivalent(o.model_dir, o.out_dir, ec))
    return InvalidArgument("quantize: the output directory is the input " + o.model_dir);
  ASSIGN_OR_RETURN(ModelWeights w, LoadModelWeights(o.model_dir));  // validates the input
  if (w.config.fp8.enabled)
    return InvalidArgument(o.model_dir + "/config.json: already has an FP8 quantization_config");
  const Checkpoint& ckpt = *w.checkpoint;
  ASSIGN_OR_RETURN(Plan plan, MakePlan(w.config, ckpt));
  std::vector<float> f32;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::string quantised;  // the weight codes/scales hold (a weight's scales follow it)
  auto quantise = [&](const TensorView& src, const std::string& name) {
    if (quantised == name) return;
    const int64_t n = src.shape[0], k = src.shape[1];
    f32.resize(n * k);
    for (int64_t e = 0; e < n * k; ++e) f32[e] = src.At(e);
    codes.resize(n * k);
    scales.resize(((n + kFp8BlockSize - 1) / kFp8BlockSize) *
                  ((k + kFp8BlockSize - 1) / kFp8BlockSize));
    QuantizeFp8Blocks(f32.data(), n, k, codes.data(), scales.data());
    quantised = name;
  };
  auto fill = [&](size_t i, std::vector<uint8_t>* bytes) -> Status {
    const NamedTensor& out = plan.tensors[i];
    ASSIGN_OR_RETURN(TensorView src, ckpt.Get(plan.sources[i]));
    const int64_t numel = src.numel();
    if (out.dtype == DType::kF8E4M3) {
      quantise(src, plan.sources[i]);
      *bytes = codes;
      return OkStatus();
    }
    if (out.name != plan.sources[i]) {  // a weight's scales
      quantise(src, plan.sources[i]);
      bytes->resize(scales.size() * sizeof(float));
      std::memcpy(bytes->data(), scales.data(), bytes->size());
      return OkStatus();
    }
    bytes->resize(numel * DTypeSize(out.dtype));
    for (int64_t e = 0; e < numel; ++e) {
      const float v = src.At(e);
      if (out.dtype == DType::kBF16) {
        const uint16_t b = F32ToBf16(v);
        std::memcpy(bytes->data() + 2 * e, &b, 2);
      } else if (out.dtype == DType::kF16) {
        const uint16_t h = F32ToF16(v);
        std::memcpy(bytes->data() + 2 * e, &h, 2);
      } else {
        std::memcpy(bytes->data() + 4 * e, &v, 4);
      }
    }
    return OkStatus();
  };
  RETURN_IF_ERROR(WriteCheckpointStreaming(o.out_dir, plan.tensors, o.max_shard_bytes, fill));
  RETURN_IF_ERROR(CopyOtherFiles(o.model_dir, o.out_dir));
  return WriteConfig(o.model_dir, o.out_dir);
}

}  // namespace pd::model
