#include "engine/tp_shard.h"

#include <cstring>
#include <string>

#include "common/check.h"
#include "engine/kv_heads.h"
#include "engine/mla_weights.h"
#include "engine/tp_shard_slices.h"

namespace pd::engine {
namespace {

std::string Num(int64_t v) { return std::to_string(v); }

std::vector<float> Slice(const std::vector<float>& v, int64_t begin, int64_t n) {
  if (v.empty()) return {};
  return std::vector<float>(v.begin() + begin, v.begin() + begin + n);
}

// Rows [begin, begin+n) of each of `parts` (fused into one matrix at packing, so one dtype): views,
// or f32 copies when an FP8 part's slice would start inside a scale block.
std::vector<LinearWeight> RowSlices(
    const std::vector<std::pair<const LinearWeight*, WidthSplit>>& parts) {
  bool keep = true;
  for (const auto& [w, s] : parts) keep = keep && SliceKeepsDtype(w->w, s.begin);
  std::vector<LinearWeight> out;
  for (const auto& [w, s] : parts)
    out.push_back(SliceWeight(w->w, SliceAxis::kRows, s.begin, s.n, !keep));
  return out;
}

LinearWeight ColSlice(const LinearWeight& w, WidthSplit s) {
  return SliceWeight(w.w, SliceAxis::kCols, s.begin, s.n, !SliceKeepsDtype(w.w, s.begin));
}

// A SwiGLU MLP's rank slice: gate/up rows and down columns [s.begin, s.begin + s.n).
void ShardMlp(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down,
              WidthSplit s, LinearWeight* og, LinearWeight* ou, LinearWeight* od) {
  std::vector<LinearWeight> gu = RowSlices({{&gate, s}, {&up, s}});
  *og = std::move(gu[0]);
  *ou = std::move(gu[1]);
  *od = ColSlice(down, s);
}

// An expert's columns: [r*I/t, (r+1)*I/t) of its width I, as the dense MLP's (SplitWidth).
RunnerExpert ShardExpert(const RunnerExpert& f, const TpShard& s) {
  const WidthSplit w = SplitWidth(f.inter(), s.tp_size, s.rank, f.down.w.fp8);
  RunnerExpert o;
  ShardMlp(f.gate, f.up, f.down, w, &o.gate, &o.up, &o.down);
  return o;
}

// Every expert column-split; the router replicated (every rank routes every token alike).
void ShardMoe(const RunnerMoeWeights& f, const TpShard& s, RunnerMoeWeights* o) {
  o->router.w = f.router.w;  // a view
  o->router_bias = f.router_bias;
  for (const RunnerExpert& e : f.experts) o->experts.push_back(ShardExpert(e, s));
  for (const RunnerExpert& e : f.shared) o->shared.push_back(ShardExpert(e, s));
}

void ShardLayer(const RunnerLayerWeights& f, const TpShard& s, const model::ModelConfig& c,
                RunnerLayerWeights* o) {
  const int64_t head_dim = c.head_dim;
  const WidthSplit q{s.head_begin * head_dim, s.num_heads * head_dim};
  const WidthSplit kv{s.kv_head_begin * head_dim, s.num_kv_heads * head_dim};
  o->input_norm = f.input_norm;
  o->post_norm = f.post_norm;
  o->q_norm = f.q_norm;
  o->k_norm = f.k_norm;
  o->q_bias = Slice(f.q_bias, q.begin, q.n);
  o->k_bias = Slice(f.k_bias, kv.begin, kv.n);
  o->v_bias = Slice(f.v_bias, kv.begin, kv.n);
  o->o_bias = f.o_bias;    // added once to the reduced sum, identically on every rank
  if (f.mla != nullptr) {  // MLA: heads split, the latent projections whole on every rank
    o->mla =
        std::make_unique<RunnerMlaWeights>(ShardMlaWeights(*f.mla, c, s.head_begin, s.num_heads));
  } else {
    std::vector<LinearWeight> qkv = RowSlices({{&f.q, q}, {&f.k, kv}, {&f.v, kv}});
    o->q = std::move(qkv[0]);
    o->k = std::move(qkv[1]);
    o->v = std::move(qkv[2]);
    o->o = ColSlice(f.o, q);
  }
  if (!f.moe.experts.empty()) return ShardMoe(f.moe, s, &o->moe);
  const WidthSplit mlp = SplitWidth(f.gate.w.n, s.tp_size, s.rank, f.down.w.fp8);
  ShardMlp(f.gate, f.up, f.down, mlp, &o->gate, &o->up, &o->down);
}

// The rank's MLP widths, as its layers hold them (SplitWidth may deal FP8 blocks unevenly).
void SetRankWidths(const RunnerWeights& w, model::ModelConfig* c) {
  for (const RunnerLayerWeights& l : w.layers) {
    if (l.gate.w.data != nullptr) c->intermediate_size = static_cast<int>(l.gate.w.n);
    if (!l.moe.experts.empty())
      c->moe.moe_intermediate_size = static_cast<int>(l.moe.experts[0].inter());
  }
}

}  // namespace

Status ValidateTensorParallel(const model::ModelConfig& c, int tp) {
  const std::string who = "tensor_parallel_size " + Num(tp);
  if (tp < 1) return InvalidArgument(who + " must be at least 1");
  if (tp == 1) return OkStatus();
  if (c.num_heads % tp != 0)
    return InvalidArgument(who + " does not divide num_attention_heads " + Num(c.num_heads));
  const int64_t moe_inter = c.moe.moe_intermediate_size;
  if (c.is_moe() && moe_inter % tp != 0)
    return InvalidArgument(who + " does not divide the experts' width moe_intermediate_size " +
                           Num(moe_inter));
  bool dense_mlp = false;  // a layer with the dense MLP (every layer of a dense model)
  for (int l = 0; l < c.num_layers; ++l) dense_mlp = dense_mlp || !c.IsMoeLayer(l);
  if (dense_mlp && c.intermediate_size % tp != 0)
    return InvalidArgument(who + " does not divide the MLP width intermediate_size " +
                           Num(c.intermediate_size));
  RETURN_IF_ERROR(ValidateKvHeadSplit(c.num_kv_heads, tp));
  if (c.vocab_size < tp) return InvalidArgument(who + " exceeds vocab_size " + Num(c.vocab_size));
  return OkStatus();
}

TpShard ComputeTpShard(const model::ModelConfig& c, int tp, int rank) {
  TpShard s;
  s.rank = rank;
  s.tp_size = tp;
  s.num_heads = c.num_heads / tp;
  s.head_begin = rank * s.num_heads;
  const KvHeadRange kv = RankKvHeads(c.num_kv_heads, tp, rank);
  s.kv_head_begin = kv.begin;
  s.num_kv_heads = kv.size();
  s.inter = c.intermediate_size / tp;
  s.inter_begin = rank * s.inter;
  s.vocab_begin = static_cast<int64_t>(c.vocab_size) * rank / tp;
  s.vocab = static_cast<int64_t>(c.vocab_size) * (rank + 1) / tp - s.vocab_begin;
  return s;
}

Result<std::unique_ptr<RunnerWeights>> ShardRunnerWeights(const RunnerWeights& full,
                                                          const TpShard& s) {
  const model::ModelConfig& c = full.config;
  RETURN_IF_ERROR(ValidateTensorParallel(c, s.tp_size));
  if (full.packed != nullptr) return FailedPrecondition("ShardRunnerWeights: weights are packed");
  auto out = std::make_unique<RunnerWeights>();
  out->config = c;
  out->kv_scales = full.kv_scales;  // per tensor: the same on every rank
  out->config.num_heads = s.num_heads;
  out->config.num_kv_heads = s.num_kv_heads;
  out->config.intermediate_size = static_cast<int>(s.inter);
  out->config.moe.moe_intermediate_size = c.moe.moe_intermediate_size / s.tp_size;
  out->final_norm = full.final_norm;
  out->embed.w = full.embed.w;  // a view: every rank looks up rows of the same table
  out->lm_head = SliceWeight(full.lm_head.w, SliceAxis::kRows, s.vocab_begin, s.vocab,
                             !SliceKeepsDtype(full.lm_head.w, s.vocab_begin));
  out->layers.resize(full.layers.size());
  for (size_t l = 0; l < full.layers.size(); ++l) ShardLayer(full.layers[l], s, c, &out->layers[l]);
  SetRankWidths(*out, &out->config);
  return out;
}

}  // namespace pd::engine
