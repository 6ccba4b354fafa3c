// The qwen3_moe and deepseek_v3 fields of config.json: the sparse MoE block, Multi-head Latent
// Attention and yarn rope_scaling. Field names and defaults are those of transformers'
// Qwen3MoeConfig and DeepseekV3Config; values pdserve does not implement are refused naming the
// field and the value.
#include <algorithm>
#include <initializer_list>

#include "model/config_fields.h"

namespace pd::model::internal {
namespace {

std::string Str(int v) { return std::to_string(v); }

Status Require(const FieldReader& r, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    if (!r.Has(key)) return InvalidArgument(r.source() + ": missing required field " + key);
  }
  return OkStatus();
}

// A string field with a single supported value; absent reads as that value (transformers' modeling
// code does not read these fields and always behaves as that value).
Status OnlyValue(const FieldReader& r, const char* key, const char* only) {
  std::string value = only;
  RETURN_IF_ERROR(r.String(key, &value));
  if (value == only) return OkStatus();
  return Unimplemented(r.source() + ": " + r.Name(key) + " \"" + value +
                       "\" is not supported for deepseek_v3 (only \"" + only + "\")");
}

Status ReadQwen3Moe(const FieldReader& r, MoeConfig* m) {
  RETURN_IF_ERROR(Require(r, {"num_experts", "num_experts_per_tok", "moe_intermediate_size"}));
  RETURN_IF_ERROR(r.Int("num_experts", &m->num_experts));
  RETURN_IF_ERROR(r.Int("num_experts_per_tok", &m->num_experts_per_tok));
  RETURN_IF_ERROR(r.Int("moe_intermediate_size", &m->moe_intermediate_size));
  m->norm_topk_prob = false;  // Qwen3MoeConfig's default
  RETURN_IF_ERROR(r.Bool("norm_topk_prob", &m->norm_topk_prob));
  m->decoder_sparse_step = 1;
  RETURN_IF_ERROR(r.Int("decoder_sparse_step", &m->decoder_sparse_step));
  RETURN_IF_ERROR(r.IntList("mlp_only_layers", &m->mlp_only_layers));
  m->scoring = MoeConfig::Scoring::kSoftmax;
  return OkStatus();
}

Status ReadDeepseekMoe(const FieldReader& r, MoeConfig* m) {
  RETURN_IF_ERROR(Require(r, {"n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"}));
  RETURN_IF_ERROR(r.Int("n_routed_experts", &m->num_experts));
  RETURN_IF_ERROR(r.Int("num_experts_per_tok", &m->num_experts_per_tok));
  RETURN_IF_ERROR(r.Int("moe_intermediate_size", &m->moe_intermediate_size));
  // DeepseekV3Config's defaults for the rest.
  m->n_shared_experts = 1, m->n_group = 8, m->topk_group = 4, m->first_k_dense_replace = 3;
  m->routed_scaling_factor = 2.5, m->norm_topk_prob = true;
  RETURN_IF_ERROR(r.Int("n_shared_experts", &m->n_shared_experts));
  RETURN_IF_ERROR(r.Int("n_group", &m->n_group));
  RETURN_IF_ERROR(r.Int("topk_group", &m->topk_group));
  RETURN_IF_ERROR(r.Int("first_k_dense_replace", &m->first_k_dense_replace));
  RETURN_IF_ERROR(r.Double("routed_scaling_factor", &m->routed_scaling_factor));
  RETURN_IF_ERROR(r.Bool("norm_topk_prob", &m->norm_topk_prob));
  RETURN_IF_ERROR(OnlyValue(r, "topk_method", "noaux_tc"));
  RETURN_IF_ERROR(OnlyValue(r, "scoring_func", "sigmoid"));
  m->scoring = MoeConfig::Scoring::kSigmoid;
  int moe_layer_freq = 1;
  RETURN_IF_ERROR(r.Int("moe_layer_freq", &moe_layer_freq));
  if (moe_layer_freq != 1) {
    return Unimplemented(r.source() + ": moe_layer_freq " + Str(moe_layer_freq) +
                         " is not supported for deepseek_v3 (only 1)");
  }
  return OkStatus();
}

Status ReadMla(const Json& root, const FieldReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(
      Require(r, {"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"}));
  // q_lora_rank must be written, as a number or as null (a plain q_proj): DeepseekV3Config's
  // default of 1536 is DeepSeek-V3's own size, not a neutral value.
  if (!root.contains("q_lora_rank")) {
    return InvalidArgument(r.source() +
                           ": missing required field q_lora_rank (a number, or null for q_proj)");
  }
  MlaConfig& m = c->mla;
  m.q_lora_rank = 0;
  RETURN_IF_ERROR(r.Int("q_lora_rank", &m.q_lora_rank));
  RETURN_IF_ERROR(r.Int("kv_lora_rank", &m.kv_lora_rank));
  RETURN_IF_ERROR(r.Int("qk_nope_head_dim", &m.qk_nope_head_dim));
  RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &m.qk_rope_head_dim));
  RETURN_IF_ERROR(r.Int("v_head_dim", &m.v_head_dim));
  m.rope_interleave = true;
  RETURN_IF_ERROR(r.Bool("rope_interleave", &m.rope_interleave));
  RETURN_IF_ERROR(r.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers));
  if (c->attention_bias) {
    return Unimplemented(r.source() + ": attention_bias true is not supported for deepseek_v3");
  }
  // As DeepseekV3Config sets them: MLA has no KV head groups, and head_dim is the rotary width.
  c->num_kv_heads = c->num_heads;
  c->head_dim = m.qk_rope_head_dim;
  return OkStatus();
}

constexpr const char* kYarnKeys[] = {"type",
                                     "rope_type",
                                     "factor",
                                     "original_max_position_embeddings",
                                     "beta_fast",
                                     "beta_slow",
                                     "mscale",
                                     "mscale_all_dim",
                                     "attention_factor",
                                     "truncate"};

// Checked where it is read, so that errors name the object it came from.
Status ValidateYarn(const YarnScaling& s, const std::string& source, const std::string& key) {
  auto bad = [&](const char* field, double v, const char* expected) {
    return InvalidArgument(source + ": " + key + "." + field + " must be " + expected + ", found " +
                           Json(v).dump());
  };
  if (!(s.factor >= 1.0)) return bad("factor", s.factor, "at least 1");
  if (!(s.beta_fast > 0)) return bad("beta_fast", s.beta_fast, "positive");
  if (!(s.beta_slow > 0)) return bad("beta_slow", s.beta_slow, "positive");
  if (s.original_max_position_embeddings < 0) {
    return bad("original_max_position_embeddings", s.original_max_position_embeddings, "positive");
  }
  if (!(s.mscale >= 0)) return bad("mscale", s.mscale, "non-negative");
  if (!(s.mscale_all_dim >= 0)) return bad("mscale_all_dim", s.mscale_all_dim, "non-negative");
  if (!(s.attention_factor >= 0)) return bad("attention_factor", s.attention_factor, "positive");
  return OkStatus();
}

// rope_scaling, or transformers v5's rope_parameters (which also holds rope_theta).
Status ReadYarn(const Json& root, const std::string& source, ModelConfig* c) {
  c->yarn = false;
  const char* key = RopeScalingKey(root);
  if (key == nullptr) return OkStatus();
  const std::string name = key;
  const Json& rs = root[key];
  if (!rs.is_object()) {
    return InvalidArgument(source + ": " + name + " must be an object or null, found " + rs.dump());
  }
  FieldReader y(rs, source, name + ".");
  // transformers reads "rope_type", falling back to the older "type" (DeepSeek-V3's config).
  const char* type_key = y.Has("rope_type") ? "rope_type" : "type";
  std::string type;
  RETURN_IF_ERROR(y.String(type_key, &type));
  if (type.empty()) return InvalidArgument(source + ": " + name + " has no \"type\"");
  if (type != "yarn") {
    return Unimplemented(source + ": " + y.Name(type_key) + " \"" + type +
                         "\" is not supported for deepseek_v3 (only \"yarn\")");
  }
  for (const auto& [k, value] : rs.items()) {
    const bool known =
        std::find(std::begin(kYarnKeys), std::end(kYarnKeys), k) != std::end(kYarnKeys);
    if (!known && !(name == "rope_parameters" && k == "rope_theta")) {
      return Unimplemented(source + ": " + name + "." + k + " " + value.dump() +
                           " is not supported (yarn reads type, factor, "
                           "original_max_position_embeddings, beta_fast, beta_slow, mscale, "
                           "mscale_all_dim, attention_factor, truncate)");
    }
  }
  if (!y.Has("factor")) return InvalidArgument(source + ": " + name + ".factor is missing");
  YarnScaling& s = c->yarn_scaling;
  s = YarnScaling();
  RETURN_IF_ERROR(y.Double("factor", &s.factor));
  RETURN_IF_ERROR(y.Int("original_max_position_embeddings", &s.original_max_position_embeddings));
  RETURN_IF_ERROR(y.Double("beta_fast", &s.beta_fast));
  RETURN_IF_ERROR(y.Double("beta_slow", &s.beta_slow));
  RETURN_IF_ERROR(y.Double("mscale", &s.mscale));
  RETURN_IF_ERROR(y.Double("mscale_all_dim", &s.mscale_all_dim));
  RETURN_IF_ERROR(y.Double("attention_factor", &s.attention_factor));
  RETURN_IF_ERROR(y.Bool("truncate", &s.truncate));
  RETURN_IF_ERROR(ValidateYarn(s, source, name));
  c->yarn = true;
  return OkStatus();
}

Status NotMoreThan(const std::string& source, const std::string& what, int64_t value,
                   const std::string& limit_what, int64_t limit) {
  if (value <= limit) return OkStatus();
  return InvalidArgument(source + ": " + what + " (" + std::to_string(value) +
                         ") must not exceed " + limit_what + " (" + std::to_string(limit) + ")");
}

Status ValidateDeepseekMoe(const MoeConfig& m, const std::string& source) {
  if (m.n_shared_experts < 0) {
    return InvalidArgument(source + ": n_shared_experts must not be negative, found " +
                           Str(m.n_shared_experts));
  }
  if (m.first_k_dense_replace < 0) {
    return InvalidArgument(source + ": first_k_dense_replace must not be negative, found " +
                           Str(m.first_k_dense_replace));
  }
  RETURN_IF_ERROR(Positive(source, "n_group", m.n_group));
  RETURN_IF_ERROR(Positive(source, "topk_group", m.topk_group));
  RETURN_IF_ERROR(Positive(source, "routed_scaling_factor", m.routed_scaling_factor));
  if (m.num_experts % m.n_group != 0) {
    return InvalidArgument(source + ": n_routed_experts (" + Str(m.num_experts) +
                           ") must be a multiple of n_group (" + Str(m.n_group) + ")");
  }
  const int per_group = m.num_experts / m.n_group;
  if (per_group < 2) {  // a group's score is the sum of its two best experts' scores
    return InvalidArgument(source + ": n_routed_experts / n_group (" + Str(m.num_experts) + " / " +
                           Str(m.n_group) + ") must be at least 2");
  }
  RETURN_IF_ERROR(NotMoreThan(source, "topk_group", m.topk_group, "n_group", m.n_group));
  return NotMoreThan(source, "num_experts_per_tok", m.num_experts_per_tok,
                     "topk_group x experts per group", int64_t{m.topk_group} * per_group);
}

Status ValidateMla(const ModelConfig& c, const std::string& source) {
  const MlaConfig& m = c.mla;
  if (m.q_lora_rank < 0) {
    return InvalidArgument(source + ": q_lora_rank must be positive or null, found " +
                           Str(m.q_lora_rank));
  }
  RETURN_IF_ERROR(Positive(source, "kv_lora_rank", m.kv_lora_rank));
  RETURN_IF_ERROR(Positive(source, "qk_nope_head_dim", m.qk_nope_head_dim));
  RETURN_IF_ERROR(Positive(source, "qk_rope_head_dim", m.qk_rope_head_dim));
  RETURN_IF_ERROR(Positive(source, "v_head_dim", m.v_head_dim));
  if (m.qk_rope_head_dim % 2 != 0) {
    return InvalidArgument(source + ": qk_rope_head_dim (" + Str(m.qk_rope_head_dim) +
                           ") must be even for RoPE");
  }
  const int64_t widest = std::max<int64_t>(int64_t{m.qk_nope_head_dim} + m.qk_rope_head_dim,
                                           int64_t{m.qk_nope_head_dim} + m.v_head_dim);
  if (widest * c.num_heads > INT32_MAX ||
      int64_t{m.kv_lora_rank} + m.qk_rope_head_dim > INT32_MAX) {
    return InvalidArgument(source + ": num_attention_heads (" + Str(c.num_heads) +
                           ") x the MLA head sizes does not fit in 32 bits");
  }
  if (c.num_nextn_predict_layers < 0) {
    return InvalidArgument(source + ": num_nextn_predict_layers must not be negative, found " +
                           Str(c.num_nextn_predict_layers));
  }
  return OkStatus();
}

}  // namespace

Status ReadMoeFields(const Json& root, const FieldReader& r, ModelConfig* c) {
  if (c->arch == Arch::kQwen3Moe) return ReadQwen3Moe(r, &c->moe);
  RETURN_IF_ERROR(ReadDeepseekMoe(r, &c->moe));
  RETURN_IF_ERROR(ReadMla(root, r, c));
  return ReadYarn(root, r.source(), c);
}

Status ValidateMoe(const ModelConfig& c, const std::string& source) {
  const MoeConfig& m = c.moe;
  const bool deepseek = c.arch == Arch::kDeepseekV3;
  const char* experts_key = deepseek ? "n_routed_experts" : "num_experts";
  RETURN_IF_ERROR(Positive(source, experts_key, m.num_experts));
  RETURN_IF_ERROR(Positive(source, "num_experts_per_tok", m.num_experts_per_tok));
  RETURN_IF_ERROR(Positive(source, "moe_intermediate_size", m.moe_intermediate_size));
  RETURN_IF_ERROR(NotMoreThan(source, "num_experts_per_tok", m.num_experts_per_tok, experts_key,
                              m.num_experts));
  if (deepseek) {
    RETURN_IF_ERROR(ValidateDeepseekMoe(m, source));
    return ValidateMla(c, source);  // yarn is checked as it is read
  }
  RETURN_IF_ERROR(Positive(source, "decoder_sparse_step", m.decoder_sparse_step));
  for (int layer : m.mlp_only_layers) {
    if (layer < 0 || layer >= c.num_layers) {
      return InvalidArgument(source + ": mlp_only_layers holds " + Str(layer) +
                             ", outside the layers [0, " + Str(c.num_layers) + ")");
    }
  }
  return OkStatus();
}

void MoeFieldsToJson(const ModelConfig& c, Json* j) {
  const MoeConfig& m = c.moe;
  Json& o = *j;
  o["num_experts_per_tok"] = m.num_experts_per_tok;
  o["moe_intermediate_size"] = m.moe_intermediate_size;
  o["norm_topk_prob"] = m.norm_topk_prob;
  if (c.arch == Arch::kQwen3Moe) {
    o["num_experts"] = m.num_experts;
    o["decoder_sparse_step"] = m.decoder_sparse_step;
    o["mlp_only_layers"] = m.mlp_only_layers;
    o["output_router_logits"] = false;
    o["router_aux_loss_coef"] = 0.001;
    return;
  }
  o["n_routed_experts"] = m.num_experts;
  o["n_shared_experts"] = m.n_shared_experts;
  o["n_group"] = m.n_group;
  o["topk_group"] = m.topk_group;
  o["topk_method"] = "noaux_tc";
  o["scoring_func"] = "sigmoid";
  o["routed_scaling_factor"] = m.routed_scaling_factor;
  o["first_k_dense_replace"] = m.first_k_dense_replace;
  o["moe_layer_freq"] = 1;
  o["ep_size"] = 1;
  o["aux_loss_alpha"] = 0.001;
  o["seq_aux"] = true;
  o["pretraining_tp"] = 1;
  const MlaConfig& a = c.mla;
  o["q_lora_rank"] = a.q_lora_rank > 0 ? Json(a.q_lora_rank) : Json(nullptr);
  o["kv_lora_rank"] = a.kv_lora_rank;
  o["qk_nope_head_dim"] = a.qk_nope_head_dim;
  o["qk_rope_head_dim"] = a.qk_rope_head_dim;
  o["v_head_dim"] = a.v_head_dim;
  o["rope_interleave"] = a.rope_interleave;
  o["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  if (!c.yarn) {
    o["rope_scaling"] = nullptr;
    return;
  }
  const YarnScaling& s = c.yarn_scaling;
  Json rs = {{"type", "yarn"},
             {"factor", s.factor},
             {"beta_fast", s.beta_fast},
             {"beta_slow", s.beta_slow}};
  if (s.original_max_position_embeddings > 0)
    rs["original_max_position_embeddings"] = s.original_max_position_embeddings;
  if (s.mscale > 0) rs["mscale"] = s.mscale;
  if (s.mscale_all_dim > 0) rs["mscale_all_dim"] = s.mscale_all_dim;
  if (s.attention_factor > 0) rs["attention_factor"] = s.attention_factor;
  if (!s.truncate) rs["truncate"] = false;
  o["rope_scaling"] = std::move(rs);
}

}  // namespace pd::model::internal
