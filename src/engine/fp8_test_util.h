// Test helper: an f32 TinyModel turned into the FP8 checkpoint of it, its linear weights block
// quantised as `make-model --dtype fp8` and `pdserve quantize` write them.
#pragma once

#include <memory>

#include "common/check.h"
#include "engine/model_runner_test_util.h"
#include "model/fp8_quant.h"

namespace pd::engine::testing {

// An f32 matrix view of m replaced by its FP8 block quantisation (codes and scale_inv in m).
inline void Quantise(TinyModel* m, model::TensorView* t) {
  if (t->data == nullptr) return;
  PD_CHECK(t->dtype == model::DType::kF32 && t->shape.size() == 2);
  const int64_t n = t->shape[0], k = t->shape[1];
  const std::vector<int64_t> ss = model::ScaleInvShape(t->shape);
  // Pointers, not references: an emplace_back may move the vectors (not their heap buffers).
  uint8_t* codes = m->buffers.emplace_back(static_cast<size_t>(n * k)).data();
  float* scales = reinterpret_cast<float*>(
      m->buffers.emplace_back(static_cast<size_t>(ss[0] * ss[1]) * 4).data());
  model::QuantizeFp8Blocks(static_cast<const float*>(t->data), n, k, codes, scales);
  t->dtype = model::DType::kF8E4M3;
  t->data = codes;
  t->scale_inv = scales;
}

inline void QuantiseMlp(TinyModel* m, model::MlpWeights* x) {
  for (model::TensorView* t : {&x->gate_proj, &x->up_proj, &x->down_proj}) Quantise(m, t);
}

// Every linear weight an FP8 checkpoint quantises (embeddings, norms, router, lm_head stay f32).
inline std::unique_ptr<TinyModel> ToFp8(std::unique_ptr<TinyModel> m) {
  for (model::LayerWeights& l : m->weights.layers) {
    for (model::TensorView* t :
         {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj})
      Quantise(m.get(), t);
    if (l.mla.has_value()) {
      model::MlaWeights& a = *l.mla;
      for (std::optional<model::TensorView>* t : {&a.q_proj, &a.q_a_proj, &a.q_b_proj})
        if (t->has_value()) Quantise(m.get(), &**t);
      for (model::TensorView* t : {&a.kv_a_proj, &a.kv_b_proj, &a.o_proj}) Quantise(m.get(), t);
    }
    if (l.moe.has_value()) {
      for (model::MlpWeights& x : l.moe->experts) QuantiseMlp(m.get(), &x);
      if (l.moe->shared_expert.has_value()) QuantiseMlp(m.get(), &*l.moe->shared_expert);
    }
  }
  m->weights.fp8 = true;
  return m;
}

}  // namespace pd::engine::testing
