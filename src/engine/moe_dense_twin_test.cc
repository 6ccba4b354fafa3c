#include "engine/moe_dense_twin.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "engine/fp8_test_util.h"
#include "engine/model_runner.h"
#include "engine/moe_test_util.h"

namespace pd::engine {
namespace {

float At(const model::TensorView& t, int64_t r, int64_t c) { return t.At(r * t.shape[1] + c); }

TEST(MoeDenseTwinTest, MlpIsTheFirstTopKExpertsAndTheSharedOneSideBySide) {
  testing::TinyModelOptions o;
  o.arch = model::Arch::kQwen3Moe;
  o.dtype = model::DType::kBF16;
  o.hidden = 24;
  o.intermediate = 40;
  o.layers = 2;
  auto m = testing::MakeTinyModel(o);
  model::MoeConfig moe;
  moe.num_experts = 5;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 8;
  moe.n_shared_experts = 1;
  moe.mlp_only_layers = {1};
  testing::AddMoeLayers(m.get(), moe, 3);
  auto twin = MakeDenseTwin(m->weights);
  ASSERT_TRUE(twin.ok()) << twin.status().ToString();
  const model::ModelWeights& t = (*twin)->weights;
  EXPECT_FALSE(t.config.is_moe());
  EXPECT_EQ(t.config.intermediate_size, 24);  // (2 + 1) * 8
  const model::MoeWeights& mw = *m->weights.layers[0].moe;
  const model::LayerWeights& l0 = t.layers[0];
  ASSERT_EQ(l0.gate_proj.shape, (std::vector<int64_t>{24, 24}));
  ASSERT_EQ(l0.down_proj.shape, (std::vector<int64_t>{24, 24}));
  for (int64_t c = 0; c < 24; ++c) {
    EXPECT_EQ(At(l0.gate_proj, 8 + 3, c), At(mw.experts[1].gate_proj, 3, c));
    EXPECT_EQ(At(l0.up_proj, 16 + 5, c), At(mw.shared_expert->up_proj, 5, c));
  }
  for (int64_t r = 0; r < 24; ++r) {
    EXPECT_EQ(At(l0.down_proj, r, 2), At(mw.experts[0].down_proj, r, 2));
    EXPECT_EQ(At(l0.down_proj, r, 16 + 7), At(mw.shared_expert->down_proj, r, 7));
  }
  // Layer 1 was dense (width 40): its first 24 columns.
  const model::LayerWeights& d = m->weights.layers[1];
  EXPECT_EQ(At(t.layers[1].gate_proj, 23, 4), At(d.gate_proj, 23, 4));
  EXPECT_EQ(At(t.layers[1].down_proj, 5, 23), At(d.down_proj, 5, 23));
  ModelRunnerOptions ro;
  ro.num_pages = 4;
  ro.num_threads = 1;
  EXPECT_TRUE(ModelRunner::Create(t, ro).ok());

  m->weights.config.intermediate_size = 20;  // a dense layer under the active width: refused
  EXPECT_THAT(MakeDenseTwin(m->weights).status().ToString(),
              ::testing::HasSubstr("intermediate_size 20 is under the active width 24"));
}

// FP8: the experts' codes and block scales side by side (experts 128 wide, whole blocks), each
// value code * scale as in its expert; a width that is not whole blocks is refused.
TEST(MoeDenseTwinTest, Fp8ExpertsKeepTheirScaleBlocks) {
  testing::TinyModelOptions o;
  o.arch = model::Arch::kQwen3Moe;
  o.hidden = 40;
  o.intermediate = 400;
  o.layers = 2;
  auto m = testing::MakeTinyModel(o);
  model::MoeConfig moe;
  moe.num_experts = 4;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 128;
  moe.n_shared_experts = 1;
  moe.mlp_only_layers = {1};
  testing::AddMoeLayers(m.get(), moe, 5);
  m = testing::ToFp8(std::move(m));
  auto twin = MakeDenseTwin(m->weights);
  ASSERT_TRUE(twin.ok()) << twin.status().ToString();
  const model::ModelWeights& t = (*twin)->weights;
  EXPECT_TRUE(t.fp8);
  EXPECT_EQ(t.config.intermediate_size, 384);  // (2 + 1) * 128
  // W's value (r, c): code * the scale of its 128x128 block.
  auto value = [](const model::TensorView& v, int64_t r, int64_t c) {
    return v.At(r * v.shape[1] + c) * v.scale_inv[(r / 128) * ((v.shape[1] + 127) / 128) + c / 128];
  };
  const model::MoeWeights& mw = *m->weights.layers[0].moe;
  const model::LayerWeights& l0 = t.layers[0];
  ASSERT_EQ(l0.gate_proj.dtype, model::DType::kF8E4M3);
  for (int64_t c = 0; c < 40; ++c) {
    EXPECT_EQ(value(l0.gate_proj, 128 + 3, c), value(mw.experts[1].gate_proj, 3, c));
    EXPECT_EQ(value(l0.up_proj, 256 + 100, c), value(mw.shared_expert->up_proj, 100, c));
  }
  for (int64_t r = 0; r < 40; ++r) {
    EXPECT_EQ(value(l0.down_proj, r, 2), value(mw.experts[0].down_proj, r, 2));
    EXPECT_EQ(value(l0.down_proj, r, 256 + 127), value(mw.shared_expert->down_proj, r, 127));
  }
  const model::LayerWeights& d = m->weights.layers[1];  // dense, width 400: its first 384
  EXPECT_EQ(value(t.layers[1].gate_proj, 383, 4), value(d.gate_proj, 383, 4));
  EXPECT_EQ(value(t.layers[1].down_proj, 5, 383), value(d.down_proj, 5, 383));
  ModelRunnerOptions ro;
  ro.num_pages = 4;
  ro.num_threads = 1;
  EXPECT_TRUE(ModelRunner::Create(t, ro).ok());

  moe.moe_intermediate_size = 40;
  auto narrow = testing::MakeTinyModel(o);
  testing::AddMoeLayers(narrow.get(), moe, 5);
  narrow = testing::ToFp8(std::move(narrow));
  EXPECT_THAT(MakeDenseTwin(narrow->weights).status().ToString(),
              ::testing::HasSubstr("layer 0: FP8 width 40 is not a multiple of the 128-wide"));
}

}  // namespace
}  // namespace pd::engine
