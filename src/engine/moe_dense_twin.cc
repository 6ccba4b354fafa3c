#include "engine/moe_dense_twin.h"

#include <cstring>
#include <string>

namespace pd::engine {
namespace {

using model::TensorView;
using Parts = std::vector<std::pair<const TensorView*, int64_t>>;
constexpr int64_t kBlock = 128;  // FP8 scale block (weights.h: ScaleInvShape)

int64_t Blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }

// FP8 parts sit side by side with their scale blocks only if every part but the last is a whole
// number of blocks along the stacked axis; InvalidArgument naming the layer and width otherwise.
Status CheckFp8Parts(const Parts& parts, int layer) {
  if (parts[0].first->dtype != model::DType::kF8E4M3) return OkStatus();
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    if (parts[i].second % kBlock != 0)
      return InvalidArgument("dense twin: layer " + std::to_string(layer) + ": FP8 width " +
                             std::to_string(parts[i].second) +
                             " is not a multiple of the 128-wide scale block, so the experts' "
                             "blocks cannot sit side by side");
  return OkStatus();
}

// Rows [0, rows) of each part (each (n_i, k)) stacked into one (sum, k) tensor (FP8: with the
// scale rows of those rows).
TensorView StackRows(DenseTwin* t, const Parts& parts) {
  const TensorView& first = *parts[0].first;
  const size_t elem = model::DTypeSize(first.dtype);
  int64_t n = 0;
  const int64_t k = first.shape[1];
  for (const auto& [v, rows] : parts) n += rows;
  std::vector<uint8_t>& buf = t->buffers.emplace_back(static_cast<size_t>(n * k) * elem);
  size_t off = 0;
  for (const auto& [v, rows] : parts) {
    std::memcpy(buf.data() + off, v->data, static_cast<size_t>(rows * k) * elem);
    off += static_cast<size_t>(rows * k) * elem;
  }
  TensorView out{first.dtype, {n, k}, buf.data()};
  if (first.scale_inv == nullptr) return out;
  std::vector<uint8_t>& sb = t->buffers.emplace_back(Blocks(n) * Blocks(k) * sizeof(float));
  float* dst = reinterpret_cast<float*>(sb.data());
  for (const auto& [v, rows] : parts) {
    std::memcpy(dst, v->scale_inv, Blocks(rows) * Blocks(k) * sizeof(float));
    dst += Blocks(rows) * Blocks(k);
  }
  out.scale_inv = reinterpret_cast<const float*>(sb.data());
  return out;
}

// Columns [0, cols) of each part (each (n, k_i)) side by side in one (n, sum) tensor (FP8: with
// the scale columns of those columns).
TensorView StackCols(DenseTwin* t, const Parts& parts) {
  const TensorView& first = *parts[0].first;
  const size_t elem = model::DTypeSize(first.dtype);
  int64_t w = 0;
  const int64_t n = first.shape[0];
  for (const auto& [v, cols] : parts) w += cols;
  std::vector<uint8_t>& buf = t->buffers.emplace_back(static_cast<size_t>(n * w) * elem);
  for (int64_t r = 0; r < n; ++r) {
    size_t off = static_cast<size_t>(r * w) * elem;
    for (const auto& [v, cols] : parts) {
      const uint8_t* src = static_cast<const uint8_t*>(v->data) + r * v->shape[1] * elem;
      std::memcpy(buf.data() + off, src, static_cast<size_t>(cols) * elem);
      off += static_cast<size_t>(cols) * elem;
    }
  }
  TensorView out{first.dtype, {n, w}, buf.data()};
  if (first.scale_inv == nullptr) return out;
  std::vector<uint8_t>& sb = t->buffers.emplace_back(Blocks(n) * Blocks(w) * sizeof(float));
  float* dst = reinterpret_cast<float*>(sb.data());
  for (int64_t rb = 0; rb < Blocks(n); ++rb)
    for (const auto& [v, cols] : parts) {
      std::memcpy(dst, v->scale_inv + rb * Blocks(v->shape[1]), Blocks(cols) * sizeof(float));
      dst += Blocks(cols);
    }
  out.scale_inv = reinterpret_cast<const float*>(sb.data());
  return out;
}

}  // namespace

Result<std::unique_ptr<DenseTwin>> MakeDenseTwin(const model::ModelWeights& moe) {
  const model::ModelConfig& c = moe.config;
  if (!c.is_moe()) return InvalidArgument("dense twin: the model has no MoE layer");
  const model::MoeConfig& m = c.moe;
  const int64_t mi = m.moe_intermediate_size;
  const int64_t width = (m.num_experts_per_tok + m.n_shared_experts) * mi;
  auto t = std::make_unique<DenseTwin>();
  t->buffers.reserve(6 * moe.layers.size());  // views point into them: never reallocate
  model::ModelWeights& w = t->weights;
  w.config = c;
  w.config.arch = c.arch == model::Arch::kQwen3Moe ? model::Arch::kQwen3 : c.arch;
  w.config.moe = model::MoeConfig();  // num_experts 0: every layer dense
  w.config.intermediate_size = static_cast<int>(width);
  w.dtype = moe.dtype;
  w.fp8 = moe.fp8;
  w.embed_tokens = moe.embed_tokens;
  w.final_norm = moe.final_norm;
  w.lm_head = moe.lm_head;
  for (int l = 0; l < c.num_layers; ++l) {
    model::LayerWeights lw = moe.layers[l];
    lw.moe.reset();
    Parts gate, up, down;
    if (c.IsMoeLayer(l)) {
      const model::MoeWeights& mw = *moe.layers[l].moe;
      std::vector<const model::MlpWeights*> experts;
      for (int e = 0; e < m.num_experts_per_tok; ++e) experts.push_back(&mw.experts[e]);
      if (mw.shared_expert.has_value()) experts.push_back(&*mw.shared_expert);
      for (const model::MlpWeights* x : experts) {
        const int64_t cols = x->gate_proj.shape[0];
        gate.push_back({&x->gate_proj, cols});
        up.push_back({&x->up_proj, cols});
        down.push_back({&x->down_proj, cols});
      }
    } else {
      if (c.intermediate_size < width)
        return InvalidArgument("dense twin: layer " + std::to_string(l) + "'s intermediate_size " +
                               std::to_string(c.intermediate_size) + " is under the active width " +
                               std::to_string(width));
      const model::LayerWeights& src = moe.layers[l];
      gate.push_back({&src.gate_proj, width});
      up.push_back({&src.up_proj, width});
      down.push_back({&src.down_proj, width});
    }
    for (const Parts* p : {&gate, &up, &down}) RETURN_IF_ERROR(CheckFp8Parts(*p, l));
    lw.gate_proj = StackRows(t.get(), gate);
    lw.up_proj = StackRows(t.get(), up);
    lw.down_proj = StackCols(t.get(), down);
    w.layers.push_back(std::move(lw));
  }
  return t;
}

}  // namespace pd::engine
