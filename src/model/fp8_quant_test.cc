// FP8 (e4m3fn, 128x128 block scales) in the model layer: the scalar conversions, block
// quantisation, quantization_config, loading and validating FP8 checkpoints, and `quantize`.
#include "model/fp8_quant.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/file_util.h"
#include "model/config.h"
#include "model/dtype.h"
#include "model/model_writer.h"
#include "model/safetensors.h"
#include "model/test_util.h"
#include "model/weights.h"

namespace pd::model {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

TEST(Fp8DTypeTest, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = Fp8E4m3ToF32(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(F32ToFp8E4m3(v), c) << c << " = " << v;
  }
  EXPECT_EQ(Fp8E4m3ToF32(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4m3ToF32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(Fp8E4m3ToF32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(Fp8E4m3ToF32(0xb8), -1.0f);
}

TEST(Fp8DTypeTest, RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(Fp8E4m3ToF32(F32ToFp8E4m3(1.0625f)), 1.0f);   // tie between 1 and 1.125: even
  EXPECT_EQ(Fp8E4m3ToF32(F32ToFp8E4m3(1.1875f)), 1.25f);  // tie between 1.125 and 1.25: even
  EXPECT_EQ(Fp8E4m3ToF32(F32ToFp8E4m3(1.07f)), 1.125f);
  EXPECT_EQ(Fp8E4m3ToF32(F32ToFp8E4m3(std::ldexp(1.0f, -10))), 0.0f);  // half the subnormal: 0
  EXPECT_EQ(Fp8E4m3ToF32(F32ToFp8E4m3(std::ldexp(3.0f, -10))), std::ldexp(1.0f, -8));
  EXPECT_EQ(Fp8E4m3ToF32(F32ToFp8E4m3(15.9f)), 16.0f);  // carries into the next binade
  EXPECT_EQ(F32ToFp8E4m3(1e6f), 0x7e);
  EXPECT_EQ(F32ToFp8E4m3(-460.0f), 0xfe);
  EXPECT_EQ(F32ToFp8E4m3(NAN), 0x7f);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(*ParseSafetensorsDType("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(*ParseDTypeFlag("fp8"), DType::kF8E4M3);
}

TEST(Fp8QuantTest, BlocksScaleTheirAmaxTo448AndEdgeBlocksArePartial) {
  const int64_t n = 130, k = 200;  // blocks of 128x128, 128x72, 2x128, 2x72
  std::vector<float> w(n * k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      w[r * k + c] = std::sin(static_cast<float>(r * k + c)) * (r >= 128 ? 100.0f : 0.5f);
  for (int64_t c = 128; c < k; ++c) w[5 * k + c] = 0;  // block (0, 1) all zero but one row
  std::vector<uint8_t> q(n * k);
  std::vector<float> s(4);
  QuantizeFp8Blocks(w.data(), n, k, q.data(), s.data());
  for (int64_t b = 0; b < 4; ++b) {
    const int64_t r0 = b / 2 * 128, r1 = std::min<int64_t>(n, r0 + 128);
    const int64_t c0 = b % 2 * 128, c1 = std::min<int64_t>(k, c0 + 128);
    float amax = 0, max_code = 0;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        amax = std::max(amax, std::fabs(w[r * k + c]));
        const float deq = Fp8E4m3ToF32(q[r * k + c]) * s[b];
        max_code = std::max(max_code, std::fabs(Fp8E4m3ToF32(q[r * k + c])));
        // e4m3 keeps 3 mantissa bits: relative error <= 2^-4, or the subnormal step.
        EXPECT_LE(std::fabs(deq - w[r * k + c]),
                  std::max(std::fabs(w[r * k + c]) / 16, std::ldexp(s[b], -10)) * 1.0001f);
      }
    EXPECT_FLOAT_EQ(s[b], amax / 448.0f) << b;
    EXPECT_EQ(max_code, 448.0f) << b;
  }
  std::vector<float> zero(3 * 3, 0.0f), one(1);
  std::vector<uint8_t> zq(9, 0xff);
  QuantizeFp8Blocks(zero.data(), 3, 3, zq.data(), one.data());
  EXPECT_EQ(one[0], 1.0f);
  for (uint8_t c : zq) EXPECT_EQ(c, 0);
}

TEST(Fp8ConfigTest, QuantizationConfigIsReadWrittenAndOtherMethodsRefused) {
  auto base = PresetConfig(Arch::kQwen3, "tiny");
  ASSERT_TRUE(base.ok());
  ModelConfig c = *base;
  c.fp8.enabled = true;
  const std::string text = ModelConfigToJson(c);
  auto back = ParseModelConfig(text, "config.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->fp8.enabled);
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["quantization_config"]["quant_method"], "fp8");
  EXPECT_EQ(j["quantization_config"]["weight_block_size"], nlohmann::json({128, 128}));
  for (const char* bad : {R"({"quant_method": "gptq", "bits": 4})",
                          R"({"quant_method": "fp8", "weight_block_size": [128, 128],
                              "activation_scheme": "static"})",
                          R"({"quant_method": "fp8", "weight_block_size": [128, 128],
                              "fmt": "e5m2"})",
                          R"({"quant_method": "fp8"})"}) {
    j["quantization_config"] = nlohmann::json::parse(bad);
    auto r = ParseModelConfig(j.dump(), "config.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("config.json: quantization_config")) << bad;
  }
}

// A tiny FP8 model written by make-model's writer.
void WriteFp8(Arch arch, const std::string& dir) {
  SyntheticModelOptions o;
  o.arch = arch;
  o.dtype = DType::kF8E4M3;
  o.out_dir = dir;
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
}

TEST(Fp8WeightsTest, AnFp8CheckpointLoadsWithScalesAndBf16Rest) {
  for (Arch arch : {Arch::kLlama, Arch::kQwen3Moe, Arch::kDeepseekV3}) {
    ScratchDir dir;
    WriteFp8(arch, dir.path());
    auto w = LoadModelWeights(dir.path());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_TRUE(w->fp8);
    EXPECT_TRUE(w->config.fp8.enabled);
    EXPECT_EQ(w->dtype, DType::kBF16);
    EXPECT_EQ(w->embed_tokens.dtype, DType::kBF16);
    EXPECT_EQ(w->lm_head.dtype, DType::kBF16);
    const LayerWeights& last = w->layers.back();
    const TensorView& o = last.mla ? last.mla->o_proj : last.o_proj;
    EXPECT_EQ(o.dtype, DType::kF8E4M3);
    EXPECT_NE(o.scale_inv, nullptr);
    EXPECT_EQ(last.input_norm.dtype, DType::kBF16);
    if (last.moe) {
      EXPECT_EQ(last.moe->router.dtype, DType::kBF16);
      EXPECT_EQ(last.moe->experts[0].down_proj.dtype, DType::kF8E4M3);
    }
  }
}

// The checkpoint of dir rewritten by edit(tensors).
void Rewrite(const std::string& dir, const std::function<void(std::vector<NamedTensor>*)>& edit) {
  std::vector<NamedTensor> tensors;
  {
    auto ckpt = Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok());
    for (const std::string& name : (*ckpt)->Names()) {
      TensorView v = *(*ckpt)->Get(name);
      const auto* p = static_cast<const uint8_t*>(v.data);
      tensors.push_back({name, v.dtype, v.shape, std::vector<uint8_t>(p, p + v.size_bytes())});
    }
  }
  edit(&tensors);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
}

TEST(Fp8WeightsTest, AMissingOrMisShapedScaleNamesTheTensor) {
  const std::string weight = "model.layers.1.mlp.down_proj.weight";
  ScratchDir missing, shaped, wrong_dtype, no_config;
  for (const ScratchDir* d : {&missing, &shaped, &wrong_dtype, &no_config})
    WriteFp8(Arch::kLlama, d->path());
  Rewrite(missing.path(), [&](std::vector<NamedTensor>* t) {
    std::erase_if(*t, [&](const NamedTensor& x) { return x.name == weight + "_scale_inv"; });
  });
  Rewrite(shaped.path(), [&](std::vector<NamedTensor>* t) {
    for (NamedTensor& x : *t)
      if (x.name == weight + "_scale_inv") {
        x.shape = {1, 1};
        x.bytes.resize(4);
      }
  });
  Rewrite(wrong_dtype.path(), [&](std::vector<NamedTensor>* t) {
    for (NamedTensor& x : *t)
      if (x.name == weight + "_scale_inv") {
        x.dtype = DType::kBF16;
        x.bytes.resize(x.bytes.size() / 2);
      }
  });
  for (const ScratchDir* d : {&missing, &shaped, &wrong_dtype}) {
    auto w = LoadModelWeights(d->path());
    ASSERT_FALSE(w.ok());
    EXPECT_THAT(w.status().message(), HasSubstr(weight)) << w.status().ToString();
    EXPECT_THAT(w.status().message(), HasSubstr("_scale_inv")) << w.status().ToString();
  }
  // F8_E4M3 weights without quantization_config in config.json: refused, naming the tensor.
  nlohmann::json cfg = nlohmann::json::parse(*ReadFileToString(no_config / "config.json"));
  cfg.erase("quantization_config");
  ASSERT_TRUE(WriteStringToFile(no_config / "config.json", cfg.dump()).ok());
  auto w = LoadModelWeights(no_config.path());
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("F8_E4M3"));
  EXPECT_THAT(w.status().message(), HasSubstr("quantization_config"));
}

TEST(Fp8QuantizeTest, ABf16CheckpointConvertsReloadsAndKeepsItsValues) {
  ScratchDir in, out;
  SyntheticModelOptions o;
  o.arch = Arch::kQwen3Moe;
  o.dtype = DType::kBF16;
  o.out_dir = in.path();
  ASSERT_TRUE(WriteSyntheticModel(o).ok());
  QuantizeOptions q;
  q.model_dir = in.path();
  q.out_dir = out.path();
  ASSERT_TRUE(QuantizeCheckpoint(q).ok());
  EXPECT_TRUE(std::filesystem::exists(out / "tokenizer.json"));
  EXPECT_TRUE(std::filesystem::exists(out / "generation_config.json"));
  auto src = LoadModelWeights(in.path());
  auto fp8 = LoadModelWeights(out.path());
  ASSERT_TRUE(src.ok() && fp8.ok()) << fp8.status().ToString();
  EXPECT_TRUE(fp8->fp8);
  EXPECT_EQ(fp8->config.torch_dtype, "bfloat16");
  size_t moe_layer = 0;  // the first MoE layer (the preset has dense ones too)
  while (moe_layer < src->layers.size() && !src->layers[moe_layer].moe) ++moe_layer;
  ASSERT_LT(moe_layer, src->layers.size());
  ASSERT_TRUE(fp8->layers[moe_layer].moe.has_value());
  const TensorView& a = src->layers[moe_layer].moe->experts[3].gate_proj;
  const TensorView& b = fp8->layers[moe_layer].moe->experts[3].gate_proj;
  ASSERT_EQ(b.dtype, DType::kF8E4M3);
  const int64_t k = a.shape[1], kb = (k + 127) / 128;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float want = a.At(i);
    const float got = b.At(i) * b.scale_inv[(i / k / 128) * kb + (i % k) / 128];
    ASSERT_LE(std::fabs(got - want), std::fabs(want) / 16 + 1e-3f) << i;
  }
  // Router and embeddings are copied as they were.
  EXPECT_EQ(fp8->layers[moe_layer].moe->router.dtype, DType::kBF16);
  EXPECT_EQ(fp8->embed_tokens.At(77), src->embed_tokens.At(77));
  // An FP8 checkpoint is not quantised again.
  ScratchDir again;
  q.model_dir = out.path();
  q.out_dir = again.path();
  Status s = QuantizeCheckpoint(q);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("quantization_config"));
}

}  // namespace
}  // namespace pd::model
