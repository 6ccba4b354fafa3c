#include "engine/tp_shard.h"

#include <cstring>
#include <string>

#include "common/check.h"
#include "engine/kv_heads.h"
#include "engine/mla_weights.h"

namespace pd::engine {
namespace {

std::string Num(int64_t v) { return std::to_string(v); }

bool AnyFp8(const RunnerWeights& w) {
  for (const RunnerLayerWeights& l : w.layers) {
    if (l.o.w.fp8 || l.down.w.fp8 || (l.mla != nullptr && l.mla->o.w.fp8)) return true;
    for (const std::vector<RunnerExpert>* v : {&l.moe.experts, &l.moe.shared})
      for (const RunnerExpert& e : *v)
        if (e.down.w.fp8) return true;
  }
  return false;
}

// Rows [begin, begin+n) of a row-major W (N, k): a view, nothing copied.
LinearWeight RowSlice(const LinearWeight& src, int64_t begin, int64_t n) {
  PD_CHECK(src.w.layout == kernels::WeightLayout::kRowMajor);
  PD_CHECK(begin >= 0 && begin + n <= src.w.n);
  LinearWeight out;
  out.w = src.w;
  out.w.n = n;
  const size_t elem = src.w.bf16 ? 2 : 4;
  out.w.data = static_cast<const uint8_t*>(src.w.data) + begin * src.w.k * elem;
  return out;
}

// Columns [begin, begin+n) of a row-major W (N, k), copied into a (N, n) matrix the result owns.
LinearWeight ColSlice(const LinearWeight& src, int64_t begin, int64_t n) {
  PD_CHECK(src.w.layout == kernels::WeightLayout::kRowMajor);
  PD_CHECK(begin >= 0 && begin + n <= src.w.k);
  LinearWeight out;
  out.w = src.w;
  out.w.k = n;
  const int64_t rows = src.w.n;
  if (src.w.bf16) {
    out.owned_bf16.resize(static_cast<size_t>(rows) * n);
    const uint16_t* s = static_cast<const uint16_t*>(src.w.data);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(out.owned_bf16.data() + r * n, s + r * src.w.k + begin, n * sizeof(uint16_t));
    out.w.data = out.owned_bf16.data();
  } else {
    out.owned.resize(static_cast<size_t>(rows) * n);
    const float* s = static_cast<const float*>(src.w.data);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(out.owned.data() + r * n, s + r * src.w.k + begin, n * sizeof(float));
    out.w.data = out.owned.data();
  }
  return out;
}

std::vector<float> Slice(const std::vector<float>& v, int64_t begin, int64_t n) {
  if (v.empty()) return {};
  return std::vector<float>(v.begin() + begin, v.begin() + begin + n);
}

// Columns [r*I/t, (r+1)*I/t) of an expert of width I, as the dense MLP's.
RunnerExpert ShardExpert(const RunnerExpert& f, const TpShard& s) {
  const int64_t n = f.inter() / s.tp_size, begin = s.rank * n;
  RunnerExpert o;
  o.gate = RowSlice(f.gate, begin, n);
  o.up = RowSlice(f.up, begin, n);
  o.down = ColSlice(f.down, begin, n);
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
  const int64_t q0 = s.head_begin * head_dim, nq = s.num_heads * head_dim;
  const int64_t k0 = s.kv_head_begin * head_dim, nk = s.num_kv_heads * head_dim;
  o->input_norm = f.input_norm;
  o->post_norm = f.post_norm;
  o->q_norm = f.q_norm;
  o->k_norm = f.k_norm;
  o->q_bias = Slice(f.q_bias, q0, nq);
  o->k_bias = Slice(f.k_bias, k0, nk);
  o->v_bias = Slice(f.v_bias, k0, nk);
  o->o_bias = f.o_bias;    // added once to the reduced sum, identically on every rank
  if (f.mla != nullptr) {  // MLA: heads split, the latent projections whole on every rank
    o->mla =
        std::make_unique<RunnerMlaWeights>(ShardMlaWeights(*f.mla, c, s.head_begin, s.num_heads));
  } else {
    o->q = RowSlice(f.q, q0, nq);
    o->k = RowSlice(f.k, k0, nk);
    o->v = RowSlice(f.v, k0, nk);
    o->o = ColSlice(f.o, q0, nq);
  }
  if (!f.moe.experts.empty()) return ShardMoe(f.moe, s, &o->moe);
  o->gate = RowSlice(f.gate, s.inter_begin, s.inter);
  o->up = RowSlice(f.up, s.inter_begin, s.inter);
  o->down = ColSlice(f.down, s.inter_begin, s.inter);
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
  if (AnyFp8(full))  // slices would have to follow the 128x128 scale blocks
    return Unimplemented("tensor parallelism over FP8 weights is not supported (tp_size " +
                         Num(s.tp_size) + "): run an FP8 checkpoint with tp 1");
  auto out = std::make_unique<RunnerWeights>();
  out->config = c;
  out->kv_scales = full.kv_scales;  // per tensor: the same on every rank
  out->config.num_heads = s.num_heads;
  out->config.num_kv_heads = s.num_kv_heads;
  out->config.intermediate_size = static_cast<int>(s.inter);
  out->config.moe.moe_intermediate_size = c.moe.moe_intermediate_size / s.tp_size;
  out->final_norm = full.final_norm;
  out->embed.w = full.embed.w;  // a view: every rank looks up rows of the same table
  out->lm_head = RowSlice(full.lm_head, s.vocab_begin, s.vocab);
  out->layers.resize(full.layers.size());
  for (size_t l = 0; l < full.layers.size(); ++l) ShardLayer(full.layers[l], s, c, &out->layers[l]);
  return out;
}

}  // namespace pd::engine
