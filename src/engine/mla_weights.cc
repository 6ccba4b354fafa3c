#include "engine/mla_weights.h"

#include <cstring>

#include "common/check.h"
#include "engine/tp_shard_slices.h"

namespace pd::engine {
namespace {

// A LinearWeight viewing src's matrix (nothing owned, nothing copied).
LinearWeight View(const kernels::WeightMatrix& w) {
  LinearWeight out;
  out.w = w;
  return out;
}

// Rows [begin, begin+n) of a row-major matrix, a view.
kernels::WeightMatrix Rows(const kernels::WeightMatrix& w, int64_t begin, int64_t n) {
  PD_CHECK(w.layout == kernels::WeightLayout::kRowMajor && begin >= 0 && begin + n <= w.n);
  kernels::WeightMatrix out = w;
  out.n = n;
  out.data = static_cast<const uint8_t*>(w.data) + begin * w.k * (w.bf16 ? 2 : 4);
  return out;
}

// An fp8 kv_b as an owned f32 matrix (code * scale, exact to f32 rounding): its per-head W_UK^T
// and W_UV are multiplied with latent vectors, not through the panel kernels (vLLM dequantises
// kv_b_proj for its MLA absorption too).
void DequantiseToF32(LinearWeight* lw) {
  kernels::WeightMatrix& w = lw->w;
  const uint8_t* q = static_cast<const uint8_t*>(w.data);  // (n, k)
  const int64_t kb = kernels::Fp8KBlocks(w.k);
  lw->owned.resize(static_cast<size_t>(w.n * w.k));
  for (int64_t r = 0; r < w.n; ++r)
    for (int64_t i = 0; i < w.k; ++i)
      lw->owned[r * w.k + i] = model::Fp8E4m3ToF32(q[r * w.k + i]) *
                               w.scales[(r / kernels::kFp8Block) * kb + i / kernels::kFp8Block];
  w.data = lw->owned.data();
  w.fp8 = false;
  w.bf16 = false;
  w.scales = nullptr;
}

// uk_t_all (H*R, dn): row h*R + r, column i = kv_b[h*(dn+dv) + i, r]; and the per-head views.
void SplitKvB(const model::MlaConfig& m, int num_heads, RunnerMlaWeights* out) {
  const int64_t R = m.kv_lora_rank, dn = m.qk_nope_head_dim, dv = m.v_head_dim;
  const kernels::WeightMatrix& kv_b = out->kv_b.w;
  const bool bf16 = kv_b.bf16;
  LinearWeight& t = out->uk_t_all;
  t.w.bf16 = bf16;
  t.w.n = num_heads * R;
  t.w.k = dn;
  if (bf16) {
    t.owned_bf16.resize(static_cast<size_t>(num_heads) * R * dn);
    t.w.data = t.owned_bf16.data();
  } else {
    t.owned.resize(static_cast<size_t>(num_heads) * R * dn);
    t.w.data = t.owned.data();
  }
  const size_t elem = bf16 ? 2 : 4;
  const uint8_t* src = static_cast<const uint8_t*>(kv_b.data);
  uint8_t* dst = static_cast<uint8_t*>(const_cast<void*>(t.w.data));
  for (int64_t h = 0; h < num_heads; ++h)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < dn; ++i)
        std::memcpy(dst + ((h * R + r) * dn + i) * elem, src + ((h * (dn + dv) + i) * R + r) * elem,
                    elem);
  out->uk_t.clear();
  out->uv.clear();
  for (int64_t h = 0; h < num_heads; ++h) {
    out->uk_t.push_back(Rows(t.w, h * R, R));
    out->uv.push_back(Rows(kv_b, h * (dn + dv) + dn, dv));
  }
}

}  // namespace

Status PrepareMlaWeights(const model::MlaWeights& w, const model::ModelConfig& c,
                         model::DType dtype, const std::string& p, RunnerMlaWeights* out) {
  const model::MlaConfig& m = c.mla;
  const int64_t hd = c.hidden_size, H = c.num_heads, R = m.kv_lora_rank;
  const int64_t qh = m.qk_head_dim(), dn = m.qk_nope_head_dim, dv = m.v_head_dim;
  if (R <= 0 || dn <= 0 || m.qk_rope_head_dim <= 0 || dv <= 0 || m.qk_rope_head_dim % 2 != 0)
    return InvalidArgument("model config: MLA sizes kv_lora_rank " + std::to_string(R) +
                           ", qk_nope_head_dim " + std::to_string(dn) + ", qk_rope_head_dim " +
                           std::to_string(m.qk_rope_head_dim) + ", v_head_dim " +
                           std::to_string(dv) + " must be positive, the rope part even");
  if (m.q_lora_rank > 0) {
    if (!w.q_a_proj || !w.q_a_norm || !w.q_b_proj)
      return InvalidArgument("weights: " + p + "q_a_proj/q_a_layernorm/q_b_proj missing");
    RETURN_IF_ERROR(
        MakeLinear(*w.q_a_proj, m.q_lora_rank, hd, dtype, p + "q_a_proj.weight", &out->q_a));
    ASSIGN_OR_RETURN(out->q_a_norm,
                     ToF32Vector(*w.q_a_norm, m.q_lora_rank, p + "q_a_layernorm.weight"));
    RETURN_IF_ERROR(
        MakeLinear(*w.q_b_proj, H * qh, m.q_lora_rank, dtype, p + "q_b_proj.weight", &out->q_b));
  } else {
    if (!w.q_proj) return InvalidArgument("weights: " + p + "q_proj.weight is missing");
    RETURN_IF_ERROR(MakeLinear(*w.q_proj, H * qh, hd, dtype, p + "q_proj.weight", &out->q));
  }
  RETURN_IF_ERROR(MakeLinear(w.kv_a_proj, m.latent_dim(), hd, dtype,
                             p + "kv_a_proj_with_mqa.weight", &out->kv_a));
  ASSIGN_OR_RETURN(out->kv_a_norm, ToF32Vector(w.kv_a_norm, R, p + "kv_a_layernorm.weight"));
  RETURN_IF_ERROR(
      MakeLinear(w.kv_b_proj, H * (dn + dv), R, dtype, p + "kv_b_proj.weight", &out->kv_b));
  if (out->kv_b.w.fp8) DequantiseToF32(&out->kv_b);
  RETURN_IF_ERROR(MakeLinear(w.o_proj, hd, H * dv, dtype, p + "o_proj.weight", &out->o));
  SplitKvB(m, static_cast<int>(H), out);
  return OkStatus();
}

void AppendMlaPackJobs(RunnerMlaWeights* w, std::vector<PackJob>* jobs) {
  const bool q_lora = w->q_b.w.data != nullptr;
  jobs->push_back({{q_lora ? w->q_a.w : w->q.w, w->kv_a.w}, &w->a});
  if (q_lora) jobs->push_back({{w->q_b.w}, &w->q_b.w});
  for (kernels::WeightMatrix& m : w->uk_t) jobs->push_back({{m}, &m});
  for (kernels::WeightMatrix& m : w->uv) jobs->push_back({{m}, &m});
  jobs->push_back({{w->o.w}, &w->o.w});
}

RunnerMlaWeights ShardMlaWeights(const RunnerMlaWeights& f, const model::ModelConfig& c,
                                 int head_begin, int num_heads) {
  const model::MlaConfig& m = c.mla;
  const int64_t qh = m.qk_head_dim(), dn = m.qk_nope_head_dim, dv = m.v_head_dim;
  const int64_t q0 = head_begin * qh, nq = num_heads * qh;
  RunnerMlaWeights o;
  o.q_a = View(f.q_a.w);
  o.kv_a = View(f.kv_a.w);
  if (f.q.w.data != nullptr) {  // packed with kv_a into `a`: both f32 when q's slice must be
    const bool keep = SliceKeepsDtype(f.q.w, q0);
    o.q = SliceWeight(f.q.w, SliceAxis::kRows, q0, nq, !keep);
    if (!keep && f.kv_a.w.fp8)
      o.kv_a = SliceWeight(f.kv_a.w, SliceAxis::kRows, 0, f.kv_a.w.n, true);
  }
  o.q_a_norm = f.q_a_norm;
  if (f.q_b.w.data != nullptr)
    o.q_b = SliceWeight(f.q_b.w, SliceAxis::kRows, q0, nq, !SliceKeepsDtype(f.q_b.w, q0));
  o.kv_a_norm = f.kv_a_norm;
  o.kv_b = View(Rows(f.kv_b.w, head_begin * (dn + dv), num_heads * (dn + dv)));  // f32 (prepared)
  o.uk_t.assign(f.uk_t.begin() + head_begin, f.uk_t.begin() + head_begin + num_heads);
  o.uv.assign(f.uv.begin() + head_begin, f.uv.begin() + head_begin + num_heads);
  // o_proj (hidden, H*dv): this rank's columns [head_begin*dv, (head_begin+num_heads)*dv), copied.
  const int64_t o0 = head_begin * dv;
  o.o = SliceWeight(f.o.w, SliceAxis::kCols, o0, num_heads * dv, !SliceKeepsDtype(f.o.w, o0));
  return o;
}

}  // namespace pd::engine
