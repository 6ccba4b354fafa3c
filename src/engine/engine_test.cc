// Engine step API on a fake ModelRunner (engine_test_util.h): scheduling, paging, sampling and
// request life cycle, independent of the model. engine_model_test.cc runs a real model.
#include "engine/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <tuple>

#include "engine/engine_test_util.h"

namespace pd::engine {
namespace {

using ::pd::engine::testing::FakeEngineOptions;
using ::pd::engine::testing::FakeRunner;
using ::pd::engine::testing::Greedy;
using ::testing::HasSubstr;

struct Result1 {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::kNone;
  int32_t stop_token_id = -1;
  Status error;
  int num_finished_outputs = 0;
};

// Adds one step's outputs; checks each belongs to a live request and each request ends once.
void Collect(std::vector<RequestOutput>& outputs, std::map<int64_t, Result1>* results) {
  for (RequestOutput& out : outputs) {
    Result1& r = (*results)[out.request_id];
    EXPECT_EQ(r.num_finished_outputs, 0) << "output after the final one";
    r.tokens.insert(r.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    EXPECT_EQ(out.num_generated_tokens, static_cast<int>(r.tokens.size()));
    r.logprobs.insert(r.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
    if (out.finished()) {
      r.num_finished_outputs++;
      r.finish = out.finish_reason;
      r.stop_token_id = out.stop_token_id;
      r.error = out.error;
    }
  }
}

// Steps until idle.
std::map<int64_t, Result1> RunAll(Engine& engine, std::map<int64_t, Result1> results = {}) {
  for (int step = 0; engine.HasWork() && step < 100000; ++step) {
    auto outputs = engine.Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status().ToString();
    if (!outputs.ok()) break;
    Collect(*outputs, &results);
  }
  EXPECT_FALSE(engine.HasWork());
  return results;
}

std::unique_ptr<Engine> MakeEngine(const FakeRunner::Options& ro, const EngineOptions& eo) {
  auto engine = Engine::CreateWithRunner(FakeRunner::Make(ro), eo);
  PD_CHECK(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

std::vector<int32_t> PromptOf(int len, int salt, int vocab) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = (i * 7 + salt * 13 + 1) % vocab;
  return p;
}

// (page_size, budget): budget 5 forces chunked prefill with decodes sharing the step.
class EngineBatchTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(EngineBatchTest, GreedyTokensAreTheSameAloneOrBatched) {
  auto [page_size, budget] = GetParam();
  FakeRunner::Options ro;
  ro.page_size = page_size;
  ro.num_pages = 400 / page_size + 8;
  const int lengths[8] = {1, 5, 17, 9, 33, 2, 12, 26};
  const int max_tokens[8] = {7, 12, 3, 9, 5, 11, 1, 6};
  std::vector<std::vector<int32_t>> expect(8);
  for (int i = 0; i < 8; ++i) {
    expect[i] = FakeRunner::GreedyOracle(PromptOf(lengths[i], i, ro.vocab_size), ro.vocab_size,
                                         max_tokens[i]);
  }
  {  // one request alone
    auto engine = MakeEngine(ro, FakeEngineOptions(budget, 5));
    ASSERT_TRUE(engine->AddRequest(Greedy(4, PromptOf(lengths[4], 4, 64), max_tokens[4])).ok());
    auto results = RunAll(*engine);
    EXPECT_EQ(results[4].tokens, expect[4]);
    EXPECT_EQ(results[4].finish, FinishReason::kLength);
  }
  auto engine = MakeEngine(ro, FakeEngineOptions(budget, 5));
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(engine->AddRequest(Greedy(i, PromptOf(lengths[i], i, 64), max_tokens[i])).ok());
  }
  auto results = RunAll(*engine);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(results[i].tokens, expect[i]) << "request " << i;
    EXPECT_EQ(results[i].num_finished_outputs, 1);
    EXPECT_EQ(results[i].finish, FinishReason::kLength);
  }
  EXPECT_EQ(engine->stats().num_free_pages, engine->stats().num_total_pages);
  auto& runner = static_cast<FakeRunner&>(engine->runner());
  EXPECT_LE(runner.max_seq_tokens_in_a_step(), budget);
}

INSTANTIATE_TEST_SUITE_P(PageSizesAndBudgets, EngineBatchTest,
                         ::testing::Combine(::testing::Values(1, 3, 16),
                                            ::testing::Values(5, 512)));

TEST(EngineTest, PreemptionUnderATinyPoolKeepsGreedyTokens) {
  FakeRunner::Options ro;
  ro.page_size = 3;
  ro.num_pages = 12;  // 36 tokens for 6 requests of up to 30
  auto engine = MakeEngine(ro, FakeEngineOptions(16, 8));
  std::vector<std::vector<int32_t>> expect;
  for (int i = 0; i < 6; ++i) {
    auto prompt = PromptOf(4 + 3 * i, i, ro.vocab_size);
    expect.push_back(FakeRunner::GreedyOracle(prompt, ro.vocab_size, 12));
    ASSERT_TRUE(engine->AddRequest(Greedy(i, prompt, 12)).ok());
  }
  auto results = RunAll(*engine);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(results[i].tokens, expect[i]) << "request " << i;
  EXPECT_GT(engine->stats().num_preemptions, 0);
  EXPECT_EQ(engine->stats().num_free_pages, 12);
}

TEST(EngineTest, SeededSamplingIsTheSameAloneOrBatched) {
  FakeRunner::Options ro;
  auto run = [&](bool batched) {
    auto engine = MakeEngine(ro, FakeEngineOptions(7, 6));
    for (int i = 0; i < (batched ? 6 : 1); ++i) {
      Request r = Greedy(i == 0 ? 100 : i, PromptOf(3 + 4 * i, i + 5, ro.vocab_size), 20);
      r.sampling.temperature = 1.5f;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = 1000 + i;
      EXPECT_TRUE(engine->AddRequest(r).ok());
    }
    return RunAll(*engine)[100].tokens;
  };
  std::vector<int32_t> alone = run(false);
  EXPECT_EQ(alone.size(), 20u);
  EXPECT_EQ(alone, run(true));
}

TEST(EngineTest, StopTokensEosAndIgnoreEos) {
  FakeRunner::Options ro;
  auto prompt = PromptOf(6, 1, ro.vocab_size);
  auto free_run = FakeRunner::GreedyOracle(prompt, ro.vocab_size, 10);
  ro.eos_token_id = free_run[3];  // the 4th greedy token is "eos"
  auto engine = MakeEngine(ro, FakeEngineOptions());
  ASSERT_TRUE(engine->AddRequest(Greedy(1, prompt, 10)).ok());
  Request ignore = Greedy(2, prompt, 10);
  ignore.sampling.ignore_eos = true;
  ASSERT_TRUE(engine->AddRequest(ignore).ok());
  Request stop = Greedy(3, prompt, 10);
  stop.sampling.ignore_eos = true;
  stop.sampling.stop_token_ids = {free_run[5]};
  ASSERT_TRUE(engine->AddRequest(stop).ok());
  auto results = RunAll(*engine);
  int eos_at = static_cast<int>(std::find(free_run.begin(), free_run.end(), ro.eos_token_id) -
                                free_run.begin());
  EXPECT_EQ(results[1].finish, FinishReason::kStop);
  EXPECT_EQ(results[1].stop_token_id, ro.eos_token_id);
  EXPECT_EQ(results[1].tokens,
            std::vector<int32_t>(free_run.begin(), free_run.begin() + eos_at + 1));
  EXPECT_EQ(results[2].finish, FinishReason::kLength);
  EXPECT_EQ(results[2].tokens, free_run);
  int stop_at =
      static_cast<int>(std::find(free_run.begin(), free_run.end(), free_run[5]) - free_run.begin());
  EXPECT_EQ(results[3].finish, FinishReason::kStop);
  EXPECT_EQ(results[3].stop_token_id, free_run[5]);
  EXPECT_EQ(results[3].tokens.size(), static_cast<size_t>(stop_at + 1));
}

TEST(EngineTest, LogprobsMatchTheLogitsOfEachStep) {
  FakeRunner::Options ro;
  auto engine = MakeEngine(ro, FakeEngineOptions(4));
  auto prompt = PromptOf(9, 2, ro.vocab_size);
  Request r = Greedy(1, prompt, 5);
  r.sampling.logprobs = 3;
  ASSERT_TRUE(engine->AddRequest(r).ok());
  auto results = RunAll(*engine);
  ASSERT_EQ(results[1].logprobs.size(), 5u);
  std::vector<int32_t> context = prompt;
  std::vector<float> logits;
  for (int i = 0; i < 5; ++i) {
    FakeRunner::LogitsFor(FakeRunner::ContextHash(context), ro.vocab_size, &logits);
    const TokenLogprob& lp = results[1].logprobs[i];
    EXPECT_EQ(lp.token_id, results[1].tokens[i]);
    double lse = 0;
    float max = *std::max_element(logits.begin(), logits.end());
    for (float x : logits) lse += std::exp(x - max);
    lse = max + std::log(lse);
    EXPECT_NEAR(lp.logprob, logits[lp.token_id] - lse, 1e-5);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, lp.token_id);  // greedy: the best is the chosen one
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
    EXPECT_GE(lp.top[1].second, lp.top[2].second);
    context.push_back(lp.token_id);
  }
}

TEST(EngineTest, NoLogprobsUnlessAsked) {
  FakeRunner::Options ro;
  auto engine = MakeEngine(ro, FakeEngineOptions());
  ASSERT_TRUE(engine->AddRequest(Greedy(1, PromptOf(3, 1, 64), 3)).ok());
  auto results = RunAll(*engine);
  EXPECT_EQ(results[1].tokens.size(), 3u);
  EXPECT_TRUE(results[1].logprobs.empty());
}

TEST(EngineTest, AbortFreesPagesAtOnceAndReportsAtTheNextStep) {
  FakeRunner::Options ro;
  ro.page_size = 2;
  auto engine = MakeEngine(ro, FakeEngineOptions(8));
  ASSERT_TRUE(engine->AddRequest(Greedy(1, PromptOf(6, 1, 64), 50)).ok());
  ASSERT_TRUE(engine->AddRequest(Greedy(2, PromptOf(6, 2, 64), 4)).ok());
  ASSERT_TRUE(engine->AddRequest(Greedy(3, PromptOf(30, 3, 64), 4)).ok());  // still waiting
  std::map<int64_t, Result1> results;
  for (int i = 0; i < 3; ++i) {
    auto outputs = engine->Step();
    ASSERT_TRUE(outputs.ok());
    Collect(*outputs, &results);
  }
  const int free_before = engine->stats().num_free_pages;
  engine->Abort(1);
  EXPECT_GT(engine->stats().num_free_pages, free_before);
  engine->Abort(3);
  engine->Abort(42);  // unknown: ignored
  auto outputs = engine->Step();
  ASSERT_TRUE(outputs.ok());
  Collect(*outputs, &results);
  EXPECT_EQ(results[1].finish, FinishReason::kAbort);
  EXPECT_EQ(results[1].tokens.size(), 3u);  // what it had before the abort
  EXPECT_EQ(results[3].finish, FinishReason::kAbort);
  EXPECT_TRUE(results[3].tokens.empty());
  EXPECT_EQ(results.count(42), 0u);
  engine->Abort(1);  // already gone: no second final output (Collect checks)
  results = RunAll(*engine, std::move(results));
  EXPECT_EQ(results[2].finish, FinishReason::kLength);
  EXPECT_EQ(results[2].tokens, FakeRunner::GreedyOracle(PromptOf(6, 2, 64), 64, 4));
  EXPECT_EQ(engine->stats().num_free_pages, engine->stats().num_total_pages);
}

TEST(EngineTest, AForwardFailureEndsTheBatchWithErrorAndTheEngineGoesOn) {
  FakeRunner::Options ro;
  ro.fail_on_step = 1;
  auto engine = MakeEngine(ro, FakeEngineOptions());
  ASSERT_TRUE(engine->AddRequest(Greedy(1, PromptOf(3, 1, 64), 5)).ok());
  ASSERT_TRUE(engine->AddRequest(Greedy(2, PromptOf(4, 2, 64), 5)).ok());
  auto results = RunAll(*engine);
  for (int64_t id : {1, 2}) {
    EXPECT_EQ(results[id].finish, FinishReason::kError);
    EXPECT_THAT(results[id].error.message(), HasSubstr("injected forward failure"));
  }
  EXPECT_EQ(engine->stats().num_free_pages, engine->stats().num_total_pages);
  ASSERT_TRUE(engine->AddRequest(Greedy(3, PromptOf(3, 1, 64), 5)).ok());
  results = RunAll(*engine);
  EXPECT_EQ(results[3].finish, FinishReason::kLength);
  EXPECT_EQ(results[3].tokens, FakeRunner::GreedyOracle(PromptOf(3, 1, 64), 64, 5));
}

TEST(EngineTest, InvalidRequestsNameTheFieldAndValue) {
  FakeRunner::Options ro;
  ro.num_pages = 64;
  ro.page_size = 4;
  auto engine = MakeEngine(ro, FakeEngineOptions());  // max_model_len 256, 256 cache tokens
  struct Case {
    Request request;
    std::vector<std::string> want;
  };
  auto base = [] { return Greedy(1, {1, 2, 3}, 4); };
  std::vector<Case> cases;
  cases.push_back({Greedy(1, {}, 4), {"prompt_ids", "empty"}});
  cases.push_back({Greedy(1, {1, 64, 2}, 4), {"prompt_ids[1] = 64", "vocabulary"}});
  cases.push_back({Greedy(1, {-3}, 4), {"prompt_ids[0] = -3"}});
  cases.push_back({Greedy(1, std::vector<int32_t>(250, 1), 10),
                   {"max_tokens (10)", "260", "max_model_len 256"}});
  Request r = base();
  r.sampling.temperature = -1.0f;
  cases.push_back({r, {"temperature", "-1"}});
  r = base();
  r.sampling.top_p = 1.5f;
  cases.push_back({r, {"top_p", "1.5"}});
  r = base();
  r.sampling.top_p = 0.0f;
  cases.push_back({r, {"top_p", "0"}});
  r = base();
  r.sampling.max_tokens = 0;
  cases.push_back({r, {"max_tokens", "0"}});
  r = base();
  r.sampling.logprobs = 21;
  cases.push_back({r, {"logprobs", "21"}});
  for (const Case& c : cases) {
    Status s = engine->AddRequest(c.request);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    for (const std::string& w : c.want) EXPECT_THAT(s.message(), HasSubstr(w));
    EXPECT_EQ(engine->ValidateRequest(c.request).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(engine->HasWork());
  ASSERT_TRUE(engine->AddRequest(base()).ok());
  EXPECT_EQ(engine->AddRequest(base()).code(), StatusCode::kAlreadyExists);
}

TEST(EngineTest, ARequestLargerThanTheCacheIsRefused) {
  FakeRunner::Options ro;
  ro.num_pages = 4;
  ro.page_size = 4;  // 16 tokens
  auto engine = MakeEngine(ro, FakeEngineOptions());
  Status s = engine->AddRequest(Greedy(1, PromptOf(10, 1, 64), 7));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("max_tokens (7)"));
  EXPECT_THAT(s.message(), HasSubstr("5 KV pages"));
  EXPECT_TRUE(engine->AddRequest(Greedy(1, PromptOf(10, 1, 64), 6)).ok());
}

TEST(EngineTest, BadSchedulerOptionsAreRefused) {
  FakeRunner::Options ro;
  EngineOptions eo = FakeEngineOptions();
  eo.scheduler.enable_chunked_prefill = false;
  eo.scheduler.max_num_batched_tokens = 100;  // < max_model_len 256
  auto engine = Engine::CreateWithRunner(FakeRunner::Make(ro), eo);
  ASSERT_FALSE(engine.ok());
  EXPECT_THAT(engine.status().message(), HasSubstr("max_num_batched_tokens"));
  eo = FakeEngineOptions(8, 16);  // budget below max_num_seqs
  engine = Engine::CreateWithRunner(FakeRunner::Make(ro), eo);
  ASSERT_FALSE(engine.ok());
  EXPECT_THAT(engine.status().message(), HasSubstr("max_num_seqs"));
  EXPECT_FALSE(Engine::CreateWithRunner(nullptr, FakeEngineOptions()).ok());
}

TEST(EngineTest, WithoutChunkingPromptsRunWhole) {
  FakeRunner::Options ro;
  EngineOptions eo = FakeEngineOptions(256, 4);
  eo.scheduler.enable_chunked_prefill = false;
  auto engine = MakeEngine(ro, eo);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(engine->AddRequest(Greedy(i, PromptOf(40 + i, i, 64), 3)).ok());
  }
  auto results = RunAll(*engine);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(results[i].tokens, FakeRunner::GreedyOracle(PromptOf(40 + i, i, 64), 64, 3));
  }
}

TEST(EngineTest, OutputsCarryTimesFromTheInjectedClock) {
  FakeRunner::Options ro;
  SimClock clock;
  clock.Set(10.0);
  EngineOptions eo = FakeEngineOptions();
  eo.clock = &clock;
  auto engine = MakeEngine(ro, eo);
  Request r = Greedy(1, PromptOf(3, 1, 64), 2);
  r.arrival_time = 9.0;
  ASSERT_TRUE(engine->AddRequest(r).ok());
  clock.Set(12.5);
  auto outputs = engine->Step();
  ASSERT_TRUE(outputs.ok());
  ASSERT_EQ(outputs->size(), 1u);
  EXPECT_DOUBLE_EQ((*outputs)[0].first_scheduled_time, 12.5);
  EXPECT_EQ((*outputs)[0].num_prompt_tokens, 3);
  EXPECT_EQ((*outputs)[0].num_generated_tokens, 1);
  clock.Set(13.0);
  outputs = engine->Step();
  ASSERT_TRUE(outputs.ok());
  EXPECT_DOUBLE_EQ((*outputs)[0].first_scheduled_time, 12.5);
  EXPECT_TRUE((*outputs)[0].finished());
}

TEST(EngineTest, StatsCountRunningWaitingAndPages) {
  FakeRunner::Options ro;
  ro.page_size = 4;
  ro.num_pages = 32;
  auto engine = MakeEngine(ro, FakeEngineOptions(8, 2));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine->AddRequest(Greedy(i, {1, 2, 3}, 5)).ok());
  EXPECT_EQ(engine->stats().num_waiting, 3);
  ASSERT_TRUE(engine->Step().ok());
  EngineStats s = engine->stats();
  EXPECT_EQ(s.num_running, 2);
  EXPECT_EQ(s.num_waiting, 1);
  EXPECT_EQ(s.num_total_pages, 32);
  EXPECT_EQ(s.num_free_pages, 30);
  EXPECT_NEAR(s.kv_cache_usage(), 2.0 / 32, 1e-12);
}

}  // namespace
}  // namespace pd::engine
