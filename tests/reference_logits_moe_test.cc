// qwen3_moe and deepseek_v3 against the independent float64 NumPy reference
// (tests/reference/ref_model.py) reading the very same safetensors.
//
// Per model (arch x checkpoint dtype; qwen3_moe as the preset, which has mlp_only_layers, and
// with decoder_sparse_step > 1; deepseek_v3 with q_lora_rank set or null x yarn on or off), a
// "tiny" synthetic checkpoint is written once and ref_model.py runs once on it: the logits of every
// position of three sequences (prompts of 1, 7 and 20 tokens, each followed by 4 fixed decode
// tokens), and eight greedy continuations of 6 tokens. The engine then runs the three sequences
// together, with pages of 1 and of 16 tokens, each with the whole prompt at once and in 5-token
// chunks: every logits row (each chunk's last token, each decode step) must be within 1e-3 of the
// reference row (metric in reference_logits_util.h). Greedy decoding of the eight prompts, batched
// together and then two of them alone, must give the reference's tokens.
//
// The deepseek_v3 variants are made by rewriting the written checkpoint: q_lora_rank null
// replaces q_a_proj/q_a_layernorm/q_b_proj with a q_proj (and the reverse when the preset has a
// plain q_proj), and yarn sets rope_scaling as DeepSeek-V3's config does (with
// max_position_embeddings = factor * original_max_position_embeddings, and mscale_all_dim !=
// mscale so that yarn's attention factor is not 1). The qwen3_moe variant makes all layers
// but the last dense (decoder_sparse_step = num_hidden_layers, mlp_only_layers []) with a dense
// MLP in place of their experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model_runner.h"
#include "model/config.h"
#include "model/dtype.h"
#include "model/model_writer.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tests/reference_logits_util.h"

namespace pd {
namespace {

using model::Arch;
using model::DType;
using namespace reflogits;  // NOLINT(build/namespaces): the shared test helpers

constexpr int kGreedyLengths[] = {11, 1, 7, 23, 4, 16, 2, 30};
constexpr int kGreedySteps = 6;
// A reference step whose two best logits are closer than this (relative to the row's largest)
// could go either way within the tolerance: greedy tokens are compared up to it.
constexpr double kNearTie = 3 * kTolF32Kv;
constexpr int kQLoraRank = 24;  // when the variant adds q_a_proj/q_b_proj

struct MoeKey {
  Arch arch = Arch::kQwen3Moe;
  DType dtype = DType::kF32;
  bool q_lora = true;        // deepseek_v3 only
  bool yarn = true;          // deepseek_v3 only
  bool sparse_step = false;  // qwen3_moe: decoder_sparse_step num_layers, mlp_only_layers []
  auto operator<=>(const MoeKey&) const = default;

  std::string Name() const {
    std::string name = std::string(model::ArchName(arch)) + "_" +
                       (dtype == DType::kF32      ? "f32"
                        : dtype == DType::kBF16   ? "bf16"
                        : dtype == DType::kF8E4M3 ? "fp8"
                                                  : "f16");
    if (sparse_step) name += "_sparse_step";
    if (arch == Arch::kDeepseekV3) {
      name += std::string(q_lora ? "_qlora" : "_qproj") + (yarn ? "_yarn" : "_noyarn");
    }
    return name;
  }
  friend void PrintTo(const MoeKey& key, std::ostream* os) { *os << key.Name(); }
};

struct MoeFixture {
  TempDir dir;
  model::ModelWeights weights;
  Workload workload;
  RefRows ref;
};

// ---------------------------------------------------------------------------------------------
// The deepseek_v3 variants.

Result<std::vector<float>> ToFloats(const model::TensorView& v) {
  size_t n = 1;
  for (int64_t d : v.shape) n *= static_cast<size_t>(d);
  std::vector<float> out(n);
  if (v.dtype == DType::kF32) {
    std::memcpy(out.data(), v.data, n * sizeof(float));
  } else if (v.dtype == DType::kBF16) {
    const auto* p = static_cast<const uint16_t*>(v.data);
    for (size_t i = 0; i < n; ++i) out[i] = model::Bf16ToF32(p[i]);
  } else {
    return InvalidArgument("expected an f32 or bf16 tensor");
  }
  return out;
}

double Stddev(const std::vector<float>& x) {
  double sum = 0, sq = 0;
  for (float f : x) sum += f, sq += static_cast<double>(f) * f;
  const double mean = sum / x.size();
  return std::sqrt(std::max(0.0, sq / x.size() - mean * mean));
}

// A (shape) tensor of `dtype` with entries offset + N(0, stddev).
model::NamedTensor RandomTensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                                double stddev, double offset, std::mt19937& rng) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  std::normal_distribution<double> normal(offset, stddev);
  std::vector<uint8_t> bytes(n * model::DTypeSize(dtype));
  for (size_t i = 0; i < n; ++i) {
    const float f = static_cast<float>(normal(rng));
    if (dtype == DType::kF32) {
      std::memcpy(bytes.data() + i * 4, &f, 4);
    } else {
      const uint16_t b = model::F32ToBf16(f);
      std::memcpy(bytes.data() + i * 2, &b, 2);
    }
  }
  return {name, dtype, std::move(shape), std::move(bytes)};
}

Result<nlohmann::json> ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!in.good() || j.is_discarded()) return DataLoss(path + ": not JSON");
  return j;
}

// Rewrites DIR's checkpoint as one model.safetensors: the tensors keep(name) accepts, then those
// add(checkpoint, name, view, &out) appends while every name is visited.
using AddFn = std::function<Status(model::Checkpoint&, const std::string&, const model::TensorView&,
                                   std::vector<model::NamedTensor>*)>;
Status RewriteCheckpoint(const std::string& dir,
                         const std::function<bool(const std::string&)>& keep, const AddFn& add) {
  std::vector<model::NamedTensor> tensors;
  {
    ASSIGN_OR_RETURN(auto checkpoint, model::Checkpoint::Open(dir));
    for (const std::string& name : checkpoint->Names()) {
      ASSIGN_OR_RETURN(model::TensorView v, checkpoint->Get(name));
      if (keep(name)) {
        const auto* p = static_cast<const uint8_t*>(v.data);
        tensors.push_back({name, v.dtype, v.shape, std::vector<uint8_t>(p, p + v.size_bytes())});
      }
      RETURN_IF_ERROR(add(*checkpoint, name, v, &tensors));
    }
  }  // unmapped before the files are rewritten
  std::error_code ec;
  std::filesystem::remove(dir + "/model.safetensors.index.json", ec);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") std::filesystem::remove(entry.path(), ec);
  }
  return model::WriteSafetensors(dir + "/model.safetensors", tensors);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Swaps the query projection of every MLA layer (the MTP layer's too) between q_proj and
// q_a_proj/q_a_layernorm/q_b_proj; random weights scaled like the layer's kv projections.
Status SwapQueryProjection(const std::string& dir, const nlohmann::json& cfg, bool to_lora,
                           DType dtype) {
  const int64_t hidden = cfg["hidden_size"].get<int64_t>();
  const int64_t q_out =
      cfg["num_attention_heads"].get<int64_t>() *
      (cfg["qk_nope_head_dim"].get<int64_t>() + cfg["qk_rope_head_dim"].get<int64_t>());
  const std::string kKvA = "kv_a_proj_with_mqa.weight";
  std::mt19937 rng(11);
  auto keep = [](const std::string& name) {
    return name.find("self_attn.q_proj.") == std::string::npos &&
           name.find("self_attn.q_a_") == std::string::npos &&
           name.find("self_attn.q_b_proj.") == std::string::npos;
  };
  auto add = [&](model::Checkpoint& checkpoint, const std::string& name, const model::TensorView& v,
                 std::vector<model::NamedTensor>* out) -> Status {
    if (!EndsWith(name, kKvA)) return OkStatus();
    const std::string attn = name.substr(0, name.size() - kKvA.size());
    ASSIGN_OR_RETURN(std::vector<float> kv_a, ToFloats(v));
    ASSIGN_OR_RETURN(model::TensorView kv_b_view, checkpoint.Get(attn + "kv_b_proj.weight"));
    ASSIGN_OR_RETURN(std::vector<float> kv_b, ToFloats(kv_b_view));
    if (to_lora) {
      out->push_back(RandomTensor(attn + "q_a_proj.weight", dtype, {kQLoraRank, hidden},
                                  Stddev(kv_a), 0, rng));
      out->push_back(
          RandomTensor(attn + "q_a_layernorm.weight", dtype, {kQLoraRank}, 0.1, 1.0, rng));
      out->push_back(
          RandomTensor(attn + "q_b_proj.weight", dtype, {q_out, kQLoraRank}, Stddev(kv_b), 0, rng));
    } else {
      out->push_back(
          RandomTensor(attn + "q_proj.weight", dtype, {q_out, hidden}, Stddev(kv_a), 0, rng));
    }
    return OkStatus();
  };
  return RewriteCheckpoint(dir, keep, add);
}

Status MakeDeepseekVariant(const std::string& dir, const MoeKey& key) {
  ASSIGN_OR_RETURN(nlohmann::json cfg, ReadJson(dir + "/config.json"));
  if (key.yarn) {
    // DeepSeek-V3's rope_scaling, at a small original context. With q_lora_rank set,
    // max_position_embeddings == factor * original (as real configs have it), where transformers'
    // older and newer readings of factor agree; with the plain q_proj it is 8 * original, so the
    // engine must take `factor` as given (transformers main), not max / original (4.4x-4.5x).
    constexpr int kOriginal = 256;
    cfg["max_position_embeddings"] = (key.q_lora ? 4 : 8) * kOriginal;
    cfg["rope_scaling"] = {{"type", "yarn"},
                           {"factor", 4.0},
                           {"beta_fast", 32.0},
                           {"beta_slow", 1.0},
                           {"mscale", 1.0},
                           {"mscale_all_dim", 0.707},
                           {"original_max_position_embeddings", kOriginal}};
  } else {
    cfg["rope_scaling"] = nullptr;
  }
  const bool has_lora = cfg.contains("q_lora_rank") && cfg["q_lora_rank"].is_number() &&
                        cfg["q_lora_rank"].get<int>() > 0;
  if (has_lora != key.q_lora) {
    RETURN_IF_ERROR(SwapQueryProjection(dir, cfg, key.q_lora, key.dtype));
    cfg["q_lora_rank"] = key.q_lora ? nlohmann::json(kQLoraRank) : nlohmann::json(nullptr);
  }
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  return OkStatus();
}

// HF's Qwen3MoeDecoderLayer rule: sparse unless in mlp_only_layers, when (i+1) % step == 0.
bool QwenSparse(int layer, int step, const std::vector<int>& mlp_only) {
  return std::find(mlp_only.begin(), mlp_only.end(), layer) == mlp_only.end() &&
         (layer + 1) % step == 0;
}

// qwen3_moe with decoder_sparse_step = num_hidden_layers and mlp_only_layers [] (only the last
// layer sparse; the tiny preset has step 1 and mlp_only_layers [1]): the layers that become
// dense get a dense MLP (intermediate_size) in place of the router and experts, scaled like the
// experts.
Status MakeQwenSparseStepVariant(const std::string& dir, DType dtype) {
  ASSIGN_OR_RETURN(nlohmann::json cfg, ReadJson(dir + "/config.json"));
  const int layers = cfg["num_hidden_layers"].get<int>();
  const int64_t hidden = cfg["hidden_size"].get<int64_t>();
  const int64_t inter = cfg["intermediate_size"].get<int64_t>();
  const int old_step = cfg.value("decoder_sparse_step", 1);
  std::vector<int> old_only;
  if (cfg.contains("mlp_only_layers") && cfg["mlp_only_layers"].is_array()) {
    old_only = cfg["mlp_only_layers"].get<std::vector<int>>();
  }
  const int step = layers;
  const std::vector<int> only;
  std::set<std::string> dense;  // "model.layers.{i}.mlp." of the layers that become dense
  for (int i = 0; i < layers; ++i) {
    const bool was = QwenSparse(i, old_step, old_only), now = QwenSparse(i, step, only);
    if (now && !was) return FailedPrecondition("preset layer " + std::to_string(i) + " is dense");
    if (was && !now) dense.insert("model.layers." + std::to_string(i) + ".mlp.");
  }
  if (dense.empty()) return FailedPrecondition("no layer becomes dense");
  auto layer_mlp = [&](const std::string& name) -> std::string {
    for (const std::string& p : dense) {
      if (name.compare(0, p.size(), p) == 0) return p;
    }
    return "";
  };
  std::mt19937 rng(12);
  auto keep = [&](const std::string& name) { return layer_mlp(name).empty(); };
  auto add = [&](model::Checkpoint&, const std::string& name, const model::TensorView& v,
                 std::vector<model::NamedTensor>* out) -> Status {
    const std::string p = layer_mlp(name);
    if (p.empty() || name != p + "experts.0.gate_proj.weight") return OkStatus();
    ASSIGN_OR_RETURN(std::vector<float> expert, ToFloats(v));
    const double sd = Stddev(expert);
    out->push_back(RandomTensor(p + "gate_proj.weight", dtype, {inter, hidden}, sd, 0, rng));
    out->push_back(RandomTensor(p + "up_proj.weight", dtype, {inter, hidden}, sd, 0, rng));
    out->push_back(RandomTensor(p + "down_proj.weight", dtype, {hidden, inter}, sd, 0, rng));
    return OkStatus();
  };
  RETURN_IF_ERROR(RewriteCheckpoint(dir, keep, add));
  cfg["decoder_sparse_step"] = step;
  cfg["mlp_only_layers"] = only;
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Fixtures, built once per process.

Workload MakeMoeWorkload(int vocab_size, uint32_t seed) {
  Workload w = MakeWorkload(vocab_size, seed);
  std::mt19937 rng(seed + 1);
  for (int len : kGreedyLengths) {
    std::vector<int32_t> prompt(len);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab_size));
    w.greedy_prompts.push_back(prompt);
  }
  w.greedy_steps = kGreedySteps;
  return w;
}

Result<std::shared_ptr<MoeFixture>> BuildFixture(const MoeKey& key) {
  auto fx = std::make_shared<MoeFixture>();
  model::SyntheticModelOptions opts;
  opts.arch = key.arch;
  opts.preset = "tiny";
  opts.dtype = key.dtype;
  opts.seed = 7;
  opts.out_dir = fx->dir.path();
  RETURN_IF_ERROR(model::WriteSyntheticModel(opts));
  if (key.arch == Arch::kDeepseekV3) RETURN_IF_ERROR(MakeDeepseekVariant(fx->dir.path(), key));
  if (key.sparse_step) RETURN_IF_ERROR(MakeQwenSparseStepVariant(fx->dir.path(), key.dtype));
  ASSIGN_OR_RETURN(fx->weights, model::LoadModelWeights(fx->dir.path()));
  const int vocab = fx->weights.config.vocab_size;
  fx->workload = MakeMoeWorkload(vocab, 4321 + static_cast<uint32_t>(key.arch));
  ASSIGN_OR_RETURN(fx->ref, RunReference(fx->dir.path(), fx->workload, vocab));
  return fx;
}

Result<std::shared_ptr<MoeFixture>> GetFixture(const MoeKey& key) {
  return CachedFixture<MoeFixture>(key, BuildFixture);
}

// ---------------------------------------------------------------------------------------------
// Greedy tokens.

// The reference's greedy tokens of sequence g, up to (not including) its first near tie.
std::vector<int32_t> ReferenceGreedy(const MoeFixture& fx, size_t g) {
  std::vector<int32_t> tokens;
  for (const std::vector<double>& row : fx.ref[fx.workload.prompts.size() + g]) {
    std::vector<double> sorted(row);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    double scale = 0;
    for (double v : row) scale = std::max(scale, std::abs(v));
    if (sorted[0] - sorted[1] < kNearTie * scale) break;
    tokens.push_back(static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
  }
  return tokens;
}

std::vector<int32_t> Prefix(const std::vector<int32_t>& v, size_t n) {
  return std::vector<int32_t>(v.begin(), v.begin() + std::min(n, v.size()));
}

// The eight greedy prompts batched (pages of 1, 5-token chunks), then prompts 0 and 7 alone
// (pages of 16, whole prompt): every sequence's tokens must be the reference's, and a prompt's
// tokens alone must be its tokens in the batch.
void CheckGreedy(const MoeFixture& fx) {
  const Workload& w = fx.workload;
  auto ignore_rows = [](size_t, int, const std::vector<float>&) { return true; };
  EngineCase batched;
  batched.page_size = 1;
  batched.chunk = 5;
  const std::vector<std::vector<int32_t>> together =
      RunSteps(fx.weights, StepRun{w.greedy_prompts, {}, w.greedy_steps}, batched, ignore_rows);
  ASSERT_EQ(together.size(), w.greedy_prompts.size());
  std::set<std::vector<int32_t>> distinct;
  size_t compared = 0;
  for (size_t g = 0; g < together.size(); ++g) {
    const std::vector<int32_t> want = ReferenceGreedy(fx, g);
    compared += want.size();
    distinct.insert(together[g]);
    EXPECT_EQ(Prefix(together[g], want.size()), want) << "greedy prompt " << g << " batched";
  }
  // Near ties are rare: nearly every token must have been compared.
  EXPECT_GE(compared, together.size() * kGreedySteps * 3 / 4);
  EXPECT_GE(distinct.size(), 4u) << "greedy tokens should depend on the prompt";
  EngineCase alone;  // pages of 16, whole prompt
  for (size_t g : {size_t{0}, size_t{7}}) {
    const auto tokens = RunSteps(fx.weights, StepRun{{w.greedy_prompts[g]}, {}, w.greedy_steps},
                                 alone, ignore_rows);
    ASSERT_EQ(tokens.size(), 1u);
    EXPECT_EQ(tokens[0], together[g]) << "greedy prompt " << g << " alone vs batched with 7";
  }
}

// ---------------------------------------------------------------------------------------------
// Tests.

class MoeReferenceLogitsTest : public ::testing::TestWithParam<MoeKey> {};

TEST_P(MoeReferenceLogitsTest, PrefillDecodeAndGreedyMatchReference) {
  if (!PythonSkipReason().empty()) GTEST_SKIP() << PythonSkipReason();
  auto fx = GetFixture(GetParam());
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  const std::vector<double>& row = (*fx)->ref[2].back();
  const auto [lo, hi] = std::minmax_element(row.begin(), row.end());
  ASSERT_GT(*hi - *lo, 1.0) << "reference logits are nearly uniform";
  for (const EngineCase& ec : PageAndChunkSweep(engine::KvLayout::kHND, {1, 16})) {
    SCOPED_TRACE(ec.Name());
    const double worst = RunAndCompare((*fx)->weights, (*fx)->workload, (*fx)->ref, ec);
    std::printf("[ max row error ] %-40s %.3g\n", ec.Name().c_str(), worst);
  }
  CheckGreedy(**fx);
}

std::vector<MoeKey> AllKeys() {
  std::vector<MoeKey> keys;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    keys.push_back({Arch::kQwen3Moe, dtype, false, false});
    keys.push_back({Arch::kQwen3Moe, dtype, false, false, /*sparse_step=*/true});
    for (bool q_lora : {true, false}) {
      for (bool yarn : {true, false}) keys.push_back({Arch::kDeepseekV3, dtype, q_lora, yarn});
    }
  }
  // FP8 checkpoints (F8_E4M3 experts and MLA projections with block scales): the reference
  // dequantises them in float64; the tolerance is f32's.
  keys.push_back({Arch::kQwen3Moe, DType::kF8E4M3, false, false});
  keys.push_back({Arch::kDeepseekV3, DType::kF8E4M3, true, true});
  return keys;
}

INSTANTIATE_TEST_SUITE_P(MoeArchs, MoeReferenceLogitsTest, ::testing::ValuesIn(AllKeys()),
                         [](const ::testing::TestParamInfo<MoeKey>& info) {
                           return info.param.Name();
                         });

// The variants must reach the loaded config, and yarn and the query projection change the
// reference's logits.
TEST(MoeReferenceVariantsTest, VariantsReachTheConfigAndChangeTheReference) {
  if (!PythonSkipReason().empty()) GTEST_SKIP() << PythonSkipReason();
  auto base = GetFixture({Arch::kDeepseekV3, DType::kF32, true, true});
  auto no_yarn = GetFixture({Arch::kDeepseekV3, DType::kF32, true, false});
  auto q_proj = GetFixture({Arch::kDeepseekV3, DType::kF32, false, true});
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  ASSERT_TRUE(no_yarn.ok()) << no_yarn.status().ToString();
  ASSERT_TRUE(q_proj.ok()) << q_proj.status().ToString();
  EXPECT_TRUE((*base)->weights.config.yarn);
  EXPECT_FALSE((*no_yarn)->weights.config.yarn);
  EXPECT_GT((*base)->weights.config.mla.q_lora_rank, 0);
  EXPECT_EQ((*q_proj)->weights.config.mla.q_lora_rank, 0);
  auto sparse_step = GetFixture({Arch::kQwen3Moe, DType::kF32, false, false, true});
  ASSERT_TRUE(sparse_step.ok()) << sparse_step.status().ToString();
  const model::ModelConfig& qc = (*sparse_step)->weights.config;
  EXPECT_FALSE(qc.IsMoeLayer(0));
  EXPECT_TRUE(qc.IsMoeLayer(qc.num_layers - 1));
  EXPECT_EQ(qc.moe.decoder_sparse_step, qc.num_layers);
  auto differs = [](const RefRows& a, const RefRows& b) {
    std::vector<float> row(a[2].back().begin(), a[2].back().end());
    return RowError(row, b[2].back());
  };
  EXPECT_GT(differs((*base)->ref, (*no_yarn)->ref), 1e-2);
  EXPECT_GT(differs((*base)->ref, (*q_proj)->ref), 1e-2);
}

}  // namespace
}  // namespace pd
