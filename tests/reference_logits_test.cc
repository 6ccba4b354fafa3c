// The engine's prefill and decode logits against an independent float64 NumPy implementation
// (tests/reference/ref_model.py) reading the very same safetensors.
//
// For every arch x checkpoint dtype (one TEST_P instance each, and per KV layout), a "tiny"
// synthetic model is written once; ref_model.py runs once on it and returns the logits of every
// position of three sequences (prompts of 1, 7 and 20 random token ids, each followed by 4 fixed
// decode tokens). The engine then runs, for every page size {1, 3, 16} x prefill chunk {whole
// prompt, 5 tokens}, all three sequences in the same batches (prefill chunks of one sequence mixed
// with decode tokens of another), with scattered, non-contiguous page tables, and every logits row
// it produces (each chunk's last token, each decode step) is compared with the reference row.
//
// The metric and the runner driver are in reference_logits_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model_runner.h"
#include "model/config.h"
#include "model/model_writer.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tests/reference_logits_util.h"

namespace pd {
namespace {

namespace fs = std::filesystem;
using engine::KernelKind;
using engine::KvDType;
using engine::KvLayout;
using model::Arch;
using model::DType;
using namespace reflogits;  // NOLINT(build/namespaces): the shared test helpers

// ---------------------------------------------------------------------------------------------
// One synthetic model, its weights and its reference logits, built once per process.

struct ModelKey {
  Arch arch;
  DType dtype;
  size_t max_shard_bytes = 0;
  bool attention_bias = false;  // rewrite the checkpoint with HF attention_bias (llama, qwen3)
  auto operator<=>(const ModelKey&) const = default;
};

struct ModelFixture {
  TempDir dir;
  model::ModelWeights weights;
  Workload workload;
  RefRows ref;
};

// Makes a written llama/qwen3 checkpoint one with `attention_bias: true`, as HF defines it
// there: a bias on q_proj, k_proj, v_proj AND o_proj (qwen2's q/k/v biases have no o_proj bias).
// The synthetic writer has no such option, so the biases are added here.
Status AddAttentionBiases(const std::string& dir) {
  ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(dir));
  if (config.arch == Arch::kQwen2) return InvalidArgument("qwen2 has its biases already");
  config.attention_bias = true;
  std::vector<model::NamedTensor> tensors;
  {
    ASSIGN_OR_RETURN(auto checkpoint, model::Checkpoint::Open(dir));
    for (const std::string& name : checkpoint->Names()) {
      ASSIGN_OR_RETURN(model::TensorView v, checkpoint->Get(name));
      const auto* p = static_cast<const uint8_t*>(v.data);
      tensors.push_back({name, v.dtype, v.shape, std::vector<uint8_t>(p, p + v.size_bytes())});
      if (v.dtype != DType::kF32) return InvalidArgument("expected an f32 checkpoint");
    }
  }  // unmapped before the file is rewritten
  std::mt19937 rng(5);
  auto add_bias = [&](const std::string& name, int64_t n) {
    std::vector<float> b(n);
    for (float& x : b) x = (static_cast<float>(rng() % 2001) / 1000.0f - 1.0f) * 0.5f;
    std::vector<uint8_t> bytes(n * sizeof(float));
    std::memcpy(bytes.data(), b.data(), bytes.size());
    tensors.push_back({name, DType::kF32, {n}, std::move(bytes)});
  };
  for (int l = 0; l < config.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    add_bias(p + "q_proj.bias", config.q_size());
    add_bias(p + "k_proj.bias", config.kv_size());
    add_bias(p + "v_proj.bias", config.kv_size());
    add_bias(p + "o_proj.bias", config.hidden_size);
  }
  std::ofstream(dir + "/config.json") << model::ModelConfigToJson(config);
  return model::WriteSafetensors(dir + "/model.safetensors", tensors);
}

Result<std::shared_ptr<ModelFixture>> BuildFixture(const ModelKey& key) {
  auto fx = std::make_shared<ModelFixture>();
  model::SyntheticModelOptions opts;
  opts.arch = key.arch;
  opts.preset = "tiny";
  opts.dtype = key.dtype;
  opts.seed = 7;
  opts.out_dir = fx->dir.path();
  opts.max_shard_bytes = key.max_shard_bytes;
  RETURN_IF_ERROR(model::WriteSyntheticModel(opts));
  if (key.attention_bias) RETURN_IF_ERROR(AddAttentionBiases(fx->dir.path()));
  ASSIGN_OR_RETURN(fx->weights, model::LoadModelWeights(fx->dir.path()));
  const int vocab = fx->weights.config.vocab_size;
  fx->workload = MakeWorkload(vocab, 1234 + static_cast<uint32_t>(key.arch));
  ASSIGN_OR_RETURN(fx->ref, RunReference(fx->dir.path(), fx->workload, vocab));
  return fx;
}

// Cached: when the binary runs many instances in one process, each model is built once.
Result<std::shared_ptr<ModelFixture>> GetFixture(const ModelKey& key) {
  return CachedFixture<ModelFixture>(key, BuildFixture);
}

// Builds (or reuses) the model, then runs every engine case against its reference.
void SweepModel(const ModelKey& key, const std::vector<EngineCase>& cases) {
  if (!PythonSkipReason().empty()) GTEST_SKIP() << PythonSkipReason();
  auto fx = GetFixture(key);
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  // The synthetic weights must make logits far from uniform, or the comparison proves little.
  const std::vector<double>& row = (*fx)->ref[2].back();
  const auto [lo, hi] = std::minmax_element(row.begin(), row.end());
  ASSERT_GT(*hi - *lo, 1.0) << "reference logits are nearly uniform";
  for (const EngineCase& ec : cases) {
    SCOPED_TRACE(ec.Name());
    const double worst = RunAndCompare((*fx)->weights, (*fx)->workload, (*fx)->ref, ec);
    std::printf("[ max row error ] %-40s %.3g\n", ec.Name().c_str(), worst);
  }
}

// ---------------------------------------------------------------------------------------------
// The sweep: arch x checkpoint dtype x layout, each over page size x chunk.

using SweepParam = std::tuple<Arch, DType, KvLayout>;

class ReferenceLogitsTest : public ::testing::TestWithParam<SweepParam> {};

TEST_P(ReferenceLogitsTest, PrefillAndDecodeMatchReference) {
  const auto [arch, dtype, layout] = GetParam();
  SweepModel({arch, dtype}, PageAndChunkSweep(layout));
}

std::string SweepName(const ::testing::TestParamInfo<SweepParam>& info) {
  const auto [arch, dtype, layout] = info.param;
  std::string dt = dtype == DType::kF32    ? "f32"
                   : dtype == DType::kBF16 ? "bf16"
                   : dtype == DType::kF16  ? "f16"
                                           : "fp8";
  return std::string(model::ArchName(arch)) + "_" + dt + "_" +
         std::string(engine::KvLayoutName(layout));
}

INSTANTIATE_TEST_SUITE_P(
    AllArchs, ReferenceLogitsTest,
    ::testing::Combine(::testing::Values(Arch::kLlama, Arch::kQwen2, Arch::kQwen3),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(KvLayout::kHND, KvLayout::kNHD)),
    SweepName);

// The reference kernels (plain loops) and a bf16 KV cache, on one configuration per arch.
class ReferenceLogitsVariantTest : public ::testing::TestWithParam<Arch> {};

TEST_P(ReferenceLogitsVariantTest, ReferenceKernelsMatch) {
  EngineCase ec;
  ec.kernels = KernelKind::kReference;
  ec.layout = KvLayout::kNHD;
  ec.page_size = 3;
  ec.chunk = 5;
  SweepModel({GetParam(), DType::kBF16}, {ec});
}

TEST_P(ReferenceLogitsVariantTest, Bf16KvCacheMatchesLoosely) {
  EngineCase ec;
  ec.kv_dtype = KvDType::kBF16;
  ec.tolerance = kTolBf16Kv;
  ec.page_size = 3;
  ec.chunk = 5;
  SweepModel({GetParam(), DType::kBF16}, {ec});
}

INSTANTIATE_TEST_SUITE_P(AllArchs, ReferenceLogitsVariantTest,
                         ::testing::Values(Arch::kLlama, Arch::kQwen2, Arch::kQwen3),
                         [](const ::testing::TestParamInfo<Arch>& info) {
                           return std::string(model::ArchName(info.param));
                         });

// A sharded checkpoint (model.safetensors.index.json + several shards): the engine and the
// reference must both read the shards the index names.
TEST(ReferenceLogitsShardedTest, ShardedCheckpointMatches) {
  if (!PythonSkipReason().empty()) GTEST_SKIP() << PythonSkipReason();
  auto config = model::PresetConfig(Arch::kQwen3, "tiny");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  size_t total_bytes = 0;
  for (const model::TensorSpec& t : model::RequiredTensors(*config)) {
    size_t elems = 1;
    for (int64_t d : t.shape) elems *= static_cast<size_t>(d);
    total_bytes += elems * model::DTypeSize(DType::kBF16);
  }
  // About a third of the checkpoint per shard: at least three shards.
  const ModelKey key{Arch::kQwen3, DType::kBF16, total_bytes / 3 + 1};
  auto fx = GetFixture(key);
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  const std::string dir = (*fx)->dir.path();
  ASSERT_FALSE(fs::exists(dir + "/model.safetensors"));
  std::ifstream index(dir + "/model.safetensors.index.json");
  ASSERT_TRUE(index.good()) << "no index in " << dir;
  std::map<std::string, int> shards;
  const nlohmann::json index_json =
      nlohmann::json::parse(index, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(index_json.contains("weight_map")) << "bad index in " << dir;
  for (const auto& [name, file] : index_json["weight_map"].items()) {
    ++shards[file.get<std::string>()];
  }
  ASSERT_GE(shards.size(), 3u) << "max_shard_bytes did not split the checkpoint";
  EngineCase ec;
  ec.page_size = 3;
  ec.chunk = 5;
  SweepModel(key, {ec, PageAndChunkSweep(KvLayout::kNHD)[0]});
}

// FP8 checkpoints (make-model --dtype fp8: F8_E4M3 projections with 128x128 block scales, whose
// tiny shapes leave every block partial): the engine's fp8 kernels against the reference's float64
// product of the dequantised weights, within f32's tolerance; fast and reference kernels.
class ReferenceLogitsFp8Test : public ::testing::TestWithParam<Arch> {};

TEST_P(ReferenceLogitsFp8Test, Fp8CheckpointMatches) {
  EngineCase ref_kernels;
  ref_kernels.kernels = KernelKind::kReference;
  ref_kernels.page_size = 3;
  ref_kernels.chunk = 5;
  std::vector<EngineCase> cases = PageAndChunkSweep(KvLayout::kHND);
  cases.push_back(ref_kernels);
  SweepModel({GetParam(), DType::kF8E4M3}, cases);
}

INSTANTIATE_TEST_SUITE_P(LlamaQwen3, ReferenceLogitsFp8Test,
                         ::testing::Values(Arch::kLlama, Arch::kQwen3),
                         [](const ::testing::TestParamInfo<Arch>& info) {
                           return std::string(model::ArchName(info.param));
                         });

// llama and qwen3 with `attention_bias: true` (HF: q/k/v biases and an o_proj bias). Before the
// loader required o_proj.bias and the runner applied it, these logits were off by ~0.3 of the
// largest logit.
class ReferenceLogitsBiasTest : public ::testing::TestWithParam<Arch> {};

TEST_P(ReferenceLogitsBiasTest, AttentionBiasMatches) {
  EngineCase ec;
  ec.page_size = 3;
  ec.chunk = 5;
  SweepModel({GetParam(), DType::kF32, 0, /*attention_bias=*/true}, {ec});
}

INSTANTIATE_TEST_SUITE_P(LlamaQwen3, ReferenceLogitsBiasTest,
                         ::testing::Values(Arch::kLlama, Arch::kQwen3),
                         [](const ::testing::TestParamInfo<Arch>& info) {
                           return std::string(model::ArchName(info.param));
                         });

}  // namespace
}  // namespace pd
