#include "model/weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "common/file_util.h"
#include "model/test_util.h"

namespace pd::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::WriteRawSafetensors;

ModelConfig TinyConfig(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = arch == Arch::kQwen3 ? 8 : 4;
  c.max_position_embeddings = 128;
  c.attention_bias = arch == Arch::kQwen2;
  c.qk_norm = arch == Arch::kQwen3;
  c.tie_word_embeddings = arch == Arch::kQwen3;
  return c;
}

std::vector<NamedTensor> TensorsFor(const ModelConfig& c, DType dtype) {
  std::vector<NamedTensor> tensors;
  uint16_t counter = 0;
  for (const TensorSpec& spec : RequiredTensors(c)) {
    NamedTensor t{spec.name, dtype, spec.shape, {}};
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    t.bytes.resize(n * DTypeSize(dtype));
    for (auto& b : t.bytes) b = static_cast<uint8_t>(++counter % 61);  // finite in every dtype
    tensors.push_back(std::move(t));
  }
  return tensors;
}

// Writes config.json and the tensors (sharded when max_shard_bytes > 0).
void WriteModel(const std::string& dir, const ModelConfig& c,
                const std::vector<NamedTensor>& tensors, size_t max_shard_bytes = 0) {
  ASSERT_TRUE(WriteStringToFile(dir + "/config.json", ModelConfigToJson(c)).ok());
  if (max_shard_bytes == 0) {
    ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  } else {
    ASSERT_TRUE(WriteShardedSafetensors(dir, tensors, max_shard_bytes).ok());
  }
}

NamedTensor* Find(std::vector<NamedTensor>& tensors, const std::string& name) {
  for (auto& t : tensors) {
    if (t.name == name) return &t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return &tensors[0];
}

std::string LoadError(const std::string& dir) {
  auto w = LoadModelWeights(dir);
  EXPECT_FALSE(w.ok());
  return w.ok() ? "" : w.status().message();
}

TEST(RequiredTensorsTest, NamesAndShapesPerArch) {
  auto names = [](const ModelConfig& c) {
    std::set<std::string> s;
    for (const auto& spec : RequiredTensors(c)) s.insert(spec.name);
    return s;
  };
  ModelConfig llama = TinyConfig(Arch::kLlama);
  auto specs = RequiredTensors(llama);
  EXPECT_EQ(specs.size(), 1 + 2 * 9 + 1 + 1u);
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs.front().shape, (std::vector<int64_t>{50, 16}));
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  EXPECT_TRUE(names(llama).count("model.layers.1.mlp.down_proj.weight"));
  EXPECT_FALSE(names(llama).count("model.layers.0.self_attn.q_proj.bias"));
  llama.attention_bias = true;
  EXPECT_TRUE(names(llama).count("model.layers.0.self_attn.q_proj.bias"));

  auto qwen2 = names(TinyConfig(Arch::kQwen2));
  EXPECT_TRUE(qwen2.count("model.layers.1.self_attn.k_proj.bias"));
  EXPECT_FALSE(qwen2.count("model.layers.1.self_attn.k_norm.weight"));

  ModelConfig q3 = TinyConfig(Arch::kQwen3);
  for (const auto& spec : RequiredTensors(q3)) {
    if (spec.name == "model.layers.0.self_attn.q_norm.weight") {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{8}));
    }
    if (spec.name == "model.layers.0.self_attn.q_proj.weight") {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{32, 16}));  // q_size 32 != hidden 16
    }
    if (spec.name == "model.layers.0.self_attn.o_proj.weight") {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{16, 32}));
    }
  }
  EXPECT_FALSE(names(q3).count("lm_head.weight"));  // tied
  EXPECT_TRUE(names(q3).count("model.layers.1.self_attn.k_norm.weight"));
}

class LoadWeightsTest : public ::testing::TestWithParam<std::tuple<Arch, DType, bool>> {};

TEST_P(LoadWeightsTest, LoadsEveryTensor) {
  auto [arch, dtype, sharded] = GetParam();
  ScratchDir dir;
  ModelConfig c = TinyConfig(arch);
  auto tensors = TensorsFor(c, dtype);
  WriteModel(dir.path(), c, tensors, sharded ? 2000 : 0);
  auto w = LoadModelWeights(dir.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->dtype, dtype);
  EXPECT_EQ(w->config.num_layers, 2);
  ASSERT_EQ(w->layers.size(), 2u);
  EXPECT_EQ(w->embed_tokens.shape, (std::vector<int64_t>{50, 16}));
  EXPECT_EQ(w->embed_tokens.data, (*w->checkpoint->Get("model.embed_tokens.weight")).data);
  const LayerWeights& l1 = w->layers[1];
  EXPECT_EQ(l1.down_proj.data, (*w->checkpoint->Get("model.layers.1.mlp.down_proj.weight")).data);
  EXPECT_EQ(l1.q_proj.shape, (std::vector<int64_t>{c.q_size(), 16}));
  EXPECT_EQ(l1.q_bias.has_value(), arch == Arch::kQwen2);
  EXPECT_EQ(l1.k_norm.has_value(), arch == Arch::kQwen3);
  if (l1.k_norm) {
    EXPECT_EQ(l1.k_norm->data,
              (*w->checkpoint->Get("model.layers.1.self_attn.k_norm.weight")).data);
  }
  if (c.tie_word_embeddings) {
    EXPECT_EQ(w->lm_head.data, w->embed_tokens.data);
  } else {
    EXPECT_EQ(w->lm_head.data, (*w->checkpoint->Get("lm_head.weight")).data);
  }
  // Bytes come through unchanged.
  const NamedTensor* norm = Find(tensors, "model.norm.weight");
  EXPECT_EQ(std::memcmp(w->final_norm.data, norm->bytes.data(), norm->bytes.size()), 0);
  if (sharded) {
    EXPECT_NE(w->checkpoint->FileOf("model.norm.weight"), w->checkpoint->FileOf(tensors[0].name));
  }
}

INSTANTIATE_TEST_SUITE_P(
    ArchDTypeLayout, LoadWeightsTest,
    ::testing::Combine(::testing::Values(Arch::kLlama, Arch::kQwen2, Arch::kQwen3),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Bool()),
    [](const auto& info) {
      return std::string(ArchName(std::get<0>(info.param))) + "_" +
             std::string(DTypeName(std::get<1>(info.param))) +
             (std::get<2>(info.param) ? "_sharded" : "_single");
    });

// ---- Each kind of bad checkpoint gets its own clear error.

TEST(BadCheckpointTest, MissingTensor) {
  ScratchDir dir;
  ModelConfig c = TinyConfig(Arch::kQwen3);
  auto tensors = TensorsFor(c, DType::kBF16);
  std::erase_if(tensors, [](const NamedTensor& t) {
    return t.name == "model.layers.1.self_attn.q_norm.weight";
  });
  WriteModel(dir.path(), c, tensors);
  EXPECT_EQ(LoadError(dir.path()),
            "model.safetensors: tensor model.layers.1.self_attn.q_norm.weight (expected shape "
            "[8]) not found");
}

TEST(BadCheckpointTest, MissingLmHeadWhenUntied) {
  ScratchDir dir;
  ModelConfig c = TinyConfig(Arch::kLlama);
  auto tensors = TensorsFor(c, DType::kF32);
  tensors.pop_back();  // lm_head.weight
  WriteModel(dir.path(), c, tensors);
  EXPECT_THAT(LoadError(dir.path()),
              HasSubstr("tensor lm_head.weight (expected shape [50, 16]) not found"));
}

TEST(BadCheckpointTest, MissingBiasInShardedQwen2) {
  ScratchDir dir;
  ModelConfig c = TinyConfig(Arch::kQwen2);
  auto tensors = TensorsFor(c, DType::kF16);
  std::erase_if(tensors, [](const NamedTensor& t) {
    return t.name == "model.layers.0.self_attn.v_proj.bias";
  });
  WriteModel(dir.path(), c, tensors, 1500);
  EXPECT_EQ(LoadError(dir.path()),
            "model.safetensors.index.json: tensor model.layers.0.self_attn.v_proj.bias "
            "(expected shape [8]) not found");
}

TEST(BadCheckpointTest, WrongShape) {
  ScratchDir dir;
  ModelConfig c = TinyConfig(Arch::kLlama);
  auto tensors = TensorsFor(c, DType::kBF16);
  NamedTensor* up = Find(tensors, "model.layers.1.mlp.up_proj.weight");
  up->shape = {24, 15};
  up->bytes.resize(24 * 15 * 2);
  WriteModel(dir.path(), c, tensors);
  EXPECT_EQ(LoadError(dir.path()),
            "model.safetensors: model.layers.1.mlp.up_proj.weight: expected shape [24, 16], "
            "found [24, 15]");
}

TEST(BadCheckpointTest, WrongShapeInShardNamesTheShard) {
  ScratchDir dir;
  ModelConfig c = TinyConfig(Arch::kQwen3);
  auto tensors = TensorsFor(c, DType::kF32);
  NamedTensor* kn = Find(tensors, "model.layers.1.self_attn.k_norm.weight");
  kn->shape = {4};  // per-head norm written with hidden/heads instead of head_dim
  kn->bytes.resize(16);
  WriteModel(dir.path(), c, tensors, 3000);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  std::string shard = (*ckpt)->FileOf(kn->name);
  EXPECT_THAT(shard, HasSubstr("model-0000"));
  EXPECT_EQ(LoadError(dir.path()), shard +
                                       ": model.layers.1.self_attn.k_norm.weight: expected "
                                       "shape [8], found [4]");
}

TEST(BadCheckpointTest, MixedDTypes) {
  ScratchDir dir;
  ModelConfig c = TinyConfig(Arch::kQwen2);
  auto tensors = TensorsFor(c, DType::kBF16);
  NamedTensor* o = Find(tensors, "model.layers.0.self_attn.o_proj.weight");
  o->dtype = DType::kF32;
  o->bytes.resize(o->bytes.size() * 2);
  WriteModel(dir.path(), c, tensors);
  EXPECT_EQ(LoadError(dir.path()),
            "model.safetensors: model.layers.0.self_attn.o_proj.weight: expected dtype BF16 (the "
            "dtype of model.embed_tokens.weight), found F32");
}

TEST(BadCheckpointTest, IntegerTensor) {
  ScratchDir dir;
  ModelConfig c = TinyConfig(Arch::kLlama);
  ASSERT_TRUE(WriteStringToFile(dir / "config.json", ModelConfigToJson(c)).ok());
  WriteRawSafetensors(dir / "model.safetensors",
                      R"({"model.embed_tokens.weight": {"dtype": "I32", "shape": [50, 16],)"
                      R"( "data_offsets": [0, 3200]}})",
                      std::string(3200, '\0'));
  EXPECT_THAT(LoadError(dir.path()),
              AllOf(HasSubstr(dir / "model.safetensors"), HasSubstr("model.embed_tokens.weight"),
                    HasSubstr("unsupported dtype \"I32\" (supported: F32, BF16, F16, F8_E4M3)")));
}

TEST(BadCheckpointTest, TruncatedFile) {
  ScratchDir dir;
  ModelConfig c = TinyConfig(Arch::kQwen3);
  WriteModel(dir.path(), c, TensorsFor(c, DType::kBF16));
  auto path = dir / "model.safetensors";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  EXPECT_THAT(LoadError(dir.path()),
              AllOf(HasSubstr(path), HasSubstr("beyond the data section"), HasSubstr("truncated")));
}

TEST(BadCheckpointTest, IndexNamesMissingShard) {
  ScratchDir dir;
  ModelConfig c = TinyConfig(Arch::kLlama);
  WriteModel(dir.path(), c, TensorsFor(c, DType::kF32), 4000);
  std::string shard = (*Checkpoint::Open(dir.path()))->FileOf("model.layers.1.mlp.up_proj.weight");
  ASSERT_THAT(shard, HasSubstr("model-0000"));
  std::filesystem::remove(dir / shard);
  EXPECT_THAT(LoadError(dir.path()),
              AllOf(HasSubstr(dir / "model.safetensors.index.json"),
                    HasSubstr("names shard " + shard), HasSubstr("does not exist")));
}

TEST(BadCheckpointTest, MissingConfig) {
  ScratchDir dir;
  EXPECT_THAT(LoadError(dir.path()), HasSubstr(dir / "config.json"));
}

TEST(BadCheckpointTest, ConfigDisagreesWithCheckpoint) {
  ScratchDir dir;
  ModelConfig c = TinyConfig(Arch::kQwen2);
  auto tensors = TensorsFor(c, DType::kF32);
  c.num_kv_heads = 4;  // config says MHA, the weights are GQA
  WriteModel(dir.path(), c, tensors);
  EXPECT_EQ(LoadError(dir.path()),
            "model.safetensors: model.layers.0.self_attn.k_proj.weight: expected shape [16, 16], "
            "found [8, 16]");
}

}  // namespace
}  // namespace pd::model
