// make-model's qwen3_moe and deepseek_v3 presets. The test presets (tiny, small) have dense and
// MoE layers both, odd widths, and for deepseek_v3 q_lora_rank > 0, yarn and an MTP layer. The
// benchmark presets (deepseek-v3-1g, qwen3-moe-1g) keep the real models' proportions at about
// 1 GB of bf16 weights.
#include "model/model_writer_internal.h"

namespace pd::model::internal {
namespace {

void Qwen3MoePreset(bool tiny, ModelConfig* c) {
  MoeConfig& m = c->moe;
  m.scoring = MoeConfig::Scoring::kSoftmax;
  m.norm_topk_prob = true;
  if (tiny) {
    c->hidden_size = 64, c->num_layers = 3, c->num_heads = 4, c->num_kv_heads = 2;
    c->head_dim = 32, c->intermediate_size = 160, c->vocab_size = 512;
    m.num_experts = 8, m.num_experts_per_tok = 2, m.moe_intermediate_size = 40;
    m.decoder_sparse_step = 1, m.mlp_only_layers = {1};  // layers 0 and 2 sparse, 1 dense
  } else {
    c->hidden_size = 256, c->num_layers = 4, c->num_heads = 8, c->num_kv_heads = 2;
    c->head_dim = 64, c->intermediate_size = 704, c->vocab_size = 2048;
    m.num_experts = 16, m.num_experts_per_tok = 4, m.moe_intermediate_size = 96;
    m.decoder_sparse_step = 2, m.mlp_only_layers = {};  // layers 1 and 3 sparse
  }
}

void DeepseekV3Preset(bool tiny, ModelConfig* c) {
  MoeConfig& m = c->moe;
  MlaConfig& a = c->mla;
  m.scoring = MoeConfig::Scoring::kSigmoid;
  m.norm_topk_prob = true, m.routed_scaling_factor = 2.5, m.n_shared_experts = 1;
  m.first_k_dense_replace = 1;
  if (tiny) {
    c->hidden_size = 64, c->num_layers = 3, c->num_heads = 4;
    c->intermediate_size = 160, c->vocab_size = 512;
    m.num_experts = 8, m.num_experts_per_tok = 3, m.moe_intermediate_size = 40;
    m.n_group = 4, m.topk_group = 2;
    a.q_lora_rank = 40, a.kv_lora_rank = 28, a.qk_nope_head_dim = 16, a.qk_rope_head_dim = 8;
    a.v_head_dim = 16;
  } else {
    c->hidden_size = 256, c->num_layers = 4, c->num_heads = 8;
    c->intermediate_size = 704, c->vocab_size = 2048;
    m.num_experts = 16, m.num_experts_per_tok = 4, m.moe_intermediate_size = 96;
    m.n_group = 4, m.topk_group = 2;
    a.q_lora_rank = 96, a.kv_lora_rank = 64, a.qk_nope_head_dim = 32, a.qk_rope_head_dim = 16;
    a.v_head_dim = 32;
  }
  // yarn as DeepSeek-V3 has it, with max_position_embeddings = factor x original.
  c->yarn = true;
  c->yarn_scaling = YarnScaling();
  c->yarn_scaling.factor = 4.0;
  c->yarn_scaling.original_max_position_embeddings = 1024;
  c->yarn_scaling.beta_fast = 32.0, c->yarn_scaling.beta_slow = 1.0;
  c->yarn_scaling.mscale = 1.0, c->yarn_scaling.mscale_all_dim = 1.0;
  c->max_position_embeddings = 4096;
  c->num_nextn_predict_layers = 1;
}

// DeepSeek-V3's MLA widths, routing and yarn as published, scaled to ~1 GB of bf16: 8 layers
// (1 dense) of hidden 1024, 16 heads, 64 routed experts (top 8, 8 groups, 4 eligible) of width 256
// and one shared expert, vocab 32768, one MTP layer.
void DeepseekV3OneGigabyte(ModelConfig* c) {
  MoeConfig& m = c->moe;
  MlaConfig& a = c->mla;
  c->hidden_size = 1024, c->num_layers = 8, c->num_heads = 16;
  c->intermediate_size = 2816, c->vocab_size = 32768, c->rms_norm_eps = 1e-6;
  m.scoring = MoeConfig::Scoring::kSigmoid;
  m.num_experts = 64, m.num_experts_per_tok = 8, m.moe_intermediate_size = 256;
  m.n_group = 8, m.topk_group = 4, m.n_shared_experts = 1, m.first_k_dense_replace = 1;
  m.norm_topk_prob = true, m.routed_scaling_factor = 2.5;
  a.q_lora_rank = 384, a.kv_lora_rank = 512, a.qk_nope_head_dim = 128, a.qk_rope_head_dim = 64;
  a.v_head_dim = 128;
  c->yarn = true;
  c->yarn_scaling = YarnScaling();
  c->yarn_scaling.factor = 40.0, c->yarn_scaling.original_max_position_embeddings = 4096;
  c->yarn_scaling.beta_fast = 32.0, c->yarn_scaling.beta_slow = 1.0;
  c->yarn_scaling.mscale = 1.0, c->yarn_scaling.mscale_all_dim = 1.0;
  c->max_position_embeddings = 163840;
  c->num_nextn_predict_layers = 1;
}

// Qwen3-30B-A3B's proportions scaled to ~1 GB of bf16: 6 layers, all sparse, of hidden 1024,
// 16 heads (2 KV) of head_dim 128, 64 experts (top 8) of width 384, vocab 32768.
void Qwen3MoeOneGigabyte(ModelConfig* c) {
  MoeConfig& m = c->moe;
  c->hidden_size = 1024, c->num_layers = 6, c->num_heads = 16, c->num_kv_heads = 2;
  c->head_dim = 128, c->intermediate_size = 3072, c->vocab_size = 32768;
  c->max_position_embeddings = 40960;
  m.scoring = MoeConfig::Scoring::kSoftmax;
  m.num_experts = 64, m.num_experts_per_tok = 8, m.moe_intermediate_size = 384;
  m.norm_topk_prob = true, m.decoder_sparse_step = 1, m.mlp_only_layers = {};
}

Status OnlyFor(Arch want, Arch arch, const char* option) {
  if (arch == want) return OkStatus();
  return InvalidArgument(std::string(option) + " applies to " + std::string(ArchName(want)) +
                         " only, not " + std::string(ArchName(arch)));
}

}  // namespace

Status MoePreset(std::string_view preset, ModelConfig* c) {
  const bool deepseek = c->arch == Arch::kDeepseekV3;
  const char* own = deepseek ? "deepseek-v3-1g" : "qwen3-moe-1g";
  const char* other = deepseek ? "qwen3-moe-1g" : "deepseek-v3-1g";
  if (preset == "tiny" || preset == "small") {
    if (deepseek) {
      DeepseekV3Preset(preset == "tiny", c);
    } else {
      Qwen3MoePreset(preset == "tiny", c);
    }
  } else if (preset == own) {
    if (deepseek) {
      DeepseekV3OneGigabyte(c);
    } else {
      Qwen3MoeOneGigabyte(c);
    }
  } else if (preset == other) {
    return InvalidArgument("preset \"" + std::string(preset) + "\" is for " +
                           (deepseek ? "qwen3_moe" : "deepseek_v3") + ", not " +
                           std::string(ArchName(c->arch)));
  } else {
    return InvalidArgument("unknown preset \"" + std::string(preset) + "\" for " +
                           std::string(ArchName(c->arch)) + " (expected tiny, small or " + own +
                           ")");
  }
  if (c->arch == Arch::kDeepseekV3) {
    c->num_kv_heads = c->num_heads;  // as DeepseekV3Config has it
    c->head_dim = c->mla.qk_rope_head_dim;
  }
  return OkStatus();
}

Status ApplyMoeOverrides(const SyntheticModelOptions& o, ModelConfig* c) {
  if (o.q_lora_rank) {
    RETURN_IF_ERROR(OnlyFor(Arch::kDeepseekV3, c->arch, "q_lora_rank"));
    if (*o.q_lora_rank < 0) {
      return InvalidArgument("q_lora_rank must not be negative, got " +
                             std::to_string(*o.q_lora_rank));
    }
    c->mla.q_lora_rank = *o.q_lora_rank;
  }
  if (o.yarn) {
    RETURN_IF_ERROR(OnlyFor(Arch::kDeepseekV3, c->arch, "yarn"));
    c->yarn = *o.yarn;
  }
  if (o.num_nextn_predict_layers) {
    RETURN_IF_ERROR(OnlyFor(Arch::kDeepseekV3, c->arch, "num_nextn_predict_layers"));
    if (*o.num_nextn_predict_layers < 0) {
      return InvalidArgument("num_nextn_predict_layers must not be negative, got " +
                             std::to_string(*o.num_nextn_predict_layers));
    }
    c->num_nextn_predict_layers = *o.num_nextn_predict_layers;
  }
  if (o.rope_interleave) {
    RETURN_IF_ERROR(OnlyFor(Arch::kDeepseekV3, c->arch, "rope_interleave"));
    c->mla.rope_interleave = *o.rope_interleave;
  }
  if (o.norm_topk_prob) {
    if (!c->is_moe()) {
      return InvalidArgument("norm_topk_prob applies to qwen3_moe and deepseek_v3 only, not " +
                             std::string(ArchName(c->arch)));
    }
    c->moe.norm_topk_prob = *o.norm_topk_prob;
  }
  return OkStatus();
}

}  // namespace pd::model::internal
