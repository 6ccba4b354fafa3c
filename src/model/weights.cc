#include "model/weights.h"

namespace pd::model {

bool HasOutputBias(const ModelConfig& c) { return c.attention_bias && c.arch != Arch::kQwen2; }

std::vector<TensorSpec> RequiredTensors(const ModelConfig& c) {
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q = c.q_size(), kv = c.kv_size();
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, hidden}});
  for (int i = 0; i < c.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    specs.push_back({p + "input_layernorm.weight", {hidden}});
    specs.push_back({p + "self_attn.q_proj.weight", {q, hidden}});
    specs.push_back({p + "self_attn.k_proj.weight", {kv, hidden}});
    specs.push_back({p + "self_attn.v_proj.weight", {kv, hidden}});
    if (c.attention_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", {q}});
      specs.push_back({p + "self_attn.k_proj.bias", {kv}});
      specs.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    if (c.qk_norm) {
      specs.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      specs.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    specs.push_back({p + "self_attn.o_proj.weight", {hidden, q}});
    if (HasOutputBias(c)) specs.push_back({p + "self_attn.o_proj.bias", {hidden}});
    specs.push_back({p + "post_attention_layernorm.weight", {hidden}});
    specs.push_back({p + "mlp.gate_proj.weight", {inter, hidden}});
    specs.push_back({p + "mlp.up_proj.weight", {inter, hidden}});
    specs.push_back({p + "mlp.down_proj.weight", {hidden, inter}});
  }
  specs.push_back({"model.norm.weight", {hidden}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, hidden}});
  return specs;
}

namespace {

// Looks every required tensor up, checking shape and that all share the first one's dtype.
class Fetcher {
 public:
  explicit Fetcher(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  Status Get(const TensorSpec& spec, TensorView* out) {
    ASSIGN_OR_RETURN(*out, ckpt_.GetWithShape(spec.name, spec.shape));
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
  Status GetOptional(const TensorSpec& spec, std::optional<TensorView>* out) {
    TensorView v;
    RETURN_IF_ERROR(Get(spec, &v));
    *out = v;
    return OkStatus();
  }
  DType dtype() const { return dtype_; }

 private:
  const Checkpoint& ckpt_;
  std::string first_name_;
  DType dtype_ = DType::kF32;
};

Status FillLayer(const ModelConfig& c, const std::vector<TensorSpec>& specs, size_t* next,
                 Fetcher* f, LayerWeights* layer) {
  auto take = [&](TensorView* out) { return f->Get(specs[(*next)++], out); };
  auto take_opt = [&](std::optional<TensorView>* out) {
    return f->GetOptional(specs[(*next)++], out);
  };
  RETURN_IF_ERROR(take(&layer->input_norm));
  RETURN_IF_ERROR(take(&layer->q_proj));
  RETURN_IF_ERROR(take(&layer->k_proj));
  RETURN_IF_ERROR(take(&layer->v_proj));
  if (c.attention_bias) {
    RETURN_IF_ERROR(take_opt(&layer->q_bias));
    RETURN_IF_ERROR(take_opt(&layer->k_bias));
    RETURN_IF_ERROR(take_opt(&layer->v_bias));
  }
  if (c.qk_norm) {
    RETURN_IF_ERROR(take_opt(&layer->q_norm));
    RETURN_IF_ERROR(take_opt(&layer->k_norm));
  }
  RETURN_IF_ERROR(take(&layer->o_proj));
  if (HasOutputBias(c)) RETURN_IF_ERROR(take_opt(&layer->o_bias));
  RETURN_IF_ERROR(take(&layer->post_norm));
  RETURN_IF_ERROR(take(&layer->gate_proj));
  RETURN_IF_ERROR(take(&layer->up_proj));
  return take(&layer->down_proj);
}

}  // namespace

Result<ModelWeights> LoadModelWeights(const std::string& model_dir) {
  ModelWeights w;
  ASSIGN_OR_RETURN(w.config, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(w.checkpoint, Checkpoint::Open(model_dir));
  // RequiredTensors' order is fixed: embed, then each layer's tensors, then norm (and lm_head).
  std::vector<TensorSpec> specs = RequiredTensors(w.config);
  Fetcher fetch(*w.checkpoint);
  size_t next = 0;
  RETURN_IF_ERROR(fetch.Get(specs[next++], &w.embed_tokens));
  w.layers.resize(w.config.num_layers);
  for (LayerWeights& layer : w.layers) {
    RETURN_IF_ERROR(FillLayer(w.config, specs, &next, &fetch, &layer));
  }
  RETURN_IF_ERROR(fetch.Get(specs[next++], &w.final_norm));
  if (w.config.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    RETURN_IF_ERROR(fetch.Get(specs[next++], &w.lm_head));
  }
  PD_CHECK_EQ(next, specs.size());
  w.dtype = fetch.dtype();
  return w;
}

}  // namespace pd::model
