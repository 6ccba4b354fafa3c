#include "engine/model_runner_weights.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "engine/mla_weights.h"
#include "engine/moe_routing.h"
#include "engine/thread_pool.h"

namespace pd::engine {

using model::DType;
using model::TensorView;

Status CheckShape(const TensorView& t, const std::vector<int64_t>& shape, const std::string& name) {
  if (t.data == nullptr) return InvalidArgument("weights: " + name + " is missing");
  if (t.shape != shape)
    return InvalidArgument("weights: " + name + ": expected shape " + model::ShapeToString(shape) +
                           ", found " + model::ShapeToString(t.shape));
  return OkStatus();
}

Result<std::vector<float>> ToF32Vector(const TensorView& t, int64_t n, const std::string& name) {
  RETURN_IF_ERROR(CheckShape(t, {n}, name));
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = t.At(i);
  return out;
}

Status MakeLinear(const TensorView& t, int64_t n, int64_t k, DType dtype, const std::string& name,
                  LinearWeight* out) {
  RETURN_IF_ERROR(CheckShape(t, {n, k}, name));
  out->w.n = n;
  out->w.k = k;
  if (t.dtype == DType::kF8E4M3) {  // the loader checked its scales (weights.h)
    if (t.scale_inv == nullptr) return InvalidArgument("weights: " + name + ": no block scales");
    out->w.data = t.data;
    out->w.fp8 = true;
    out->w.scales = t.scale_inv;
    return OkStatus();
  }
  if (t.dtype != dtype)
    return InvalidArgument("weights: " + name + ": expected dtype " +
                           std::string(model::DTypeName(dtype)) + ", found " +
                           std::string(model::DTypeName(t.dtype)));
  if (t.dtype == DType::kF16) {
    out->owned.resize(static_cast<size_t>(n) * k);
    for (int64_t i = 0; i < n * k; ++i) out->owned[i] = t.At(i);
    out->w.data = out->owned.data();
    out->w.bf16 = false;
  } else {
    out->w.data = t.data;
    out->w.bf16 = t.dtype == DType::kBF16;
  }
  return OkStatus();
}

namespace {

Result<std::vector<float>> OptionalVector(const std::optional<TensorView>& t, bool wanted,
                                          int64_t n, const std::string& name) {
  if (!wanted) return std::vector<float>();
  if (!t.has_value()) return InvalidArgument("weights: " + name + " is missing");
  return ToF32Vector(*t, n, name);
}

Status CheckConfig(const model::ModelConfig& c, size_t num_layer_weights) {
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_layers <= 0 ||
      c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0)
    return InvalidArgument("model config: sizes must be positive");
  if (c.num_heads % c.num_kv_heads != 0)
    return InvalidArgument("model config: num_attention_heads " + std::to_string(c.num_heads) +
                           " is not a multiple of num_key_value_heads " +
                           std::to_string(c.num_kv_heads));
  if (c.head_dim % 2 != 0)
    return InvalidArgument("model config: head_dim " + std::to_string(c.head_dim) +
                           " must be even for RoPE");
  if (num_layer_weights != static_cast<size_t>(c.num_layers))
    return InvalidArgument("weights: " + std::to_string(num_layer_weights) +
                           " layers given, config has " + std::to_string(c.num_layers));
  return OkStatus();
}

Status PrepareExpert(const model::MlpWeights& m, int64_t hidden, int64_t inter, DType dtype,
                     const std::string& p, RunnerExpert* out) {
  RETURN_IF_ERROR(
      MakeLinear(m.gate_proj, inter, hidden, dtype, p + "gate_proj.weight", &out->gate));
  RETURN_IF_ERROR(MakeLinear(m.up_proj, inter, hidden, dtype, p + "up_proj.weight", &out->up));
  return MakeLinear(m.down_proj, hidden, inter, dtype, p + "down_proj.weight", &out->down);
}

// The router and experts of MoE layer `p` (prefix "model.layers.{i}.").
Status PrepareMoe(const model::LayerWeights& lw, const model::ModelConfig& c, DType dtype,
                  const std::string& p, RunnerMoeWeights* out) {
  const model::MoeConfig& m = c.moe;
  const int64_t h = c.hidden_size, e = m.num_experts, inter = m.moe_intermediate_size;
  if (m.num_experts_per_tok < 1 || m.num_experts_per_tok > m.num_experts || inter <= 0 ||
      m.n_group < 1 || m.n_group > kMaxGroups || m.num_experts % m.n_group != 0 ||
      m.topk_group < 1 || m.topk_group > m.n_group)
    return InvalidArgument("model config: MoE sizes: num_experts " + std::to_string(e) +
                           ", num_experts_per_tok " + std::to_string(m.num_experts_per_tok) +
                           ", moe_intermediate_size " + std::to_string(inter) + ", n_group " +
                           std::to_string(m.n_group) + ", topk_group " +
                           std::to_string(m.topk_group) + " do not make a router");
  if (!lw.moe.has_value()) return InvalidArgument("weights: " + p + "mlp.gate.weight is missing");
  const model::MoeWeights& mw = *lw.moe;
  RETURN_IF_ERROR(MakeLinear(mw.router, e, h, dtype, p + "mlp.gate.weight", &out->router));
  const bool biased = m.scoring == model::MoeConfig::Scoring::kSigmoid;
  ASSIGN_OR_RETURN(out->router_bias, OptionalVector(mw.router_bias, biased, e,
                                                    p + "mlp.gate.e_score_correction_bias"));
  if (static_cast<int64_t>(mw.experts.size()) != e)
    return InvalidArgument("weights: " + p + "mlp.experts: " + std::to_string(mw.experts.size()) +
                           " experts given, config has " + std::to_string(e));
  out->experts.resize(e);
  for (int64_t i = 0; i < e; ++i)
    RETURN_IF_ERROR(PrepareExpert(mw.experts[i], h, inter, dtype,
                                  p + "mlp.experts." + std::to_string(i) + ".", &out->experts[i]));
  out->shared.clear();
  if (m.n_shared_experts > 0) {
    if (!mw.shared_expert.has_value())
      return InvalidArgument("weights: " + p + "mlp.shared_experts.gate_proj.weight is missing");
    out->shared.resize(1);
    RETURN_IF_ERROR(PrepareExpert(*mw.shared_expert, h, m.n_shared_experts * inter, dtype,
                                  p + "mlp.shared_experts.", &out->shared[0]));
  }
  return OkStatus();
}

Status PrepareLayer(const model::LayerWeights& lw, const model::ModelConfig& c, DType dtype,
                    int index, RunnerLayerWeights* out) {
  const std::string p = "model.layers." + std::to_string(index) + ".";
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), inter = c.intermediate_size;
  ASSIGN_OR_RETURN(out->input_norm, ToF32Vector(lw.input_norm, h, p + "input_layernorm.weight"));
  ASSIGN_OR_RETURN(out->post_norm,
                   ToF32Vector(lw.post_norm, h, p + "post_attention_layernorm.weight"));
  ASSIGN_OR_RETURN(out->q_norm,
                   OptionalVector(lw.q_norm, c.qk_norm, c.head_dim, p + "self_attn.q_norm.weight"));
  ASSIGN_OR_RETURN(out->k_norm,
                   OptionalVector(lw.k_norm, c.qk_norm, c.head_dim, p + "self_attn.k_norm.weight"));
  ASSIGN_OR_RETURN(out->q_bias,
                   OptionalVector(lw.q_bias, c.attention_bias, q, p + "self_attn.q_proj.bias"));
  ASSIGN_OR_RETURN(out->k_bias,
                   OptionalVector(lw.k_bias, c.attention_bias, kv, p + "self_attn.k_proj.bias"));
  ASSIGN_OR_RETURN(out->v_bias,
                   OptionalVector(lw.v_bias, c.attention_bias, kv, p + "self_attn.v_proj.bias"));
  ASSIGN_OR_RETURN(out->o_bias, OptionalVector(lw.o_bias, model::HasOutputBias(c), h,
                                               p + "self_attn.o_proj.bias"));
  if (c.is_mla()) {  // deepseek_v3: MLA instead of q/k/v/o
    if (!lw.mla.has_value()) return InvalidArgument("weights: " + p + "self_attn: MLA missing");
    out->mla = std::make_unique<RunnerMlaWeights>();
    RETURN_IF_ERROR(PrepareMlaWeights(*lw.mla, c, dtype, p + "self_attn.", out->mla.get()));
  } else {
    RETURN_IF_ERROR(MakeLinear(lw.q_proj, q, h, dtype, p + "self_attn.q_proj.weight", &out->q));
    RETURN_IF_ERROR(MakeLinear(lw.k_proj, kv, h, dtype, p + "self_attn.k_proj.weight", &out->k));
    RETURN_IF_ERROR(MakeLinear(lw.v_proj, kv, h, dtype, p + "self_attn.v_proj.weight", &out->v));
    RETURN_IF_ERROR(MakeLinear(lw.o_proj, h, q, dtype, p + "self_attn.o_proj.weight", &out->o));
  }
  if (c.IsMoeLayer(index)) return PrepareMoe(lw, c, dtype, p, &out->moe);
  RETURN_IF_ERROR(
      MakeLinear(lw.gate_proj, inter, h, dtype, p + "mlp.gate_proj.weight", &out->gate));
  RETURN_IF_ERROR(MakeLinear(lw.up_proj, inter, h, dtype, p + "mlp.up_proj.weight", &out->up));
  RETURN_IF_ERROR(
      MakeLinear(lw.down_proj, h, inter, dtype, p + "mlp.down_proj.weight", &out->down));
  return OkStatus();
}

}  // namespace

Result<std::unique_ptr<RunnerWeights>> PrepareRunnerWeights(const model::ModelWeights& weights) {
  const model::ModelConfig& c = weights.config;
  RETURN_IF_ERROR(CheckConfig(c, weights.layers.size()));
  auto out = std::make_unique<RunnerWeights>();
  out->config = c;
  out->kv_scales = weights.kv_scales;
  const DType dtype = weights.dtype;
  RETURN_IF_ERROR(MakeLinear(weights.embed_tokens, c.vocab_size, c.hidden_size, dtype,
                             "model.embed_tokens.weight", &out->embed));
  if (weights.lm_head.data == weights.embed_tokens.data && weights.lm_head.data != nullptr) {
    out->lm_head.w = out->embed.w;  // tied: share the (possibly converted) embedding
  } else {
    RETURN_IF_ERROR(MakeLinear(weights.lm_head, c.vocab_size, c.hidden_size, dtype,
                               "lm_head.weight", &out->lm_head));
  }
  ASSIGN_OR_RETURN(out->final_norm,
                   ToF32Vector(weights.final_norm, c.hidden_size, "model.norm.weight"));
  out->layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i)
    RETURN_IF_ERROR(PrepareLayer(weights.layers[i], c, dtype, i, &out->layers[i]));
  return out;
}

Result<std::unique_ptr<HugePageBuffer>> HugePageBuffer::Create(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
  const size_t map_bytes = size + kHuge;
  void* map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED)
    return ResourceExhausted("mmap of " + std::to_string(map_bytes) +
                             " bytes for packed weights: " + std::strerror(errno));
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(map) + kHuge - 1) / kHuge * kHuge;
  uint8_t* data = reinterpret_cast<uint8_t*>(aligned);
  madvise(data, size, MADV_HUGEPAGE);  // advice only: without THP the pages stay 4 KiB
  return std::unique_ptr<HugePageBuffer>(new HugePageBuffer(map, map_bytes, data, size));
}

HugePageBuffer::~HugePageBuffer() { munmap(map_, map_bytes_); }

Status PackRunnerWeights(ThreadPool& pool, RunnerWeights* w) {
  using Job = PackJob;
  std::vector<Job> jobs;
  for (RunnerLayerWeights& l : w->layers) {
    if (l.mla != nullptr) {
      AppendMlaPackJobs(l.mla.get(), &jobs);
    } else {
      jobs.push_back({{l.q.w, l.k.w, l.v.w}, &l.qkv});
      jobs.push_back({{l.o.w}, &l.o.w});
    }
    if (l.gate.w.data != nullptr) {  // a dense MLP
      jobs.push_back({{l.gate.w, l.up.w}, &l.gate_up});
      jobs.push_back({{l.down.w}, &l.down.w});
    }
    if (!l.moe.experts.empty()) jobs.push_back({{l.moe.router.w}, &l.moe.router.w});
    for (std::vector<RunnerExpert>* v : {&l.moe.experts, &l.moe.shared})
      for (RunnerExpert& x : *v) {               // each expert one contiguous gate|up, then down
        if (x.gate.w.data == nullptr) continue;  // another data-parallel rank's expert
        jobs.push_back({{x.gate.w, x.up.w}, &x.gate_up});
        jobs.push_back({{x.down.w}, &x.down.w});
      }
  }
  jobs.push_back({{w->lm_head.w}, &w->lm_head.w});
  size_t total = 0;
  for (const Job& j : jobs) {
    for (const kernels::WeightMatrix& p : j.parts)
      if (p.fp8 != j.parts[0].fp8 || p.bf16 != j.parts[0].bf16)
        return Unimplemented(
            "weights: matrices fused into one (q|k|v, gate|up, q_a|kv_a) must share a dtype; "
            "this FP8 checkpoint quantises only some of them");
    int64_t n = 0;
    for (const kernels::WeightMatrix& p : j.parts) n += p.n;
    total += kernels::Panel32BytesLike(n, j.parts[0]);
  }
  ASSIGN_OR_RETURN(w->packed, HugePageBuffer::Create(total));
  size_t offset = 0;
  for (Job& j : jobs) {
    *j.dst = kernels::PackPanel32(pool, j.parts.data(), static_cast<int>(j.parts.size()),
                                  w->packed->data() + offset);
    offset += kernels::Panel32BytesLike(j.dst->n, *j.dst);
  }
  return OkStatus();
}

void LoadWeightRow(const kernels::WeightMatrix& w, int64_t row, float* out) {
  if (w.bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(w.data) + row * w.k;
    for (int64_t i = 0; i < w.k; ++i) out[i] = model::Bf16ToF32(src[i]);
  } else {
    std::memcpy(out, static_cast<const float*>(w.data) + row * w.k, sizeof(float) * w.k);
  }
}

}  // namespace pd::engine
