#include "engine/moe_dense_twin.h"

#include <cstring>
#include <string>

namespace pd::engine {
namespace {

using model::TensorView;

// Rows [0, rows) of each part (each (n_i, k)) stacked into one (sum, k) tensor.
TensorView StackRows(DenseTwin* t, const std::vector<std::pair<const TensorView*, int64_t>>& parts,
                     size_t elem) {
  int64_t n = 0;
  const int64_t k = parts[0].first->shape[1];
  for (const auto& [v, rows] : parts) n += rows;
  std::vector<uint8_t>& buf = t->buffers.emplace_back(static_cast<size_t>(n * k) * elem);
  size_t off = 0;
  for (const auto& [v, rows] : parts) {
    std::memcpy(buf.data() + off, v->data, static_cast<size_t>(rows * k) * elem);
    off += static_cast<size_t>(rows * k) * elem;
  }
  return TensorView{parts[0].first->dtype, {n, k}, buf.data()};
}

// Columns [0, cols) of each part (each (n, k_i)) side by side in one (n, sum) tensor.
TensorView StackCols(DenseTwin* t, const std::vector<std::pair<const TensorView*, int64_t>>& parts,
                     size_t elem) {
  int64_t w = 0;
  const int64_t n = parts[0].first->shape[0];
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
  return TensorView{parts[0].first->dtype, {n, w}, buf.data()};
}

}  // namespace

Result<std::unique_ptr<DenseTwin>> MakeDenseTwin(const model::ModelWeights& moe) {
  const model::ModelConfig& c = moe.config;
  if (!c.is_moe()) return InvalidArgument("dense twin: the model has no MoE layer");
  if (moe.fp8) return Unimplemented("dense twin: FP8 checkpoints are not supported");
  const model::MoeConfig& m = c.moe;
  const int64_t mi = m.moe_intermediate_size;
  const int64_t width = (m.num_experts_per_tok + m.n_shared_experts) * mi;
  auto t = std::make_unique<DenseTwin>();
  t->buffers.reserve(3 * moe.layers.size());  // views point into them: never reallocate
  model::ModelWeights& w = t->weights;
  w.config = c;
  w.config.arch = c.arch == model::Arch::kQwen3Moe ? model::Arch::kQwen3 : c.arch;
  w.config.moe = model::MoeConfig();  // num_experts 0: every layer dense
  w.config.intermediate_size = static_cast<int>(width);
  w.dtype = moe.dtype;
  w.embed_tokens = moe.embed_tokens;
  w.final_norm = moe.final_norm;
  w.lm_head = moe.lm_head;
  const size_t elem = model::DTypeSize(moe.dtype);
  for (int l = 0; l < c.num_layers; ++l) {
    model::LayerWeights lw = moe.layers[l];
    lw.moe.reset();
    std::vector<std::pair<const TensorView*, int64_t>> gate, up, down;
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
    lw.gate_proj = StackRows(t.get(), gate, elem);
    lw.up_proj = StackRows(t.get(), up, elem);
    lw.down_proj = StackCols(t.get(), down, elem);
    w.layers.push_back(std::move(lw));
  }
  return t;
}

}  // namespace pd::engine
