#include "model/weights.h"

#include <algorithm>

namespace pd::model {
namespace {

// Which dtypes a tensor may have: the model's (the first tensor's), or any float dtype
// (deepseek_v3's e_score_correction_bias, which checkpoints keep in f32 beside bf16 weights), or
// for a linear weight the model's or (FP8 checkpoints) F8_E4M3 with block scales.
enum class DTypeRule { kModel, kAnyFloat, kLinear };

// Receives a model's tensors in checkpoint order, one Take per tensor. The same walk serves
// RequiredTensors (a sink that collects the specs) and the loader (one that fetches each tensor
// into its view), so the two cannot disagree.
class TensorSink {
 public:
  virtual ~TensorSink() = default;
  virtual Status Take(TensorSpec spec, TensorView* out, DTypeRule rule) = 0;
  Status Take(TensorSpec spec, TensorView* out) {
    return Take(std::move(spec), out, DTypeRule::kModel);
  }
  Status Take(TensorSpec spec, std::optional<TensorView>* out, DTypeRule rule = DTypeRule::kModel) {
    return Take(std::move(spec), &out->emplace(), rule);
  }
};

class SpecCollector : public TensorSink {
 public:
  explicit SpecCollector(std::vector<TensorSpec>* specs) : specs_(specs) {}
  using TensorSink::Take;
  Status Take(TensorSpec spec, TensorView*, DTypeRule rule) override {
    spec.fp8_quantizable = rule == DTypeRule::kLinear;
    specs_->push_back(std::move(spec));
    return OkStatus();
  }

 private:
  std::vector<TensorSpec>* specs_;
};

// Looks tensors up, checking shape and that all share the first one's dtype.
class Fetcher : public TensorSink {
 public:
  Fetcher(const Checkpoint& ckpt, bool fp8_config) : ckpt_(ckpt), fp8_config_(fp8_config) {}
  using TensorSink::Take;
  Status Take(TensorSpec spec, TensorView* out, DTypeRule rule) override {
    ASSIGN_OR_RETURN(*out, ckpt_.GetWithShape(spec.name, spec.shape));
    if (out->dtype == DType::kF8E4M3) {
      if (rule != DTypeRule::kLinear || !fp8_config_)
        return InvalidArgument(ckpt_.FileOf(spec.name) + ": " + spec.name + ": dtype F8_E4M3 " +
                               (fp8_config_ ? "for a tensor FP8 checkpoints keep unquantised"
                                            : "but config.json has no FP8 quantization_config"));
      fp8_ = true;
      return TakeScale(spec, out);
    }
    if (rule == DTypeRule::kAnyFloat) return OkStatus();  // every DType is a float type
    if (first_name_.empty()) {
      first_name_ = spec.name;
      dtype_ = out->dtype;
    } else if (out->dtype != dtype_) {
      return InvalidArgument(ckpt_.FileOf(spec.name) + ": " + spec.name + ": expected dtype " +
                             std::string(DTypeName(dtype_)) + " (the dtype of " + first_name_ +
                             "), found " + std::string(DTypeName(out->dtype)));
    }
    return OkStatus();
  }
  DType dtype() const { return dtype_; }
  bool fp8() const { return fp8_; }

 private:
  Status TakeScale(const TensorSpec& spec, TensorView* out) {
    const std::string name = ScaleInvName(spec.name);
    Result<TensorView> scale = ckpt_.GetWithShape(name, ScaleInvShape(spec.shape));
    if (!scale.ok())
      return Status(scale.status().code(),
                    spec.name + " is F8_E4M3: its block scales: " + scale.status().message());
    if (scale->dtype != DType::kF32)
      return InvalidArgument(ckpt_.FileOf(name) + ": " + name + ": expected dtype F32, found " +
                             std::string(DTypeName(scale->dtype)));
    out->scale_inv = static_cast<const float*>(scale->data);
    return OkStatus();
  }

  const Checkpoint& ckpt_;
  const bool fp8_config_;
  bool fp8_ = false;
  std::string first_name_;
  DType dtype_ = DType::kF32;
};

constexpr DTypeRule kLinear = DTypeRule::kLinear;

Status WalkMlp(const std::string& p, int64_t inter, int64_t hidden, TensorSink* s, TensorView* gate,
               TensorView* up, TensorView* down) {
  RETURN_IF_ERROR(s->Take({p + "gate_proj.weight", {inter, hidden}}, gate, kLinear));
  RETURN_IF_ERROR(s->Take({p + "up_proj.weight", {inter, hidden}}, up, kLinear));
  return s->Take({p + "down_proj.weight", {hidden, inter}}, down, kLinear);
}

Status WalkMlp(const std::string& p, int64_t inter, int64_t hidden, TensorSink* s, MlpWeights* m) {
  return WalkMlp(p, inter, hidden, s, &m->gate_proj, &m->up_proj, &m->down_proj);
}

// GQA attention (llama, qwen2, qwen3, qwen3_moe), tensors after input_layernorm.
Status WalkGqa(const ModelConfig& c, const std::string& p, TensorSink* s, LayerWeights* l) {
  const int64_t hidden = c.hidden_size, q = c.q_size(), kv = c.kv_size();
  RETURN_IF_ERROR(s->Take({p + "self_attn.q_proj.weight", {q, hidden}}, &l->q_proj, kLinear));
  RETURN_IF_ERROR(s->Take({p + "self_attn.k_proj.weight", {kv, hidden}}, &l->k_proj, kLinear));
  RETURN_IF_ERROR(s->Take({p + "self_attn.v_proj.weight", {kv, hidden}}, &l->v_proj, kLinear));
  if (c.attention_bias) {
    RETURN_IF_ERROR(s->Take({p + "self_attn.q_proj.bias", {q}}, &l->q_bias));
    RETURN_IF_ERROR(s->Take({p + "self_attn.k_proj.bias", {kv}}, &l->k_bias));
    RETURN_IF_ERROR(s->Take({p + "self_attn.v_proj.bias", {kv}}, &l->v_bias));
  }
  if (c.qk_norm) {
    RETURN_IF_ERROR(s->Take({p + "self_attn.q_norm.weight", {c.head_dim}}, &l->q_norm));
    RETURN_IF_ERROR(s->Take({p + "self_attn.k_norm.weight", {c.head_dim}}, &l->k_norm));
  }
  RETURN_IF_ERROR(s->Take({p + "self_attn.o_proj.weight", {hidden, q}}, &l->o_proj, kLinear));
  if (HasOutputBias(c))
    RETURN_IF_ERROR(s->Take({p + "self_attn.o_proj.bias", {hidden}}, &l->o_bias));
  return OkStatus();
}

Status WalkMla(const ModelConfig& c, const std::string& p, TensorSink* s, MlaWeights* m) {
  const MlaConfig& a = c.mla;
  const int64_t hidden = c.hidden_size, heads = c.num_heads;
  const std::string attn = p + "self_attn.";
  if (a.q_lora_rank > 0) {
    RETURN_IF_ERROR(
        s->Take({attn + "q_a_proj.weight", {a.q_lora_rank, hidden}}, &m->q_a_proj, kLinear));
    RETURN_IF_ERROR(s->Take({attn + "q_a_layernorm.weight", {a.q_lora_rank}}, &m->q_a_norm));
    RETURN_IF_ERROR(s->Take({attn + "q_b_proj.weight", {heads * a.qk_head_dim(), a.q_lora_rank}},
                            &m->q_b_proj, kLinear));
  } else {
    RETURN_IF_ERROR(
        s->Take({attn + "q_proj.weight", {heads * a.qk_head_dim(), hidden}}, &m->q_proj, kLinear));
  }
  RETURN_IF_ERROR(s->Take({attn + "kv_a_proj_with_mqa.weight", {a.latent_dim(), hidden}},
                          &m->kv_a_proj, kLinear));
  RETURN_IF_ERROR(s->Take({attn + "kv_a_layernorm.weight", {a.kv_lora_rank}}, &m->kv_a_norm));
  RETURN_IF_ERROR(s->Take(
      {attn + "kv_b_proj.weight", {heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank}},
      &m->kv_b_proj, kLinear));
  return s->Take({attn + "o_proj.weight", {hidden, heads * a.v_head_dim}}, &m->o_proj, kLinear);
}

Status WalkMoe(const ModelConfig& c, const std::string& p, TensorSink* s, MoeWeights* m) {
  const MoeConfig& moe = c.moe;
  const int64_t hidden = c.hidden_size, experts = moe.num_experts;
  RETURN_IF_ERROR(s->Take({p + "mlp.gate.weight", {experts, hidden}}, &m->router));
  if (c.arch == Arch::kDeepseekV3) {
    RETURN_IF_ERROR(s->Take({p + "mlp.gate.e_score_correction_bias", {experts}}, &m->router_bias,
                            DTypeRule::kAnyFloat));
  }
  m->experts.resize(experts);
  for (int e = 0; e < moe.num_experts; ++e) {
    RETURN_IF_ERROR(WalkMlp(p + "mlp.experts." + std::to_string(e) + ".", moe.moe_intermediate_size,
                            hidden, s, &m->experts[e]));
  }
  if (moe.n_shared_experts > 0) {
    const int64_t width = int64_t{moe.n_shared_experts} * moe.moe_intermediate_size;
    RETURN_IF_ERROR(
        WalkMlp(p + "mlp.shared_experts.", width, hidden, s, &m->shared_expert.emplace()));
  }
  return OkStatus();
}

// Decoder layer `index` (an MTP layer's too: index num_layers + i).
Status WalkLayer(const ModelConfig& c, int index, TensorSink* s, LayerWeights* l) {
  const int64_t hidden = c.hidden_size;
  const std::string p = "model.layers." + std::to_string(index) + ".";
  RETURN_IF_ERROR(s->Take({p + "input_layernorm.weight", {hidden}}, &l->input_norm));
  if (c.is_mla()) {
    RETURN_IF_ERROR(WalkMla(c, p, s, &l->mla.emplace()));
  } else {
    RETURN_IF_ERROR(WalkGqa(c, p, s, l));
  }
  RETURN_IF_ERROR(s->Take({p + "post_attention_layernorm.weight", {hidden}}, &l->post_norm));
  if (c.IsMoeLayer(index)) return WalkMoe(c, p, s, &l->moe.emplace());
  return WalkMlp(p + "mlp.", c.intermediate_size, hidden, s, &l->gate_proj, &l->up_proj,
                 &l->down_proj);
}

Status WalkMtp(const ModelConfig& c, int i, TensorSink* s, MtpWeights* m) {
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size;
  const int index = c.num_layers + i;
  const std::string p = "model.layers." + std::to_string(index) + ".";
  RETURN_IF_ERROR(s->Take({p + "embed_tokens.weight", {vocab, hidden}}, &m->embed_tokens));
  RETURN_IF_ERROR(s->Take({p + "enorm.weight", {hidden}}, &m->enorm));
  RETURN_IF_ERROR(s->Take({p + "hnorm.weight", {hidden}}, &m->hnorm));
  RETURN_IF_ERROR(s->Take({p + "eh_proj.weight", {hidden, 2 * hidden}}, &m->eh_proj, kLinear));
  RETURN_IF_ERROR(WalkLayer(c, index, s, &m->layer));
  RETURN_IF_ERROR(s->Take({p + "shared_head.norm.weight", {hidden}}, &m->shared_head_norm));
  return s->Take({p + "shared_head.head.weight", {vocab, hidden}}, &m->shared_head_head);
}

// The model without MTP layers: embed, each layer, norm, lm_head (when untied).
Status WalkModel(const ModelConfig& c, TensorSink* s, ModelWeights* w) {
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size;
  RETURN_IF_ERROR(s->Take({"model.embed_tokens.weight", {vocab, hidden}}, &w->embed_tokens));
  w->layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) RETURN_IF_ERROR(WalkLayer(c, i, s, &w->layers[i]));
  RETURN_IF_ERROR(s->Take({"model.norm.weight", {hidden}}, &w->final_norm));
  if (c.tie_word_embeddings) {
    w->lm_head = w->embed_tokens;
    return OkStatus();
  }
  return s->Take({"lm_head.weight", {vocab, hidden}}, &w->lm_head);
}

// MTP layers are optional as a whole: none of their tensors present loads with `mtp` empty; some
// present makes every one of them required.
Status LoadMtp(const ModelConfig& c, const Checkpoint& ckpt, Fetcher* f,
               std::vector<MtpWeights>* mtp) {
  const std::vector<TensorSpec> specs = MtpTensors(c);
  auto present = std::find_if(specs.begin(), specs.end(),
                              [&](const TensorSpec& t) { return !ckpt.FileOf(t.name).empty(); });
  if (present == specs.end()) return OkStatus();
  mtp->resize(c.num_nextn_predict_layers);
  for (int i = 0; i < c.num_nextn_predict_layers; ++i) {
    Status s = WalkMtp(c, i, f, &(*mtp)[i]);
    if (s.code() == StatusCode::kNotFound) {
      return NotFound(s.message() + " (the checkpoint has multi-token-prediction tensors, e.g. " +
                      present->name + ", so it must have all " + std::to_string(specs.size()) +
                      " of num_nextn_predict_layers " + std::to_string(c.num_nextn_predict_layers) +
                      ")");
    }
    RETURN_IF_ERROR(s);
  }
  return OkStatus();
}

}  // namespace

std::string ScaleInvName(const std::string& weight_name) { return weight_name + "_scale_inv"; }

std::vector<int64_t> ScaleInvShape(const std::vector<int64_t>& shape) {
  std::vector<int64_t> out;
  for (int64_t d : shape) out.push_back((d + kFp8BlockSize - 1) / kFp8BlockSize);
  return out;
}

bool HasOutputBias(const ModelConfig& c) { return c.attention_bias && c.arch != Arch::kQwen2; }

std::vector<TensorSpec> RequiredTensors(const ModelConfig& c) {
  std::vector<TensorSpec> specs;
  SpecCollector collect(&specs);
  ModelWeights scratch;
  PD_CHECK(WalkModel(c, &collect, &scratch).ok());
  return specs;
}

std::vector<TensorSpec> MtpTensors(const ModelConfig& c) {
  std::vector<TensorSpec> specs;
  SpecCollector collect(&specs);
  for (int i = 0; i < c.num_nextn_predict_layers; ++i) {
    MtpWeights scratch;
    PD_CHECK(WalkMtp(c, i, &collect, &scratch).ok());
  }
  return specs;
}

Result<ModelWeights> LoadModelWeights(const std::string& model_dir) {
  ModelWeights w;
  ASSIGN_OR_RETURN(w.config, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(w.checkpoint, Checkpoint::Open(model_dir));
  Fetcher fetch(*w.checkpoint, w.config.fp8.enabled);
  RETURN_IF_ERROR(WalkModel(w.config, &fetch, &w));
  RETURN_IF_ERROR(LoadMtp(w.config, *w.checkpoint, &fetch, &w.mtp));
  ASSIGN_OR_RETURN(w.kv_scales, LoadKvScales(*w.checkpoint, w.config.num_layers));
  w.dtype = fetch.dtype();
  w.fp8 = fetch.fp8();
  return w;
}

}  // namespace pd::model
