#include "model/model_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/file_util.h"
#include "model/fp8_quant.h"
#include "model/model_writer_internal.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace pd::model {
namespace {

// Special tokens sit at the top of the vocabulary, where WriteSyntheticTokenizer puts them:
// qwen2/qwen3/qwen3_moe: <|endoftext|> V-3 (bos), <|im_start|> V-2, <|im_end|> V-1 (eos);
// llama: <|begin_of_text|> V-5 (bos), <|end_of_text|> V-4, ..., <|eot_id|> V-1 (eos);
// deepseek_v3: <｜begin▁of▁sentence｜> V-13 (bos), <｜end▁of▁sentence｜> V-12 (eos), ...
void SetSpecialTokenIds(ModelConfig* c) {
  const SpecialTokenIds ids = SyntheticSpecialTokenIds(c->arch, c->vocab_size);
  c->bos_token_id = ids.bos;
  c->eos_token_id = ids.eos;
}

ModelConfig Base(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.attention_bias = arch == Arch::kQwen2;
  c.qk_norm = arch == Arch::kQwen3 || arch == Arch::kQwen3Moe;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = arch == Arch::kLlama ? 500000.0 : 1000000.0;
  if (arch == Arch::kDeepseekV3) c.rope_theta = 10000.0;
  c.max_position_embeddings = 4096;
  // qwen2/llama/MoE presets exercise a separate lm_head (Qwen3-30B-A3B and DeepSeek-V3 untie).
  c.tie_word_embeddings = arch == Arch::kQwen3;
  return c;
}

const char* TorchDType(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF8E4M3:  // FP8 checkpoints: what is not quantised is bf16
      return "bfloat16";
  }
  return "?";
}

// splitmix64: fast, and good enough to make weights.
struct SplitMix64 {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Approximately N(0, 1): the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled.
  float Normal() {
    uint64_t r = Next();
    uint32_t sum = static_cast<uint32_t>((r & 0xffff) + ((r >> 16) & 0xffff) +
                                         ((r >> 32) & 0xffff) + (r >> 48));
    constexpr float kScale = 1.7320508f / 65536.0f;  // sqrt(12 / 4) per unit of 2^16
    return (static_cast<float>(sum) - 2.0f * 65535.0f) * kScale;
  }
};

uint64_t HashName(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// How one tensor is initialised: value = mean + std * N(0, 1).
struct Init {
  float mean = 0.0f;
  float std = 0.0f;
};

// Scales chosen so that (a) the final logits have a standard deviation of about kLogitStd, and
// (b) the residual stream stays bounded: the embedding contributes e and each of the 2L residual
// branches about kBranchTotal / sqrt(2L), so depth does not make activations grow.
// With tied embeddings the embedding is small (it is also lm_head), and the branches dominate so
// that the model does not simply repeat its input token.
Init InitFor(const ModelConfig& c, const std::string& name) {
  constexpr float kLogitStd = 4.0f;
  const float hidden = static_cast<float>(c.hidden_size);
  const float lm_head_std = kLogitStd / std::sqrt(hidden);
  const float branch_total = c.tie_word_embeddings ? 2.0f : 1.0f;
  const float branch = branch_total / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  if (EndsWith(name, "norm.weight")) return {1.0f, 0.1f};  // all RMSNorm weights
  // Router biases small and positive, so the grouped top-k sees no ties and no sign flips.
  if (EndsWith(name, "e_score_correction_bias")) return {0.1f, 0.025f};
  if (EndsWith(name, ".bias")) return {0.0f, 0.2f};
  if (name == "model.embed_tokens.weight")
    return {0.0f, c.tie_word_embeddings ? lm_head_std : 1.0f};
  if (name == "lm_head.weight" || EndsWith(name, "shared_head.head.weight"))
    return {0.0f, lm_head_std};
  // Router logits of rms ~2: the chosen experts differ from token to token, and clear margins
  // between them keep rounding from swapping two.
  if (EndsWith(name, "mlp.gate.weight")) return {0.0f, 2.0f / std::sqrt(hidden)};
  if (EndsWith(name, "o_proj.weight")) {
    const int in = c.is_mla() ? c.num_heads * c.mla.v_head_dim : c.q_size();
    return {0.0f, branch / std::sqrt(float(in))};
  }
  if (EndsWith(name, "down_proj.weight")) {
    // silu(g) * u has an rms of about 0.6 when g and u are N(0, 1). A MoE layer sums the routed
    // experts' outputs (weights summing to routed_scaling_factor at most) and the shared expert's.
    float inter = float(c.intermediate_size), share = 1.0f;
    if (name.find(".mlp.experts.") != std::string::npos) {
      inter = float(c.moe.moe_intermediate_size);
      share = float(0.7 / std::max(1.0, c.moe.routed_scaling_factor));
    } else if (name.find(".mlp.shared_experts.") != std::string::npos) {
      inter = float(c.moe.n_shared_experts) * float(c.moe.moe_intermediate_size);
      share = 0.7f;
    }
    return {0.0f, share * branch / (0.6f * std::sqrt(inter))};
  }
  // Projections that read something other than the hidden state: outputs of rms ~1.
  if (EndsWith(name, "q_b_proj.weight")) return {0.0f, 1.0f / std::sqrt(float(c.mla.q_lora_rank))};
  if (EndsWith(name, "kv_b_proj.weight"))
    return {0.0f, 1.0f / std::sqrt(float(c.mla.kv_lora_rank))};
  if (EndsWith(name, "eh_proj.weight")) return {0.0f, 1.0f / std::sqrt(2.0f * hidden)};
  return {0.0f, 1.0f / std::sqrt(hidden)};  // q/k/v/gate/up/q_a/kv_a: outputs of rms ~1
}

// Fills out[0, n) with values of one chunk; each chunk has its own random stream, so the result
// does not depend on how chunks are spread over threads.
void FillChunk(Init init, uint64_t stream, DType dtype, size_t n, uint8_t* out) {
  SplitMix64 rng{SplitMix64{stream}.Next()};
  if (dtype == DType::kF32) {
    float* o = reinterpret_cast<float*>(out);
    for (size_t i = 0; i < n; ++i) o[i] = init.mean + init.std * rng.Normal();
    return;
  }
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  if (dtype == DType::kBF16) {
    for (size_t i = 0; i < n; ++i) o[i] = F32ToBf16(init.mean + init.std * rng.Normal());
  } else {
    for (size_t i = 0; i < n; ++i) o[i] = F32ToF16(init.mean + init.std * rng.Normal());
  }
}

void FillTensor(const ModelConfig& c, const std::string& name, uint64_t seed, DType dtype,
                size_t numel, std::vector<uint8_t>* bytes) {
  constexpr size_t kChunk = size_t{1} << 20;  // elements per random stream
  const Init init = InitFor(c, name);
  const uint64_t base = HashName(name) ^ SplitMix64 { seed }.Next();
  const size_t elem = DTypeSize(dtype);
  bytes->resize(numel * elem);
  const size_t num_chunks = (numel + kChunk - 1) / kChunk;
  auto work = [&](size_t first, size_t step) {
    for (size_t k = first; k < num_chunks; k += step) {
      size_t begin = k * kChunk, n = std::min(kChunk, numel - begin);
      FillChunk(init, base + k * 0x9e3779b97f4a7c15ull, dtype, n, bytes->data() + begin * elem);
    }
  };
  size_t num_threads = std::min<size_t>({std::thread::hardware_concurrency(), num_chunks, 16});
  if (num_threads <= 1) return work(0, 1);
  std::vector<std::thread> threads;
  for (size_t t = 1; t < num_threads; ++t) threads.emplace_back(work, t, num_threads);
  work(0, num_threads);
  for (std::thread& t : threads) t.join();
}

Result<ModelConfig> ConfigFor(const SyntheticModelOptions& o) {
  ASSIGN_OR_RETURN(ModelConfig c, PresetConfig(o.arch, o.preset));
  RETURN_IF_ERROR(internal::ApplyMoeOverrides(o, &c));
  if (o.num_kv_heads) {
    if (c.is_mla()) return InvalidArgument("num_kv_heads: deepseek_v3 (MLA) has no KV heads");
    if (*o.num_kv_heads <= 0 || c.num_heads % *o.num_kv_heads != 0) {
      return InvalidArgument("num_kv_heads " + std::to_string(*o.num_kv_heads) +
                             " must be positive and divide the preset's " +
                             std::to_string(c.num_heads) + " attention heads");
    }
    c.num_kv_heads = *o.num_kv_heads;
  }
  if (o.num_layers) {
    if (*o.num_layers <= 0) {
      return InvalidArgument("num_layers must be positive, got " + std::to_string(*o.num_layers));
    }
    c.num_layers = *o.num_layers;
    std::erase_if(c.moe.mlp_only_layers, [&](int layer) { return layer >= c.num_layers; });
  }
  c.torch_dtype = TorchDType(o.dtype);
  c.fp8.enabled = o.dtype == DType::kF8E4M3;
  // What we write must be what we read back.
  ASSIGN_OR_RETURN(ModelConfig check, ParseModelConfig(ModelConfigToJson(c), "config.json"));
  (void)check;
  return c;
}

Status WriteGenerationConfig(const std::string& dir, const ModelConfig& c) {
  nlohmann::json j = {{"bos_token_id", c.bos_token_id},
                      {"eos_token_id", c.eos_token_id},
                      {"do_sample", false},
                      {"transformers_version", "4.51.0"}};
  return WriteStringToFile(dir + "/generation_config.json", j.dump(2) + "\n");
}

}  // namespace

Result<ModelConfig> PresetConfig(Arch arch, std::string_view preset) {
  ModelConfig c = Base(arch);
  if (arch == Arch::kQwen3Moe || arch == Arch::kDeepseekV3) {
    RETURN_IF_ERROR(internal::MoePreset(preset, &c));
  } else if (preset == "tiny") {
    c.hidden_size = 64, c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 2;
    c.intermediate_size = 160, c.vocab_size = 512;
    c.head_dim = arch == Arch::kQwen3 ? 32 : 16;  // qwen3: q_size != hidden_size
  } else if (preset == "small") {
    c.hidden_size = 256, c.num_layers = 4, c.num_heads = 8, c.num_kv_heads = 2;
    c.intermediate_size = 704, c.vocab_size = 2048;
    c.head_dim = arch == Arch::kQwen3 ? 64 : 32;
  } else if (preset == "qwen3-0.6b") {  // Qwen/Qwen3-0.6B's shapes
    c.hidden_size = 1024, c.num_layers = 28, c.num_heads = 16, c.num_kv_heads = 8;
    c.head_dim = 128, c.intermediate_size = 3072, c.vocab_size = 151936;
    c.rope_theta = 1000000.0, c.rms_norm_eps = 1e-6, c.tie_word_embeddings = true;
    c.max_position_embeddings = 40960;
  } else if (preset == "llama-1b") {  // TinyLlama/TinyLlama-1.1B's shapes
    c.hidden_size = 2048, c.num_layers = 22, c.num_heads = 32, c.num_kv_heads = 4;
    c.head_dim = 64, c.intermediate_size = 5632, c.vocab_size = 32000;
    c.rope_theta = 10000.0, c.rms_norm_eps = 1e-5, c.tie_word_embeddings = false;
    c.max_position_embeddings = 2048;
  } else {
    return InvalidArgument("unknown preset \"" + std::string(preset) +
                           "\" (expected tiny, small, qwen3-0.6b or llama-1b; "
                           "qwen3-moe-1g and deepseek-v3-1g are for qwen3_moe and deepseek_v3)");
  }
  SetSpecialTokenIds(&c);
  return c;
}

ParameterCounts CountParameters(const ModelConfig& c) {
  auto sum = [](const std::vector<TensorSpec>& specs) {
    int64_t n = 0;
    for (const TensorSpec& t : specs) {
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      n += numel;
    }
    return n;
  };
  ParameterCounts p;
  p.total = sum(RequiredTensors(c));
  p.mtp = sum(MtpTensors(c));
  int64_t moe_layers = 0;
  for (int i = 0; i < c.num_layers; ++i) moe_layers += c.IsMoeLayer(i) ? 1 : 0;
  const int64_t per_expert = int64_t{3} * c.hidden_size * c.moe.moe_intermediate_size;
  const int64_t unused = c.is_moe() ? c.moe.num_experts - c.moe.num_experts_per_tok : 0;
  p.active = p.total - moe_layers * unused * per_expert;
  return p;
}

Status WriteSyntheticModel(const SyntheticModelOptions& options) {
  if (options.out_dir.empty()) return InvalidArgument("no output directory given");
  ASSIGN_OR_RETURN(ModelConfig config, ConfigFor(options));
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) return IoError(options.out_dir + ": cannot create directory: " + ec.message());
  RETURN_IF_ERROR(WriteStringToFile(options.out_dir + "/config.json", ModelConfigToJson(config)));
  RETURN_IF_ERROR(WriteGenerationConfig(options.out_dir, config));
  std::vector<TensorSpec> specs = RequiredTensors(config);
  for (TensorSpec& spec : MtpTensors(config)) specs.push_back(std::move(spec));
  const bool fp8 = options.dtype == DType::kF8E4M3;
  std::vector<NamedTensor> tensors;
  for (TensorSpec& spec : specs) {
    // As DeepSeek-V3's checkpoints do, the router bias stays f32 whatever the weights' dtype; FP8
    // checkpoints quantise the linear weights (each followed by its scales), the rest is bf16.
    DType dtype = fp8 ? DType::kBF16 : options.dtype;
    if (EndsWith(spec.name, "e_score_correction_bias")) dtype = DType::kF32;
    if (fp8 && spec.fp8_quantizable) {
      std::vector<int64_t> scale_shape = ScaleInvShape(spec.shape);
      tensors.push_back({spec.name, DType::kF8E4M3, std::move(spec.shape), {}});
      tensors.push_back({ScaleInvName(spec.name), DType::kF32, std::move(scale_shape), {}});
      continue;
    }
    tensors.push_back({std::move(spec.name), dtype, std::move(spec.shape), {}});
  }
  std::vector<uint8_t> values;  // f32 of the weight being quantised
  std::vector<float> scales;    // its scales, written as the tensor after it
  auto fill = [&](size_t i, std::vector<uint8_t>* bytes) {
    const NamedTensor& t = tensors[i];
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
    if (t.dtype == DType::kF8E4M3) {
      FillTensor(config, t.name, options.seed, DType::kF32, numel, &values);
      bytes->resize(numel);
      scales.resize(static_cast<size_t>(tensors[i + 1].shape[0] * tensors[i + 1].shape[1]));
      QuantizeFp8Blocks(reinterpret_cast<const float*>(values.data()), t.shape[0], t.shape[1],
                        bytes->data(), scales.data());
      return OkStatus();
    }
    if (i > 0 && tensors[i - 1].dtype == DType::kF8E4M3) {  // the scales of tensor i - 1
      bytes->resize(scales.size() * sizeof(float));
      std::memcpy(bytes->data(), scales.data(), bytes->size());
      return OkStatus();
    }
    FillTensor(config, t.name, options.seed, t.dtype, numel, bytes);
    return OkStatus();
  };
  RETURN_IF_ERROR(
      WriteCheckpointStreaming(options.out_dir, tensors, options.max_shard_bytes, fill));
  return WriteSyntheticTokenizer(options.out_dir, config.arch, config.vocab_size);
}

}  // namespace pd::model
