// Shared by the reference-logits tests (reference_logits_test.cc: the dense archs;
// reference_logits_moe_test.cc: qwen3_moe and deepseek_v3): running tests/reference/ref_model.py
// on a written checkpoint, and driving a ModelRunner step by step over the same sequences.
//
// Metric, per row: max_v |engine[v] - ref[v]| / max_v |ref[v]| <= tolerance (1e-3 with an f32
// KV cache). The denominator is the row's largest logit, so a row of near-zero logits cannot
// pass by being tiny, and one wrong vocabulary entry is enough to fail.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
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
#include <vector>

#include "common/check.h"
#include "common/status.h"
#include "engine/kv_cache.h"
#include "engine/model_runner.h"
#include "model/weights.h"

namespace pd::reflogits {

inline constexpr double kTolF32Kv = 1e-3;
// A bf16 KV cache rounds every cached K and V element to 8 significant bits (relative error up to
// 2^-9 ~ 2e-3 each); through attention, the residual stream and several layers that compounds to
// about 1e-2 of the largest logit, which the float64 reference does not have.
inline constexpr double kTolBf16Kv = 2e-2;

inline constexpr int kDecodeSteps = 4;
inline constexpr int kPromptLengths[] = {1, 7, 20};

// ---------------------------------------------------------------------------------------------
// Temp dir, python, reference run.

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pd_reflogits_XXXXXX").string();
    PD_CHECK(mkdtemp(tmpl.data()) != nullptr) << "mkdtemp " << tmpl << ": " << strerror(errno);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string Quote(const std::string& s) { return "'" + s + "'"; }

// Runs `cmd` with stderr folded into stdout; returns the exit status and the output.
inline std::pair<int, std::string> RunCommand(const std::string& cmd) {
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
inline const std::string& PythonSkipReason() {
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
  // Sequences the reference extends greedily by greedy_steps tokens (the engine must produce
  // the same tokens, alone and batched).
  std::vector<std::vector<int32_t>> greedy_prompts;
  int greedy_steps = 0;

  std::vector<int32_t> FullSequence(size_t i) const {
    std::vector<int32_t> s = prompts[i];
    s.insert(s.end(), decodes[i].begin(), decodes[i].end());
    return s;
  }
};

inline Workload MakeWorkload(int vocab_size, uint32_t seed) {
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

// ref[seq][pos] = (vocab) float64 logits predicting the token after position pos, for the
// workload's sequences; then ref[prompts.size() + g][j] = the logits from which the reference
// took greedy sequence g's token j.
using RefRows = std::vector<std::vector<std::vector<double>>>;

inline Result<RefRows> ReadRefLogits(const std::string& path, const Workload& w, int vocab_size) {
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
  std::vector<size_t> counts;
  for (size_t i = 0; i < w.prompts.size(); ++i) counts.push_back(w.FullSequence(i).size());
  for (size_t g = 0; g < w.greedy_prompts.size(); ++g) counts.push_back(w.greedy_steps);
  RefRows rows(counts.size());
  uint64_t read = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    for (size_t p = 0; p < counts[i]; ++p, ++read) {
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

// One ref_model.py run: every position of every full sequence, and the greedy sequences.
inline Result<RefRows> RunReference(const std::string& model_dir, const Workload& w,
                                    int vocab_size) {
  nlohmann::json requests = nlohmann::json::array();
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    std::vector<int32_t> seq = w.FullSequence(i);
    std::vector<int> positions(seq.size());
    for (size_t p = 0; p < seq.size(); ++p) positions[p] = static_cast<int>(p);
    requests.push_back({{"tokens", seq}, {"positions", positions}});
  }
  for (const std::vector<int32_t>& prompt : w.greedy_prompts) {
    std::vector<int> positions;
    for (int j = 0; j < w.greedy_steps; ++j) positions.push_back(prompt.size() - 1 + j);
    requests.push_back({{"tokens", prompt}, {"positions", positions}, {"greedy", w.greedy_steps}});
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
// Engine side.

struct EngineCase {
  engine::KvLayout layout = engine::KvLayout::kHND;
  int page_size = 16;
  int chunk = 0;  // prefill tokens per step; 0: the whole prompt at once
  engine::KernelKind kernels = engine::KernelKind::kFast;
  engine::KvDType kv_dtype = engine::KvDType::kF32;
  double tolerance = kTolF32Kv;

  std::string Name() const {
    return std::string(engine::KvLayoutName(layout)) + " page=" + std::to_string(page_size) +
           " chunk=" + (chunk == 0 ? std::string("whole") : std::to_string(chunk)) +
           (kernels == engine::KernelKind::kFast ? " fast" : " reference") +
           " kv=" + std::string(engine::KvDTypeName(kv_dtype));
  }
};

// page sizes x {whole prompt, 5-token chunks}.
inline std::vector<EngineCase> PageAndChunkSweep(engine::KvLayout layout,
                                                 std::vector<int> page_sizes = {1, 3, 16}) {
  std::vector<EngineCase> cases;
  for (int page_size : page_sizes) {
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

// max_v |a[v] - b[v]| / max_v |b[v]|.
inline double RowError(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t v = 0; v < b.size(); ++v) {
    diff = std::max(diff, std::abs(static_cast<double>(a[v]) - b[v]));
    scale = std::max(scale, std::abs(b[v]));
  }
  return scale > 0 ? diff / scale : diff;
}

// Page tables for sequences of the given lengths, drawn from a shuffled id list so that no
// table is contiguous and tables of different sequences interleave.
inline std::vector<std::vector<int32_t>> ScatteredPageTables(const std::vector<int>& lengths,
                                                             int page_size, int* num_pages) {
  std::vector<int> pages_per_seq;
  int total = 0;
  for (int len : lengths) {
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

// Sequences run together through one ModelRunner, step by step: each prompt in chunks of
// ec.chunk (or whole), then one token per decode step. A sequence's decode tokens are
// decodes[i] when given, else the argmax of the previous logits (greedy). Every step's logits
// row (each chunk's last token, each decode step) is handed to on_row(seq, position, row).
struct StepRun {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> decodes;  // empty: greedy
  int greedy_steps = 0;
};

inline int32_t Argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Returns every sequence's tokens after its prompt (the decodes, or the greedy tokens), or an
// empty vector after a failure (reported with EXPECT).
template <typename OnRow>
std::vector<std::vector<int32_t>> RunSteps(const model::ModelWeights& weights, const StepRun& run,
                                           const EngineCase& ec, OnRow on_row) {
  const size_t n = run.prompts.size();
  auto steps_of = [&](size_t i) {
    return run.decodes.empty() ? run.greedy_steps : static_cast<int>(run.decodes[i].size());
  };
  std::vector<std::vector<int32_t>> seqs(run.prompts);
  std::vector<int> lengths;
  for (size_t i = 0; i < n; ++i) lengths.push_back(run.prompts[i].size() + steps_of(i));
  engine::ModelRunnerOptions opts;
  opts.kv.page_size = ec.page_size;
  opts.kv.layout = ec.layout;
  opts.kv.dtype = ec.kv_dtype;
  opts.kernels = ec.kernels;
  opts.num_threads = 2;
  std::vector<std::vector<int32_t>> tables =
      ScatteredPageTables(lengths, ec.page_size, &opts.num_pages);
  auto runner_or = engine::ModelRunner::Create(weights, opts);
  EXPECT_TRUE(runner_or.ok()) << runner_or.status().ToString();
  if (!runner_or.ok()) return {};
  engine::ModelRunner& runner = **runner_or;
  std::vector<int> pos(n, 0);
  for (int step = 0;; ++step) {
    engine::ForwardBatch batch;
    for (size_t i = 0; i < n; ++i) {
      const int prompt_len = static_cast<int>(run.prompts[i].size());
      // a decode step's token is in seqs[i] once the previous step produced it
      if (pos[i] >= lengths[i] || pos[i] >= static_cast<int>(seqs[i].size())) continue;
      int count = 1;
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
    if (!st.ok() || out.logits.size() != batch.seqs.size()) return {};
    std::vector<std::pair<size_t, int32_t>> appends;  // after the loop: spans point into seqs
    for (size_t b = 0; b < batch.seqs.size(); ++b) {
      const size_t i = static_cast<size_t>(batch.seqs[b].seq_id);
      const int last =
          batch.seqs[b].start_pos + static_cast<int>(batch.seqs[b].token_ids.size()) - 1;
      if (!on_row(i, last, out.logits[b])) return {};
      pos[i] = last + 1;
      const int next = last + 1 - static_cast<int>(run.prompts[i].size());
      if (next >= 0 && next < steps_of(i)) {
        appends.push_back({i, run.decodes.empty() ? Argmax(out.logits[b]) : run.decodes[i][next]});
      }
    }
    for (auto [i, token] : appends) seqs[i].push_back(token);
  }
  std::vector<std::vector<int32_t>> generated(n);
  for (size_t i = 0; i < n; ++i)
    generated[i].assign(seqs[i].begin() + run.prompts[i].size(), seqs[i].end());
  return generated;
}

// Runs all sequences of the workload together, comparing every logits row with the reference.
// Returns the largest row error seen.
inline double RunAndCompare(const model::ModelWeights& weights, const Workload& w,
                            const RefRows& ref, const EngineCase& ec) {
  double worst = 0;
  StepRun run{w.prompts, w.decodes, 0};
  auto on_row = [&](size_t i, int last, const std::vector<float>& row) {
    const std::vector<double>& want = ref[i][last];
    EXPECT_EQ(row.size(), want.size()) << "seq " << i << " pos " << last;
    if (row.size() != want.size()) return false;
    const double err = RowError(row, want);
    worst = std::max(worst, err);
    const bool prefill = last < static_cast<int>(w.prompts[i].size());
    EXPECT_LE(err, ec.tolerance) << "seq " << i << " (prompt length " << w.prompts[i].size()
                                 << ") position " << last
                                 << (prefill ? " (prefill chunk end)" : " (decode step)");
    return true;
  };
  if (RunSteps(weights, run, ec, on_row).size() != w.prompts.size()) return INFINITY;
  return worst;
}

// Build(key) once per key in this process (a binary running many instances builds each model
// and runs the reference once); errors are not cached.
template <typename Fixture, typename Key, typename BuildFn>
Result<std::shared_ptr<Fixture>> CachedFixture(const Key& key, BuildFn build) {
  static std::map<Key, std::shared_ptr<Fixture>> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  ASSIGN_OR_RETURN(std::shared_ptr<Fixture> fx, build(key));
  cache[key] = fx;
  return fx;
}

}  // namespace pd::reflogits
