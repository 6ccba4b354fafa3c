// deepseek_v3's multi-token-prediction layer against the float64 NumPy reference
// (tests/reference/ref_model.py, mtp_forward) on the very same "tiny" checkpoint (one MTP layer),
// with f32 and bf16 weights, at TP 1 and 2.
//
// The target runs two sequences (9 and 20 tokens) together in 5-token chunks with every hidden
// state returned (ForwardBatch::all_hidden); after each chunk the MTP runner runs the positions it
// can (position p needs h_p and token p+1) with logits at each. Every MTP row must be within 1e-3
// of the reference row (max_v |engine - ref| / max_v |ref|, reference_logits_util.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "model/model_writer.h"
#include "model/weights.h"
#include "tests/reference_logits_util.h"

namespace pd {
namespace {

using model::DType;
using namespace reflogits;  // NOLINT(build/namespaces): the shared test helpers

constexpr int kLengths[] = {9, 20};
constexpr int kChunk = 5;
constexpr int kPageSize = 4;

// ref[s][p]: the MTP layer's logits at position p of sequence s (p < length - 1).
Result<std::vector<std::vector<std::vector<double>>>> RunMtpReference(
    const std::string& dir, const std::vector<std::vector<int32_t>>& seqs, int vocab) {
  nlohmann::json requests = nlohmann::json::array();
  size_t total = 0;
  for (const std::vector<int32_t>& s : seqs) {
    std::vector<int> positions;
    for (size_t p = 0; p + 1 < s.size(); ++p) positions.push_back(static_cast<int>(p));
    total += positions.size();
    requests.push_back({{"tokens", s}, {"positions", positions}, {"mtp", true}});
  }
  const std::string req = dir + "/mtp_requests.json", out = dir + "/mtp_logits.bin";
  std::ofstream(req) << nlohmann::json{{"requests", requests}}.dump();
  auto [rc, output] =
      RunCommand(Quote(PD_PYTHON_PATH) + " " + Quote(PD_REF_MODEL_SCRIPT) + " --model " +
                 Quote(dir) + " --requests " + Quote(req) + " --out " + Quote(out));
  if (rc != 0) return Internal("ref_model.py exited " + std::to_string(rc) + ": " + output);
  std::ifstream in(out, std::ios::binary);
  char magic[8];
  uint64_t dims[2];
  if (!in.read(magic, 8) || !in.read(reinterpret_cast<char*>(dims), sizeof(dims)) ||
      dims[0] != static_cast<uint64_t>(vocab) || dims[1] != total)
    return DataLoss(out + ": not the expected PDREFLG1 logits");
  std::vector<std::vector<std::vector<double>>> ref(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (size_t p = 0; p + 1 < seqs[s].size(); ++p) {
      std::vector<double> row(vocab);
      if (!in.read(reinterpret_cast<char*>(row.data()), vocab * sizeof(double)))
        return DataLoss(out + ": truncated");
      ref[s].push_back(std::move(row));
    }
  }
  return ref;
}

// Runs the target (TP tp) over the sequences in chunks and the MTP layer (TP tp) after each,
// comparing every MTP row with ref.
void CheckMtpRows(const model::ModelWeights& weights, int tp,
                  const std::vector<std::vector<int32_t>>& seqs,
                  const std::vector<std::vector<std::vector<double>>>& ref) {
  const int vocab = weights.config.vocab_size, hd = weights.config.hidden_size;
  engine::ModelRunnerOptions ro;
  ro.kv.page_size = kPageSize;
  ro.num_pages = 16;
  ro.num_threads = 1;
  ro.tensor_parallel_size = tp;
  auto target = engine::ModelRunner::Create(weights, ro);
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  auto mtp = engine::CreateMtpRunner(weights, 0, ro);
  ASSERT_TRUE(mtp.ok()) << mtp.status().ToString();
  const std::vector<std::vector<int32_t>> tables = {{0, 1, 2}, {8, 3, 9, 4, 10}};
  std::vector<std::vector<float>> hidden(seqs.size());  // (length, hidden) gathered
  std::vector<int> mtp_done(seqs.size(), 0);
  int rows_checked = 0;
  for (int start = 0; start < kLengths[1]; start += kChunk) {
    engine::ForwardBatch tb;
    tb.all_hidden = true;
    std::vector<size_t> in_batch;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int n = std::min<int>(kChunk, static_cast<int>(seqs[s].size()) - start);
      if (n <= 0) continue;
      tb.seqs.push_back({static_cast<int64_t>(s), start,
                         std::span<const int32_t>(seqs[s]).subspan(start, n), tables[s]});
      in_batch.push_back(s);
    }
    engine::ForwardOutput tout;
    ASSERT_TRUE((*target)->Forward(tb, &tout).ok());
    ASSERT_EQ(tout.hidden.size(), in_batch.size());
    engine::ForwardBatch mb;
    for (size_t i = 0; i < in_batch.size(); ++i) {
      const size_t s = in_batch[i];
      ASSERT_EQ(tout.hidden[i].size(), tb.seqs[i].token_ids.size() * hd);
      hidden[s].insert(hidden[s].end(), tout.hidden[i].begin(), tout.hidden[i].end());
      const int known = static_cast<int>(hidden[s].size() / hd);
      const int end = std::min<int>(known, static_cast<int>(seqs[s].size()) - 1);
      if (end <= mtp_done[s]) continue;
      engine::SeqStep step{
          static_cast<int64_t>(s),
          mtp_done[s],
          std::span<const int32_t>(seqs[s]).subspan(mtp_done[s] + 1, end - mtp_done[s]),
          tables[s],
          true,
          end - mtp_done[s]};
      step.input_hidden = std::span<const float>(hidden[s]).subspan(size_t(mtp_done[s]) * hd,
                                                                    size_t(end - mtp_done[s]) * hd);
      mb.seqs.push_back(step);
    }
    if (mb.seqs.empty()) continue;
    engine::ForwardOutput mout;
    ASSERT_TRUE((*mtp)->Forward(mb, &mout).ok());
    for (size_t i = 0; i < mb.seqs.size(); ++i) {
      const size_t s = static_cast<size_t>(mb.seqs[i].seq_id);
      for (int r = 0; r < mb.seqs[i].num_logits; ++r) {
        const int p = mb.seqs[i].start_pos + r;
        const std::vector<float> row(mout.logits[i].begin() + size_t(r) * vocab,
                                     mout.logits[i].begin() + size_t(r + 1) * vocab);
        EXPECT_LE(RowError(row, ref[s][p]), kTolF32Kv) << "seq " << s << " position " << p;
        ++rows_checked;
      }
      mtp_done[s] = mb.seqs[i].start_pos + mb.seqs[i].num_logits;
    }
  }
  EXPECT_EQ(rows_checked, kLengths[0] - 1 + kLengths[1] - 1);
}

class MtpReferenceTest : public ::testing::TestWithParam<DType> {};

TEST_P(MtpReferenceTest, MtpLogitsMatchTheReference) {
  if (!PythonSkipReason().empty()) GTEST_SKIP() << PythonSkipReason();
  TempDir dir;
  model::SyntheticModelOptions opts;
  opts.arch = model::Arch::kDeepseekV3;
  opts.preset = "tiny";
  opts.dtype = GetParam();
  opts.seed = 5;
  opts.num_nextn_predict_layers = 1;
  opts.out_dir = dir.path();
  ASSERT_TRUE(model::WriteSyntheticModel(opts).ok());
  Result<model::ModelWeights> weights = model::LoadModelWeights(dir.path());
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  ASSERT_EQ(weights->mtp.size(), 1u);
  const int vocab = weights->config.vocab_size;
  std::mt19937 rng(99);
  std::vector<std::vector<int32_t>> seqs;
  for (int len : kLengths) {
    std::vector<int32_t>& s = seqs.emplace_back(len);
    for (int32_t& t : s) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  }
  auto ref = RunMtpReference(dir.path(), seqs, vocab);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();

  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    CheckMtpRows(*weights, tp, seqs, *ref);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MtpReferenceTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) {
                           return info.param == DType::kF32 ? "f32" : "bf16";
                         });

}  // namespace
}  // namespace pd
