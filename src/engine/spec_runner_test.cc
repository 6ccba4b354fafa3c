// Speculative verification in the model runner: a step running the last accepted token and K
// drafts with num_logits = K + 1 gives, row by row, the logits that K + 1 single-token decode
// steps would (TP 1 and 2, reference and fast kernels, odd page sizes), in a mixed batch.
#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "engine/model_runner.h"
#include "engine/model_runner_test_util.h"

namespace pd::engine {
namespace {

using testing::MakeTinyModel;
using testing::RelError;
using testing::TinyModelOptions;
using testing::Tokens;

struct VerifyCase {
  KernelKind kind;
  int tp;
  int page_size;
};

std::unique_ptr<ModelRunner> MakeRunner(const model::ModelWeights& w, const VerifyCase& c) {
  ModelRunnerOptions opt;
  opt.kv.page_size = c.page_size;
  opt.num_pages = 64;
  opt.num_threads = 1;
  opt.kernels = c.kind;
  opt.tensor_parallel_size = c.tp;
  auto r = ModelRunner::Create(w, opt);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

SeqStep StepOf(int64_t id, const std::vector<int32_t>& t, const std::vector<int32_t>& pages,
               int begin, int end, int num_logits) {
  SeqStep s{id, begin, std::span<const int32_t>(t).subspan(begin, end - begin), pages, true};
  s.num_logits = num_logits;
  return s;
}

TEST(SpecRunnerTest, VerifyRowsMatchSingleDecodeSteps) {
  TinyModelOptions o;
  o.heads = 4;
  o.kv_heads = 2;
  auto model = MakeTinyModel(o);
  const int vocab = model->weights.config.vocab_size;
  const std::vector<int32_t> a = Tokens(15, 7, vocab), b = Tokens(9, 8, vocab);
  const std::vector<int32_t> pa = {5, 2, 9, 0, 7, 3, 11, 1, 4, 6, 8, 10, 12, 13, 14, 15};
  const std::vector<int32_t> pb = {20, 17, 19, 18, 16, 21, 22, 23, 24};
  constexpr int kPrompt = 10, kRows = 5;  // a: 10 prompt tokens, then 1 + 4 drafts
  for (const VerifyCase& c :
       {VerifyCase{KernelKind::kReference, 1, 3}, VerifyCase{KernelKind::kFast, 1, 4},
        VerifyCase{KernelKind::kFast, 2, 3}}) {
    SCOPED_TRACE("tp " + std::to_string(c.tp) + " page_size " + std::to_string(c.page_size));
    auto single = MakeRunner(model->weights, c);
    auto verify = MakeRunner(model->weights, c);
    ASSERT_TRUE(single && verify);
    // Oracle: prefill a's prompt, then one decode step per token.
    std::vector<std::vector<float>> want;
    ForwardBatch batch;
    ForwardOutput out;
    batch.seqs = {StepOf(1, a, pa, 0, kPrompt - 1, 1)};
    ASSERT_TRUE(single->Forward(batch, &out).ok());
    for (int p = kPrompt - 1; p < kPrompt - 1 + kRows; ++p) {
      batch.seqs = {StepOf(1, a, pa, p, p + 1, 1)};
      ASSERT_TRUE(single->Forward(batch, &out).ok());
      want.push_back(out.logits[0]);
    }
    const std::vector<float> want_hidden = out.last_hidden[0];
    // Verification: the same prefill, then one step of kRows tokens beside b's prefill.
    batch.seqs = {StepOf(1, a, pa, 0, kPrompt - 1, 1)};
    ASSERT_TRUE(verify->Forward(batch, &out).ok());
    batch.seqs = {StepOf(1, a, pa, kPrompt - 1, kPrompt - 1 + kRows, kRows),
                  StepOf(2, b, pb, 0, 9, 1)};
    ASSERT_TRUE(verify->Forward(batch, &out).ok());
    ASSERT_EQ(out.logits[0].size(), size_t(kRows) * vocab);
    ASSERT_EQ(out.logits[1].size(), size_t(vocab));
    for (int r = 0; r < kRows; ++r) {
      std::vector<float> row(out.logits[0].begin() + r * vocab,
                             out.logits[0].begin() + (r + 1) * vocab);
      EXPECT_LT(RelError(row, want[r]), 1e-4) << "row " << r;
    }
    EXPECT_LT(RelError(out.last_hidden[0], want_hidden), 1e-4);  // the last token's
  }
}

TEST(SpecRunnerTest, RejectsNumLogitsBeyondTheStep) {
  auto model = MakeTinyModel(TinyModelOptions{});
  auto r = MakeRunner(model->weights, VerifyCase{KernelKind::kFast, 1, 4});
  ASSERT_TRUE(r);
  const std::vector<int32_t> t = Tokens(4, 1, model->weights.config.vocab_size);
  const std::vector<int32_t> pages = {0};
  ForwardBatch batch;
  batch.seqs = {StepOf(1, t, pages, 0, 4, 5)};
  ForwardOutput out;
  Status s = r->Forward(batch, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_logits 5"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace pd::engine
