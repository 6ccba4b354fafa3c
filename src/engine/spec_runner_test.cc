// Speculative verification on real models: in the model runner, a step running the last accepted
// token and K drafts with num_logits = K + 1 gives, row by row, the logits that K + 1
// single-token decode steps would (TP 1 and 2, reference and fast kernels, odd page sizes), in a
// mixed batch; through the engine, greedy outputs with n-gram drafts are those without.
#include <gtest/gtest.h>

#include <map>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_model_test_util.h"
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

// Greedy requests on a real model, batched, with and without n-gram speculation: token for token
// the same (TP 1 and 2; dense GQA and MLA/MoE).
std::map<int64_t, std::vector<int32_t>> RunGreedy(const model::ModelWeights& w, int tp,
                                                  const SpeculativeConfig& spec,
                                                  SpecDecodeCounters* counters) {
  EngineOptions eo;
  eo.runner.kv.page_size = 3;
  eo.runner.num_pages = 96;
  eo.runner.num_threads = 1;
  eo.runner.tensor_parallel_size = tp;
  eo.scheduler.max_num_batched_tokens = 24;
  eo.scheduler.max_num_seqs = 4;
  eo.scheduler.max_model_len = 96;
  eo.speculative = spec;
  auto engine = Engine::Create(w, eo);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return {};
  const int vocab = w.config.vocab_size;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.id = i;
    const std::vector<int32_t> unit = Tokens(3 + i, 20 + i, vocab);
    for (int rep = 0; rep < 4; ++rep)
      r.prompt_ids.insert(r.prompt_ids.end(), unit.begin(), unit.end());
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 9 + 2 * i;
    r.sampling.ignore_eos = true;
    EXPECT_TRUE((*engine)->AddRequest(r).ok());
  }
  std::map<int64_t, std::vector<int32_t>> out;
  for (int step = 0; (*engine)->HasWork() && step < 1000; ++step) {
    auto outputs = (*engine)->Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status().ToString();
    if (!outputs.ok()) break;
    for (const RequestOutput& o : *outputs) {
      out[o.request_id].insert(out[o.request_id].end(), o.new_token_ids.begin(),
                               o.new_token_ids.end());
    }
  }
  const EngineStats stats = (*engine)->stats();
  EXPECT_EQ(stats.num_free_pages, stats.num_total_pages);
  *counters = stats.spec_decode;
  return out;
}

TEST(SpecEngineModelTest, GreedyNgramOutputsEqualNoSpeculation) {
  SpeculativeConfig ngram;
  ngram.method = SpecMethod::kNgram;
  ngram.num_speculative_tokens = 3;
  ngram.prompt_lookup_min = 1;
  ngram.prompt_lookup_max = 3;
  auto dense = MakeTinyModel(TinyModelOptions{});
  struct Case {
    const char* name;
    const model::ModelWeights* weights;
    int tp;
  };
  const Case cases[] = {
      {"qwen3 tp1", &dense->weights, 1},
      {"qwen3 tp2", &dense->weights, 2},
      {"deepseek_v3 tp1", &testing::SyntheticTinyModel(model::Arch::kDeepseekV3), 1}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SpecDecodeCounters none, spec;
    const auto want = RunGreedy(*c.weights, c.tp, SpeculativeConfig{}, &none);
    const auto got = RunGreedy(*c.weights, c.tp, ngram, &spec);
    ASSERT_EQ(want.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(got.at(i), want.at(i)) << "request " << i;
      EXPECT_EQ(got.at(i).size(), size_t(9 + 2 * i));
    }
    EXPECT_GT(spec.num_drafts, 0);
    EXPECT_EQ(none.num_drafts, 0);
  }
}

}  // namespace
}  // namespace pd::engine
