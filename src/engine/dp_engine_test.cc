// The data-parallel engine (dp_engine.h) against DP 1 on tiny deepseek_v3 models: the same greedy
// tokens and logprobs for every request, with ranks that hold requests and ranks that only serve
// their experts, chunked and whole prefill, page sizes 1 and 4; refusals; aborts; prefill-only
// requests (a DP prefill instance) in their rank's pages.
#include "engine/dp_engine.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/disagg_hooks.h"
#include "engine/engine.h"
#include "engine/mla_test_util.h"
#include "engine/moe_test_util.h"

namespace pd::engine {
namespace {

using testing::MakeTinyMlaModel;
using testing::TinyMlaOptions;
using testing::Tokens;

struct DpRun {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, std::vector<float>> logprobs;  // the chosen tokens'
  SpecDecodeCounters spec_decode;                  // the engine's stats at the end
};

EngineOptions Options(int budget, int page_size, const SpeculativeConfig& spec = {}) {
  EngineOptions o;
  o.speculative = spec;
  o.runner.kv.page_size = page_size;
  o.runner.num_pages = 160 / page_size;  // per rank
  o.runner.num_threads = 1;
  o.scheduler.max_num_batched_tokens = budget;
  o.scheduler.max_num_seqs = 4;
  o.scheduler.max_model_len = 128;
  return o;
}

Request MakeRequest(int64_t id, int len, int max_tokens, int vocab) {
  Request r;
  r.id = id;
  r.prompt_ids = Tokens(len, static_cast<int>(id) + 4, vocab);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.logprobs = 2;
  return r;
}

// Five requests through an engine of `dp` ranks, added at once and then one more after a few
// steps (so it goes to the least loaded rank while the others run).
DpRun Generate(const model::ModelWeights& w, int dp, int budget, int page_size,
               const SpeculativeConfig& spec = {}) {
  auto engine = dp == 1 ? Engine::Create(w, Options(budget, page_size, spec))
                        : CreateDpEngine(w, Options(budget, page_size, spec), dp);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return {};
  const int lengths[6] = {13, 5, 21, 2, 9, 7}, max_tokens[6] = {8, 10, 6, 9, 3, 5};
  for (int i = 0; i < 5; ++i)
    EXPECT_TRUE((*engine)->AddRequest(MakeRequest(i, lengths[i], max_tokens[i], 67)).ok());
  DpRun run;
  for (int step = 0; (*engine)->HasWork(); ++step) {
    if (step == 3) {
      EXPECT_TRUE((*engine)->AddRequest(MakeRequest(5, lengths[5], 5, 67)).ok());
    }
    auto outputs = (*engine)->Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status().ToString();
    if (!outputs.ok()) break;
    for (const RequestOutput& out : *outputs) {
      EXPECT_EQ(out.error.ok(), true) << out.error.ToString();
      auto& t = run.tokens[out.request_id];
      t.insert(t.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      for (const TokenLogprob& lp : out.logprobs)
        run.logprobs[out.request_id].push_back(lp.logprob);
    }
  }
  const EngineStats stats = (*engine)->stats();
  EXPECT_EQ(stats.num_free_pages, stats.num_total_pages) << "dp " << dp;
  EXPECT_EQ(stats.num_total_pages, dp * (160 / page_size));
  EXPECT_TRUE((*engine)->CheckPages().ok());
  run.spec_decode = stats.spec_decode;
  return run;
}

std::unique_ptr<testing::TinyModel> Model(int q_lora, bool yarn, bool moe) {
  TinyMlaOptions o;
  o.heads = 8;
  o.layers = 3;
  o.q_lora_rank = q_lora;
  o.dtype = model::DType::kBF16;
  o.yarn = yarn;
  auto m = MakeTinyMlaModel(o);
  if (moe) {  // deepseek_v3's grouped sigmoid routing, a shared expert, layers 1.. MoE
    model::MoeConfig c;
    c.scoring = model::MoeConfig::Scoring::kSigmoid;
    c.num_experts = 8, c.num_experts_per_tok = 2, c.moe_intermediate_size = 12;
    c.n_group = 4, c.topk_group = 2, c.n_shared_experts = 1, c.first_k_dense_replace = 1;
    c.norm_topk_prob = true, c.routed_scaling_factor = 2.5;
    testing::AddMoeLayers(m.get(), c, 5);
  }
  return m;
}

void ExpectSameRun(const DpRun& got, const DpRun& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (const auto& [id, lps] : want.logprobs) {
    const std::vector<float>& g = got.logprobs.at(id);
    ASSERT_EQ(g.size(), lps.size()) << what << " request " << id;
    for (size_t i = 0; i < lps.size(); ++i)
      EXPECT_NEAR(g[i], lps[i], 1e-5) << what << " request " << id << " token " << i;
  }
}

TEST(DpEngineTest, TokensAndLogprobsEqualDp1) {
  struct Shape {
    int q_lora;
    bool yarn, moe;
  };
  for (const Shape& shape :
       {Shape{0, false, true}, Shape{16, true, true}, Shape{16, true, false}}) {
    auto m = Model(shape.q_lora, shape.yarn, shape.moe);
    for (int page_size : {1, 4}) {
      const DpRun want = Generate(m->weights, 1, 512, page_size);
      ASSERT_EQ(want.tokens.size(), 6u);
      EXPECT_NE(want.tokens.at(0), want.tokens.at(1)) << "tokens should depend on the prompt";
      for (int dp : {2, 4})
        for (int budget : {6, 512})
          ExpectSameRun(Generate(m->weights, dp, budget, page_size), want,
                        "q_lora " + std::to_string(shape.q_lora) + " moe " +
                            std::to_string(shape.moe) + " dp " + std::to_string(dp) + " budget " +
                            std::to_string(budget) + " page_size " + std::to_string(page_size));
    }
  }
}

// With n-gram speculation every request's tokens are those without it, and the instance's
// spec_decode counters are the sum of its ranks': each request drafts and accepts as it would on
// DP 1, so the totals equal DP 1's.
TEST(DpEngineTest, SpeculativeCountersSumOverRanks) {
  auto m = Model(0, false, true);
  SpeculativeConfig ngram;
  ngram.method = SpecMethod::kNgram;
  ngram.num_speculative_tokens = 3;
  ngram.prompt_lookup_min = 1;
  ngram.prompt_lookup_max = 2;
  const DpRun plain = Generate(m->weights, 1, 512, 4);
  const DpRun want = Generate(m->weights, 1, 512, 4, ngram);
  EXPECT_EQ(want.tokens, plain.tokens);
  ASSERT_GT(want.spec_decode.num_drafts, 0) << "the prompts should give n-gram drafts";
  ASSERT_EQ(want.spec_decode.accepted_per_pos.size(), 3u);
  for (int dp : {2, 4}) {
    const DpRun got = Generate(m->weights, dp, 512, 4, ngram);
    const std::string what = "dp " + std::to_string(dp);
    EXPECT_EQ(got.tokens, plain.tokens) << what;
    EXPECT_EQ(got.spec_decode.num_drafts, want.spec_decode.num_drafts) << what;
    EXPECT_EQ(got.spec_decode.num_draft_tokens, want.spec_decode.num_draft_tokens) << what;
    EXPECT_EQ(got.spec_decode.num_accepted_tokens, want.spec_decode.num_accepted_tokens) << what;
    EXPECT_EQ(got.spec_decode.accepted_per_pos, want.spec_decode.accepted_per_pos) << what;
  }
}

TEST(DpEngineTest, RequestsGoToTheLeastLoadedRankAndAbortFreesTheirPages) {
  auto m = Model(0, false, true);
  auto engine = CreateDpEngine(m->weights, Options(512, 4), 2);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(DataParallelSize((*engine)->runner()), 2);
  Engine& e = **engine;
  const int per_rank = e.stats().num_total_pages / 2;
  // Two long requests: one per rank, so each rank's pool holds one request's pages.
  ASSERT_TRUE(e.AddRequest(MakeRequest(1, 40, 20, 67)).ok());
  ASSERT_TRUE(e.AddRequest(MakeRequest(2, 40, 20, 67)).ok());
  ASSERT_TRUE(e.Step().ok());
  EXPECT_EQ(e.stats().num_running, 2);
  const int free_before = e.stats().num_free_pages;
  EXPECT_LE(free_before, 2 * per_rank - 2 * 10) << "40 prompt tokens: 10 pages each";
  EXPECT_EQ(e.AddRequest(MakeRequest(1, 4, 2, 67)).code(), StatusCode::kAlreadyExists);
  e.Abort(1);
  auto outputs = e.Step();
  ASSERT_TRUE(outputs.ok());
  bool aborted = false;
  for (const RequestOutput& out : *outputs)
    aborted = aborted || (out.request_id == 1 && out.finish_reason == FinishReason::kAbort);
  EXPECT_TRUE(aborted);
  EXPECT_EQ(e.stats().num_running, 1);
  EXPECT_GE(e.stats().num_free_pages, free_before + 10 - 1) << "request 1's pages are free";
  // Rank 0 is now the less loaded: the next request goes there and rank 1 keeps serving.
  ASSERT_TRUE(e.AddRequest(MakeRequest(3, 4, 2, 67)).ok());
  while (e.HasWork()) ASSERT_TRUE(e.Step().ok());
  EXPECT_EQ(e.stats().num_free_pages, e.stats().num_total_pages);
  EXPECT_TRUE(e.CheckPages().ok());
}

// Prefill-only requests (a prefill instance of DP ranks): one per rank, each computed in its
// rank's pages, which the step observer and the PrefillResult name by DpPageId (the observer's
// runner_step that rank's own step count, its progress DpRankProgress); the kept pages go back
// through ReleasePages.
TEST(DpEngineTest, PrefillOnlyRequestsRunOnTheirRankAndNameItsPagesByDpPageId) {
  auto m = Model(0, false, true);
  auto engine = CreateDpEngine(m->weights, Options(8, 4), 2);  // 13 tokens: two chunks
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  DisaggHooks* hooks = e.disagg_hooks();
  ASSERT_NE(hooks, nullptr);
  const int32_t per_rank = e.runner().region().num_pages();
  std::map<int64_t, int> rank_of;                 // request -> its chunks' rank
  std::map<int, std::vector<uint64_t>> steps_of;  // rank -> runner_step of its steps
  hooks->SetStepObserver([&](const StepInfo& info) {
    for (const PrefillChunk& c : info.prefill_chunks) {
      ASSERT_FALSE(c.page_table.empty());
      const int r = DpRankOfPage(c.page_table[0], per_rank);
      for (int32_t p : c.page_table) EXPECT_EQ(DpRankOfPage(p, per_rank), r) << "page " << p;
      auto [it, fresh] = rank_of.emplace(c.request_id, r);
      EXPECT_EQ(it->second, r) << "request " << c.request_id << " moved rank";
      if (c.request_id == 1 || fresh) steps_of[r].push_back(info.runner_step);
    }
  });
  ASSERT_TRUE(hooks->AddPrefillOnlyRequest(MakeRequest(1, 13, 1, 67)).ok());
  ASSERT_TRUE(hooks->AddPrefillOnlyRequest(MakeRequest(2, 5, 1, 67)).ok());
  std::map<int64_t, std::vector<int32_t>> kept;
  while (e.HasWork()) {
    auto outputs = e.Step();
    ASSERT_TRUE(outputs.ok()) << outputs.status().ToString();
    for (const RequestOutput& out : *outputs)
      if (out.prefill_result != nullptr) kept[out.request_id] = out.prefill_result->page_table;
  }
  ASSERT_EQ(rank_of.size(), 2u);
  EXPECT_NE(rank_of[1], rank_of[2]) << "one request per rank";
  EXPECT_EQ(steps_of[rank_of[1]], (std::vector<uint64_t>{0, 1}));  // its rank's steps 0 and 1
  EXPECT_EQ(steps_of[rank_of[2]], (std::vector<uint64_t>{0}));
  // Rank 2's runner computed one step (request 2's), rank 1's two: each bumps its own progress.
  EXPECT_EQ(DpRankProgress(e.runner(), rank_of[2]).Value(), 1u * m->weights.config.num_layers);
  EXPECT_EQ(DpRankProgress(e.runner(), rank_of[1]).Value(), 2u * m->weights.config.num_layers);
  ASSERT_EQ(kept.size(), 2u);
  for (const auto& [id, pages] : kept) {
    EXPECT_EQ(pages.size(), id == 1 ? 4u : 2u);
    for (int32_t p : pages) EXPECT_EQ(DpRankOfPage(p, per_rank), rank_of[id]) << "page " << p;
    hooks->ReleasePages(pages);
  }
  EXPECT_EQ(e.stats().num_free_pages, e.stats().num_total_pages);
  EXPECT_TRUE(e.CheckPages().ok());
}

TEST(DpEngineTest, RefusesNonMlaModelsAndTensorParallelRanks) {
  auto qwen = testing::MakeTinyModel(testing::TinyModelOptions{});
  auto r = CreateDpEngine(qwen->weights, Options(512, 4), 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("data_parallel_size 2: data-parallel attention is for MLA"),
            std::string::npos)
      << r.status().ToString();
  auto m = Model(0, false, false);
  EngineOptions o = Options(512, 4);
  o.runner.tensor_parallel_size = 2;
  r = CreateDpEngine(m->weights, o, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor_parallel_size 2"), std::string::npos)
      << r.status().ToString();
  auto tp1 = Engine::Create(m->weights, Options(512, 4));
  ASSERT_TRUE(tp1.ok());
  EXPECT_EQ(DataParallelSize((*tp1)->runner()), 1);
}

}  // namespace
}  // namespace pd::engine
