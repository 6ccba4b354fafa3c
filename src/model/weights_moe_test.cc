// qwen3_moe and deepseek_v3 checkpoints: the tensors they require, loading, and the errors for
// missing, misshapen or mistyped expert, MLA and MTP tensors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "common/file_util.h"
#include "model/model_writer.h"
#include "model/test_util.h"
#include "model/weights.h"

namespace pd::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ScratchDir;

ModelConfig Preset(Arch arch) {
  auto c = PresetConfig(arch, "tiny");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

std::map<std::string, std::vector<int64_t>> Shapes(const std::vector<TensorSpec>& specs) {
  std::map<std::string, std::vector<int64_t>> m;
  for (const TensorSpec& t : specs) EXPECT_TRUE(m.emplace(t.name, t.shape).second) << t.name;
  return m;
}

using Shape = std::vector<int64_t>;

TEST(MoeRequiredTensorsTest, Qwen3Moe) {
  ModelConfig c = Preset(Arch::kQwen3Moe);  // 3 layers, layer 1 dense (mlp_only_layers)
  auto s = Shapes(RequiredTensors(c));
  EXPECT_EQ(s.at("model.layers.0.mlp.gate.weight"), (Shape{8, 64}));
  EXPECT_EQ(s.at("model.layers.0.mlp.experts.7.gate_proj.weight"), (Shape{40, 64}));
  EXPECT_EQ(s.at("model.layers.2.mlp.experts.0.down_proj.weight"), (Shape{64, 40}));
  EXPECT_EQ(s.at("model.layers.1.mlp.up_proj.weight"), (Shape{160, 64}));
  EXPECT_EQ(s.at("model.layers.0.self_attn.q_norm.weight"), (Shape{32}));
  EXPECT_EQ(s.at("model.layers.0.self_attn.q_proj.weight"), (Shape{128, 64}));
  EXPECT_FALSE(s.count("model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(s.count("model.layers.1.mlp.gate.weight"));
  EXPECT_FALSE(s.count("model.layers.0.mlp.gate.e_score_correction_bias"));
  EXPECT_FALSE(s.count("model.layers.0.mlp.shared_experts.up_proj.weight"));
  // embed + norm + lm_head; per MoE layer 2 norms + 6 attention (q/k/v/o, q/k norms) + router +
  // 8 x 3 experts; the dense layer 2 norms + 6 attention + 3 MLP.
  EXPECT_EQ(s.size(), 3u + 2 * (8 + 1 + 24) + (8 + 3));
  EXPECT_TRUE(MtpTensors(c).empty());
}

TEST(MoeRequiredTensorsTest, DeepseekV3) {
  ModelConfig c = Preset(Arch::kDeepseekV3);  // 3 layers, layer 0 dense; 4 heads
  auto s = Shapes(RequiredTensors(c));
  const std::string a = "model.layers.1.self_attn.";
  EXPECT_EQ(s.at(a + "q_a_proj.weight"), (Shape{40, 64}));
  EXPECT_EQ(s.at(a + "q_a_layernorm.weight"), (Shape{40}));
  EXPECT_EQ(s.at(a + "q_b_proj.weight"), (Shape{4 * (16 + 8), 40}));
  EXPECT_EQ(s.at(a + "kv_a_proj_with_mqa.weight"), (Shape{28 + 8, 64}));
  EXPECT_EQ(s.at(a + "kv_a_layernorm.weight"), (Shape{28}));
  EXPECT_EQ(s.at(a + "kv_b_proj.weight"), (Shape{4 * (16 + 16), 28}));
  EXPECT_EQ(s.at(a + "o_proj.weight"), (Shape{64, 4 * 16}));
  EXPECT_FALSE(s.count(a + "q_proj.weight"));
  EXPECT_FALSE(s.count(a + "k_proj.weight"));
  EXPECT_EQ(s.at("model.layers.0.mlp.gate_proj.weight"), (Shape{160, 64}));
  EXPECT_FALSE(s.count("model.layers.0.mlp.gate.weight"));
  EXPECT_EQ(s.at("model.layers.1.mlp.gate.weight"), (Shape{8, 64}));
  EXPECT_EQ(s.at("model.layers.1.mlp.gate.e_score_correction_bias"), (Shape{8}));
  EXPECT_EQ(s.at("model.layers.2.mlp.experts.7.up_proj.weight"), (Shape{40, 64}));
  EXPECT_EQ(s.at("model.layers.2.mlp.shared_experts.down_proj.weight"), (Shape{64, 40}));
  EXPECT_FALSE(s.count("model.layers.3.enorm.weight"));  // MTP tensors are apart

  c.mla.q_lora_rank = 0;
  c.moe.n_shared_experts = 2;
  s = Shapes(RequiredTensors(c));
  EXPECT_EQ(s.at(a + "q_proj.weight"), (Shape{4 * 24, 64}));
  EXPECT_FALSE(s.count(a + "q_a_proj.weight"));
  EXPECT_FALSE(s.count(a + "q_b_proj.weight"));
  EXPECT_EQ(s.at("model.layers.2.mlp.shared_experts.gate_proj.weight"), (Shape{80, 64}));

  auto mtp = Shapes(MtpTensors(c));
  const std::string p = "model.layers.3.";
  EXPECT_EQ(mtp.at(p + "embed_tokens.weight"), (Shape{512, 64}));
  EXPECT_EQ(mtp.at(p + "enorm.weight"), (Shape{64}));
  EXPECT_EQ(mtp.at(p + "hnorm.weight"), (Shape{64}));
  EXPECT_EQ(mtp.at(p + "eh_proj.weight"), (Shape{64, 128}));
  EXPECT_EQ(mtp.at(p + "shared_head.norm.weight"), (Shape{64}));
  EXPECT_EQ(mtp.at(p + "shared_head.head.weight"), (Shape{512, 64}));
  EXPECT_EQ(mtp.at(p + "self_attn.kv_b_proj.weight"), (Shape{4 * 32, 28}));
  EXPECT_EQ(mtp.at(p + "mlp.experts.3.gate_proj.weight"), (Shape{40, 64}));
  EXPECT_TRUE(mtp.count(p + "mlp.gate.e_score_correction_bias"));
  c.num_nextn_predict_layers = 2;
  EXPECT_TRUE(Shapes(MtpTensors(c)).count("model.layers.4.shared_head.head.weight"));
}

class LoadMoeModelTest : public ::testing::TestWithParam<std::tuple<Arch, DType>> {};

TEST_P(LoadMoeModelTest, LoadsAWrittenModel) {
  auto [arch, dtype] = GetParam();
  ScratchDir dir;
  SyntheticModelOptions o;
  o.arch = arch;
  o.dtype = dtype;
  o.out_dir = dir.path();
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  auto w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const ModelConfig& c = w->config;
  EXPECT_EQ(w->dtype, dtype);
  ASSERT_EQ(w->layers.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const LayerWeights& l = w->layers[i];
    EXPECT_EQ(l.moe.has_value(), c.IsMoeLayer(i)) << i;
    EXPECT_EQ(l.gate_proj.data != nullptr, !c.IsMoeLayer(i)) << i;
    EXPECT_EQ(l.mla.has_value(), arch == Arch::kDeepseekV3);
    EXPECT_EQ(l.q_proj.data != nullptr, arch != Arch::kDeepseekV3);
    if (!l.moe) continue;
    EXPECT_EQ(l.moe->experts.size(), 8u);
    EXPECT_EQ(l.moe->experts[7].down_proj.shape, (Shape{64, 40}));
    EXPECT_EQ(l.moe->router.shape, (Shape{8, 64}));
    EXPECT_EQ(l.moe->shared_expert.has_value(), arch == Arch::kDeepseekV3);
    ASSERT_EQ(l.moe->router_bias.has_value(), arch == Arch::kDeepseekV3);
    if (l.moe->router_bias) {
      EXPECT_EQ(l.moe->router_bias->dtype, DType::kF32);  // as DeepSeek-V3's checkpoints
      for (int64_t e = 0; e < 8; ++e) EXPECT_GT(l.moe->router_bias->At(e), 0.0f);
    }
  }
  if (arch == Arch::kDeepseekV3) {
    EXPECT_EQ(w->layers[0].mla->q_a_proj->shape, (Shape{40, 64}));
    EXPECT_FALSE(w->layers[0].mla->q_proj.has_value());
    ASSERT_EQ(w->mtp.size(), 1u);
    EXPECT_EQ(w->mtp[0].eh_proj.shape, (Shape{64, 128}));
    ASSERT_TRUE(w->mtp[0].layer.moe.has_value());
    ASSERT_TRUE(w->mtp[0].layer.mla.has_value());
    EXPECT_EQ(w->mtp[0].shared_head_head.dtype, dtype);
  } else {
    EXPECT_TRUE(w->mtp.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(ArchDType, LoadMoeModelTest,
                         ::testing::Combine(::testing::Values(Arch::kQwen3Moe, Arch::kDeepseekV3),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return std::string(ArchName(std::get<0>(info.param))) + "_" +
                                  std::string(DTypeName(std::get<1>(info.param)));
                         });

// Tensors for every spec (MTP included when `with_mtp`), in `dtype` with small finite values.
std::vector<NamedTensor> TensorsFor(const ModelConfig& c, DType dtype, bool with_mtp) {
  std::vector<TensorSpec> specs = RequiredTensors(c);
  if (with_mtp) {
    for (TensorSpec& t : MtpTensors(c)) specs.push_back(std::move(t));
  }
  std::vector<NamedTensor> tensors;
  for (TensorSpec& spec : specs) {
    NamedTensor t{std::move(spec.name), dtype, std::move(spec.shape), {}};
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    t.bytes.assign(n * DTypeSize(dtype), 0x3c);
    tensors.push_back(std::move(t));
  }
  return tensors;
}

void Retype(std::vector<NamedTensor>* tensors, const std::string& name, DType dtype) {
  auto it = std::find_if(tensors->begin(), tensors->end(),
                         [&](const NamedTensor& t) { return t.name == name; });
  ASSERT_NE(it, tensors->end()) << name;
  it->bytes.assign(it->bytes.size() / DTypeSize(it->dtype) * DTypeSize(dtype), 0x3c);
  it->dtype = dtype;
}

void Drop(std::vector<NamedTensor>* tensors, const std::string& name) {
  auto it = std::find_if(tensors->begin(), tensors->end(),
                         [&](const NamedTensor& t) { return t.name == name; });
  ASSERT_NE(it, tensors->end()) << name;
  tensors->erase(it);
}

// Writes config.json and model.safetensors; returns LoadModelWeights' error ("" when it loads).
std::string LoadError(const ScratchDir& dir, const ModelConfig& c,
                      const std::vector<NamedTensor>& tensors) {
  EXPECT_TRUE(WriteStringToFile(dir / "config.json", ModelConfigToJson(c)).ok());
  EXPECT_TRUE(WriteSafetensors(dir / "model.safetensors", tensors).ok());
  auto w = LoadModelWeights(dir.path());
  return w.ok() ? "" : w.status().message();
}

TEST(BadMoeCheckpointTest, MissingExpertTensorIsNamed) {
  for (Arch arch : {Arch::kQwen3Moe, Arch::kDeepseekV3}) {
    ScratchDir dir;
    ModelConfig c = Preset(arch);
    auto tensors = TensorsFor(c, DType::kBF16, /*with_mtp=*/true);
    Drop(&tensors, "model.layers.2.mlp.experts.5.up_proj.weight");
    EXPECT_THAT(LoadError(dir, c, tensors),
                AllOf(HasSubstr("model.safetensors"),
                      HasSubstr("model.layers.2.mlp.experts.5.up_proj.weight (expected shape "
                                "[40, 64]) not found")));
  }
}

TEST(BadMoeCheckpointTest, MisshapenMlaTensorIsNamed) {
  ScratchDir dir;
  ModelConfig c = Preset(Arch::kDeepseekV3);
  auto tensors = TensorsFor(c, DType::kBF16, false);
  for (NamedTensor& t : tensors) {
    if (t.name == "model.layers.1.self_attn.kv_b_proj.weight") {
      t.shape = {128, 14}, t.bytes.resize(128 * 14 * 2);
    }
  }
  EXPECT_EQ(LoadError(dir, c, tensors),
            "model.safetensors: model.layers.1.self_attn.kv_b_proj.weight: expected shape "
            "[128, 28], found [128, 14]");
}

TEST(BadMoeCheckpointTest, RouterBiasMayHaveAnyFloatDType) {
  for (DType bias : {DType::kF32, DType::kBF16, DType::kF16}) {
    ScratchDir dir;
    ModelConfig c = Preset(Arch::kDeepseekV3);
    auto tensors = TensorsFor(c, DType::kBF16, true);
    for (int layer : {1, 2, 3}) {
      Retype(&tensors,
             "model.layers." + std::to_string(layer) + ".mlp.gate.e_score_correction_bias", bias);
    }
    EXPECT_EQ(LoadError(dir, c, tensors), "") << DTypeName(bias);
  }
}

TEST(BadMoeCheckpointTest, MixedDTypeElsewhereIsRefused) {
  for (const char* name :
       {"model.layers.2.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.gate.weight",
        "model.layers.1.self_attn.kv_a_layernorm.weight", "model.layers.3.eh_proj.weight"}) {
    ScratchDir dir;
    ModelConfig c = Preset(Arch::kDeepseekV3);
    auto tensors = TensorsFor(c, DType::kBF16, true);
    Retype(&tensors, name, DType::kF32);
    EXPECT_EQ(LoadError(dir, c, tensors), "model.safetensors: " + std::string(name) +
                                              ": expected dtype BF16 (the dtype of "
                                              "model.embed_tokens.weight), found F32");
  }
}

TEST(BadMoeCheckpointTest, NoMtpLayerLoads) {
  ScratchDir dir;
  ModelConfig c = Preset(Arch::kDeepseekV3);
  ASSERT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(LoadError(dir, c, TensorsFor(c, DType::kBF16, /*with_mtp=*/false)), "");
  auto w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->mtp.empty());
  EXPECT_EQ(w->layers.size(), 3u);
}

TEST(BadMoeCheckpointTest, PartialMtpLayerIsRefused) {
  for (const char* name :
       {"model.layers.3.hnorm.weight", "model.layers.3.mlp.experts.6.gate_proj.weight",
        "model.layers.3.shared_head.head.weight"}) {
    ScratchDir dir;
    ModelConfig c = Preset(Arch::kDeepseekV3);
    auto tensors = TensorsFor(c, DType::kBF16, true);
    Drop(&tensors, name);
    EXPECT_THAT(LoadError(dir, c, tensors),
                AllOf(HasSubstr(std::string(name) + " (expected shape"), HasSubstr("not found"),
                      HasSubstr("multi-token-prediction tensors, e.g. "
                                "model.layers.3.embed_tokens.weight")))
        << name;
  }
  // The first MTP tensor missing: the others still show the layer is there.
  ScratchDir dir;
  ModelConfig c = Preset(Arch::kDeepseekV3);
  auto tensors = TensorsFor(c, DType::kBF16, true);
  Drop(&tensors, "model.layers.3.embed_tokens.weight");
  EXPECT_THAT(LoadError(dir, c, tensors),
              AllOf(HasSubstr("model.layers.3.embed_tokens.weight (expected shape [512, 64]) not "
                              "found"),
                    HasSubstr("e.g. model.layers.3.enorm.weight")));
}

}  // namespace
}  // namespace pd::model
