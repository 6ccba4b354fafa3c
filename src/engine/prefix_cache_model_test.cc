// The prefix cache on real (synthetic) models: greedy tokens and their logprobs with the cache
// equal those without it, for prompts sharing none, some or all of their pages, whole and chunked,
// under eviction and preemption (a small pool), for a dense model in both KV layouts and an MLA
// model (deepseek_v3, latent pages), at TP 1 and 2.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_model_test_util.h"

namespace pd::engine {
namespace {

struct CacheSetup {
  model::Arch arch = model::Arch::kLlama;
  KvLayout layout = KvLayout::kHND;
  int tp = 1;
  int budget = 512;   // 8: chunked prefill
  int num_pages = 0;  // 0: plenty; small: eviction and preemption
};

constexpr int kPage = 5;

std::unique_ptr<Engine> MakeEngine(const CacheSetup& s, bool cache) {
  EngineOptions o;
  o.runner.kv.layout = s.layout;
  o.runner.kv.page_size = kPage;
  o.runner.num_pages = s.num_pages > 0 ? s.num_pages : 80;
  o.runner.num_threads = 1;
  o.runner.tensor_parallel_size = s.tp;
  o.scheduler.max_num_batched_tokens = s.budget;
  o.scheduler.max_num_seqs = 4;
  o.scheduler.max_model_len = 128;
  o.scheduler.enable_prefix_caching = cache;
  auto engine = Engine::Create(testing::SyntheticTinyModel(s.arch), o);
  PD_CHECK(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

std::vector<int32_t> Tokens(int n, int salt, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + salt * 101 + 3) % vocab;
  return t;
}

struct Run {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  int num_cached_tokens = 0;
};

// Request 0 alone first (it fills the cache), then the others together.
std::map<int64_t, Run> RunRequests(Engine& engine, const std::vector<std::vector<int32_t>>& ps) {
  std::map<int64_t, Run> runs;
  auto step_all = [&] {
    while (engine.HasWork()) {
      auto outputs = engine.Step();
      PD_CHECK(outputs.ok()) << outputs.status().ToString();
      for (const RequestOutput& out : *outputs) {
        EXPECT_NE(out.finish_reason, FinishReason::kError) << out.error.ToString();
        Run& r = runs[out.request_id];
        r.tokens.insert(r.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
        r.logprobs.insert(r.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
        r.num_cached_tokens = out.num_cached_tokens;
      }
    }
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    Request r;
    r.id = static_cast<int64_t>(i);
    r.prompt_ids = ps[i];
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 6;
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 3;
    PD_CHECK(engine.AddRequest(std::move(r)).ok());
    if (i == 0) step_all();
  }
  step_all();
  return runs;
}

class PrefixCacheModelTest : public ::testing::TestWithParam<CacheSetup> {};

TEST_P(PrefixCacheModelTest, TokensAndLogprobsEqualThoseWithoutTheCache) {
  const CacheSetup s = GetParam();
  const int vocab = testing::SyntheticTinyModel(s.arch).config.vocab_size;
  const std::vector<int32_t> head = Tokens(33, 1, vocab);
  std::vector<int32_t> some = std::vector<int32_t>(head.begin(), head.begin() + 17);
  const std::vector<int32_t> tail = Tokens(9, 2, vocab);
  some.insert(some.end(), tail.begin(), tail.end());
  // All pages shared (the same prompt), some (17 tokens: 3 pages), none; and all again.
  const std::vector<std::vector<int32_t>> prompts = {head, head, some, Tokens(21, 3, vocab), head};
  auto with = MakeEngine(s, true);
  auto without = MakeEngine(s, false);
  auto got = RunRequests(*with, prompts);
  auto want = RunRequests(*without, prompts);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_EQ(got[i].tokens, want[i].tokens);
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
    for (size_t t = 0; t < want[i].logprobs.size(); ++t) {
      // Equal up to float summation order: a cached prompt's last token can run alone, whose
      // attention the kernels may split differently.
      EXPECT_NEAR(got[i].logprobs[t].logprob, want[i].logprobs[t].logprob, 1e-4) << "token " << t;
      ASSERT_EQ(got[i].logprobs[t].top.size(), want[i].logprobs[t].top.size());
      for (size_t k = 0; k < want[i].logprobs[t].top.size(); ++k) {
        EXPECT_EQ(got[i].logprobs[t].top[k].first, want[i].logprobs[t].top[k].first);
        EXPECT_NEAR(got[i].logprobs[t].top[k].second, want[i].logprobs[t].top[k].second, 1e-4);
      }
    }
    EXPECT_EQ(want[i].num_cached_tokens, 0);
  }
  if (s.num_pages == 0) {
    EXPECT_EQ(got[1].num_cached_tokens, 30);  // 33 tokens: 6 full pages of 5 before the last
    EXPECT_EQ(got[2].num_cached_tokens, 15);
    EXPECT_EQ(got[3].num_cached_tokens, 0);
  }
  if (s.num_pages > 0 && s.budget > 100) {
    EXPECT_GT(with->stats().num_preemptions, 0);
  }
  EXPECT_GT(with->stats().prefix_cache_hits, 0);
  Status check = with->CheckPages();
  EXPECT_TRUE(check.ok()) << check.ToString();
  EXPECT_EQ(with->stats().num_free_pages, with->stats().num_total_pages);
}

std::string Name(const ::testing::TestParamInfo<CacheSetup>& info) {
  const CacheSetup& s = info.param;
  return std::string(model::ArchName(s.arch)) + "_" + std::string(KvLayoutName(s.layout)) + "_tp" +
         std::to_string(s.tp) + (s.budget < 100 ? "_chunked" : "") +
         (s.num_pages > 0 ? "_tight" : "");
}

INSTANTIATE_TEST_SUITE_P(
    ArchLayoutTp, PrefixCacheModelTest,
    ::testing::Values(CacheSetup{model::Arch::kLlama, KvLayout::kHND, 1, 512, 0},
                      CacheSetup{model::Arch::kLlama, KvLayout::kNHD, 1, 8, 0},
                      CacheSetup{model::Arch::kLlama, KvLayout::kHND, 2, 512, 0},
                      CacheSetup{model::Arch::kLlama, KvLayout::kNHD, 2, 8, 0},
                      // 16 pages of 5: two 39-token requests do not fit together (preemption),
                      // and every new prompt evicts cached pages.
                      CacheSetup{model::Arch::kLlama, KvLayout::kHND, 1, 512, 16},
                      CacheSetup{model::Arch::kLlama, KvLayout::kNHD, 1, 8, 16},
                      CacheSetup{model::Arch::kDeepseekV3, KvLayout::kHND, 1, 512, 0},
                      CacheSetup{model::Arch::kDeepseekV3, KvLayout::kHND, 2, 8, 0},
                      CacheSetup{model::Arch::kDeepseekV3, KvLayout::kHND, 1, 8, 16}),
    Name);

}  // namespace
}  // namespace pd::engine
