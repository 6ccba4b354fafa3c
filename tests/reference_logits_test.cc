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
// Metric, per row: max_v |engine[v] - ref[v]| / max_v |ref[v]| <= tolerance (1e-3 with an f32
// KV cache). The denominator is the row's largest logit, so a row of near-zero logits cannot
// pass by being tiny, and one wrong vocabulary entry is enough to fail.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
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

namespace pd {
namespace {

namespace fs = std::filesystem;
using engine::KernelKind;
using engine::KvDType;
using engine::KvLayout;
using model::Arch;
using model::DType;

constexpr double kTolF32Kv = 1e-3;
// A bf16 KV cache rounds every cached K and V element to 8 significant bits (relative error up to
// 2^-9 ~ 2e-3 each); through attention, the residual stream and several layers that compounds to
// about 1e-2 of the largest logit, which the float64 reference does not have.
constexpr double kTolBf16Kv = 2e-2;

constexpr int kDecodeSteps = 4;
const int kPromptLengths[] = {1, 7, 20};

// ---------------------------------------------------------------------------------------------
// Helpers: temp dir, python, reference run.

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "pd_reflogits_XXXXXX").string();
    PD_CHECK(mkdtemp(tmpl.data()) != nullptr) << "mkdtemp " << tmpl << ": " << strerror(errno);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// Runs `cmd` with stderr folded into stdout; returns the exit status and the output.
std::pair<int, std::string> RunCommand(const std::string& cmd) {
  std::string output;
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed: " + std::string(strerror(errno))};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// Empty when PD_PYTHON can run the reference; else why not (the tests skip with it).
const std::string& PythonSkipReason() {
  static const std::string reason = [] {
    if (access(PD_PYTHON_PATH, X_OK) != 0) return std::string(PD_PYTHON_PATH " not found");
    auto [rc, out] = RunCommand(Quote(PD_PYTHON_PATH) + " -c 'import numpy'");
    if (rc != 0) return std::string(PD_PYTHON_PATH " cannot import numpy: ") + out;
    return std::string();
  }();
  return reason;
}

// Prompts and decode tokens of the sweep; ids from a fixed-seed mt19937 (portable sequence).
struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> decodes;  // fed one per decode step, whatever is predicted
  std::vector<int32_t> FullSequence(size_t i) const {
    std::vector<int32_t> s = prompts[i];
    s.insert(s.end(), decodes[i].begin(), decodes[i].end());
    return s;
  }
};

Workload MakeWorkload(int vocab_size, uint32_t seed) {
  std::mt19937 rng(seed);
  Workload w;
  for (int len : kPromptLengths) {
    std::vector<int32_t> prompt(len), decode(kDecodeSteps);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab_size));
    for (auto& t : decode) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab_size));
    w.prompts.push_back(prompt);
    w.decodes.push_back(decode);
  }
  return w;
}

// ref[seq][pos] = (vocab) float64 logits predicting the token after position pos.
using RefRows = std::vector<std::vector<std::vector<double>>>;

Result<RefRows> ReadRefLogits(const std::string& path, const Workload& w, int vocab_size) {
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  uint64_t dims[2];
  if (!in.read(magic, 8) || std::memcmp(magic, "PDREFLG1", 8) != 0 ||
      !in.read(reinterpret_cast<char*>(dims), sizeof(dims))) {
    return DataLoss(path + ": not a PDREFLG1 logits file");
  }
  if (dims[0] != static_cast<uint64_t>(vocab_size)) {
    return DataLoss(path + ": vocab " + std::to_string(dims[0]));
  }
  RefRows rows(w.prompts.size());
  uint64_t read = 0;
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    for (size_t p = 0; p < w.FullSequence(i).size(); ++p, ++read) {
      std::vector<double> row(vocab_size);  // little-endian float64 == host order on x86-64
      if (!in.read(reinterpret_cast<char*>(row.data()), vocab_size * sizeof(double))) {
        return DataLoss(path + ": truncated at row " + std::to_string(read));
      }
      rows[i].push_back(std::move(row));
    }
  }
  if (read != dims[1]) return DataLoss(path + ": row count " + std::to_string(dims[1]));
  return rows;
}

// One ref_model.py run: every position of every full sequence.
Result<RefRows> RunReference(const std::string& model_dir, const Workload& w, int vocab_size) {
  nlohmann::json requests = nlohmann::json::array();
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    std::vector<int32_t> seq = w.FullSequence(i);
    std::vector<int> positions(seq.size());
    for (size_t p = 0; p < seq.size(); ++p) positions[p] = static_cast<int>(p);
    requests.push_back({{"tokens", seq}, {"positions", positions}});
  }
  const std::string req_path = model_dir + "/ref_requests.json";
  const std::string out_path = model_dir + "/ref_logits.bin";
  std::ofstream(req_path) << nlohmann::json{{"requests", requests}}.dump();
  auto [rc, output] =
      RunCommand(Quote(PD_PYTHON_PATH) + " " + Quote(PD_REF_MODEL_SCRIPT) + " --model " +
                 Quote(model_dir) + " --requests " + Quote(req_path) + " --out " + Quote(out_path));
  if (rc != 0) return Internal("ref_model.py exited " + std::to_string(rc) + ": " + output);
  return ReadRefLogits(out_path, w, vocab_size);
}

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
  static std::map<ModelKey, std::shared_ptr<ModelFixture>> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  ASSIGN_OR_RETURN(auto fx, BuildFixture(key));
  cache[key] = fx;
  return fx;
}

// ---------------------------------------------------------------------------------------------
// Engine side.

struct EngineCase {
  KvLayout layout = KvLayout::kHND;
  int page_size = 16;
  int chunk = 0;  // prefill tokens per step; 0: the whole prompt at once
  KernelKind kernels = KernelKind::kFast;
  KvDType kv_dtype = KvDType::kF32;
  double tolerance = kTolF32Kv;

  std::string Name() const {
    return std::string(engine::KvLayoutName(layout)) + " page=" + std::to_string(page_size) +
           " chunk=" + (chunk == 0 ? std::string("whole") : std::to_string(chunk)) +
           (kernels == KernelKind::kFast ? " fast" : " reference") +
           " kv=" + std::string(engine::KvDTypeName(kv_dtype));
  }
};

// max_v |a[v] - b[v]| / max_v |b[v]|.
double RowError(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t v = 0; v < b.size(); ++v) {
    diff = std::max(diff, std::abs(static_cast<double>(a[v]) - b[v]));
    scale = std::max(scale, std::abs(b[v]));
  }
  return scale > 0 ? diff / scale : diff;
}

// Page tables of the sequences, drawn from a shuffled id list so that no table is contiguous
// and tables of different sequences interleave.
std::vector<std::vector<int32_t>> ScatteredPageTables(const Workload& w, int page_size,
                                                      int* num_pages) {
  std::vector<int> pages_per_seq;
  int total = 0;
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    int len = static_cast<int>(w.FullSequence(i).size());
    pages_per_seq.push_back((len + page_size - 1) / page_size);
    total += pages_per_seq.back();
  }
  *num_pages = total + 5;  // a few never used
  std::vector<int32_t> ids(*num_pages);
  for (int i = 0; i < *num_pages; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), std::mt19937(99));
  std::vector<std::vector<int32_t>> tables;
  size_t next = 0;
  for (int n : pages_per_seq) {
    tables.emplace_back(ids.begin() + next, ids.begin() + next + n);
    next += n;
  }
  return tables;
}

// Runs all sequences of the workload together, step by step, comparing every logits row.
// Returns the largest row error seen.
double RunAndCompare(const ModelFixture& fx, const EngineCase& ec) {
  const Workload& w = fx.workload;
  engine::ModelRunnerOptions opts;
  opts.kv.page_size = ec.page_size;
  opts.kv.layout = ec.layout;
  opts.kv.dtype = ec.kv_dtype;
  opts.kernels = ec.kernels;
  opts.num_threads = 2;
  std::vector<std::vector<int32_t>> tables = ScatteredPageTables(w, ec.page_size, &opts.num_pages);
  auto runner_or = engine::ModelRunner::Create(fx.weights, opts);
  EXPECT_TRUE(runner_or.ok()) << runner_or.status().ToString();
  if (!runner_or.ok()) return INFINITY;
  engine::ModelRunner& runner = **runner_or;

  const size_t n = w.prompts.size();
  std::vector<std::vector<int32_t>> seqs(n);
  for (size_t i = 0; i < n; ++i) seqs[i] = w.FullSequence(i);
  std::vector<int> pos(n, 0);
  double worst = 0;
  for (int step = 0;; ++step) {
    engine::ForwardBatch batch;
    for (size_t i = 0; i < n; ++i) {
      const int len = static_cast<int>(seqs[i].size());
      const int prompt_len = static_cast<int>(w.prompts[i].size());
      if (pos[i] >= len) continue;
      int count = 1;  // a decode step
      if (pos[i] < prompt_len) count = ec.chunk == 0 ? prompt_len : ec.chunk;
      count = std::min(count, std::max(1, prompt_len - pos[i]));
      engine::SeqStep s;
      s.seq_id = static_cast<int64_t>(i);
      s.start_pos = pos[i];
      s.token_ids = std::span<const int32_t>(seqs[i]).subspan(pos[i], count);
      const size_t pages_needed = (pos[i] + count + ec.page_size - 1) / ec.page_size;
      s.page_table = std::span<const int32_t>(tables[i]).first(pages_needed);
      s.compute_logits = true;
      batch.seqs.push_back(s);
    }
    if (batch.seqs.empty()) break;
    engine::ForwardOutput out;
    Status st = runner.Forward(batch, &out);
    EXPECT_TRUE(st.ok()) << "step " << step << ": " << st.ToString();
    EXPECT_EQ(out.logits.size(), batch.seqs.size()) << "step " << step;
    if (!st.ok() || out.logits.size() != batch.seqs.size()) return INFINITY;
    for (size_t b = 0; b < batch.seqs.size(); ++b) {
      const engine::SeqStep& s = batch.seqs[b];
      const int last = s.start_pos + static_cast<int>(s.token_ids.size()) - 1;
      const std::vector<double>& want = fx.ref[s.seq_id][last];
      EXPECT_EQ(out.logits[b].size(), want.size()) << "seq " << s.seq_id << " pos " << last;
      if (out.logits[b].size() != want.size()) return INFINITY;
      const double err = RowError(out.logits[b], want);
      worst = std::max(worst, err);
      EXPECT_LE(err, ec.tolerance)
          << "seq " << s.seq_id << " (prompt length " << w.prompts[s.seq_id].size() << ") position "
          << last
          << (last < static_cast<int>(w.prompts[s.seq_id].size()) ? " (prefill chunk end)"
                                                                  : " (decode step)");
      pos[s.seq_id] = last + 1;
    }
  }
  return worst;
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
    const double worst = RunAndCompare(**fx, ec);
    std::printf("[ max row error ] %-40s %.3g\n", ec.Name().c_str(), worst);
  }
}

std::vector<EngineCase> PageAndChunkSweep(KvLayout layout) {
  std::vector<EngineCase> cases;
  for (int page_size : {1, 3, 16}) {
    for (int chunk : {0, 5}) {
      EngineCase ec;
      ec.layout = layout;
      ec.page_size = page_size;
      ec.chunk = chunk;
      cases.push_back(ec);
    }
  }
  return cases;
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
  std::string dt = dtype == DType::kF32 ? "f32" : dtype == DType::kBF16 ? "bf16" : "f16";
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
