// The prefix cache in the Engine, on the fake runner (engine_test_util.h), whose logits hash the
// whole context as read back through the page table: a shared page holding anything but the
// request's own earlier tokens changes its tokens. Prompts sharing none, some or all of their
// pages; eviction pressure; chunked prefill; preemption; cancellations; prefill-only and
// remote-KV requests; and the page recount after all of it.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace pd::engine {
namespace {

using ::pd::engine::testing::FakeEngineOptions;
using ::pd::engine::testing::FakeRunner;

constexpr int kVocab = 64;

struct Outcome {
  std::vector<int32_t> tokens;
  int num_cached_tokens = -1;
  FinishReason finish = FinishReason::kNone;
};

std::unique_ptr<Engine> MakeEngine(int page_size, int num_pages, int budget, bool cache,
                                   int max_seqs = 8) {
  FakeRunner::Options ro;
  ro.vocab_size = kVocab;
  ro.page_size = page_size;
  ro.num_pages = num_pages;
  EngineOptions eo = FakeEngineOptions(budget, max_seqs);
  eo.scheduler.enable_prefix_caching = cache;
  auto engine = Engine::CreateWithRunner(FakeRunner::Make(ro), eo);
  PD_CHECK(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

// `shared` tokens common to every prompt of a family, then `own` tokens of its own.
std::vector<int32_t> Prompt(int shared, int own, int family, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < shared; ++i) p.push_back((i * 5 + family * 11 + 3) % kVocab);
  for (int i = 0; i < own; ++i) p.push_back((i * 3 + salt * 17 + 1) % kVocab);
  return p;
}

// Greedy, with logprobs (the chosen token's and the top 2) requested as well.
Request Greedy(int64_t id, std::vector<int32_t> prompt, int max_tokens) {
  Request r = testing::Greedy(id, std::move(prompt), max_tokens);
  r.sampling.logprobs = 2;
  return r;
}

void Collect(const std::vector<RequestOutput>& outputs, std::map<int64_t, Outcome>* out) {
  for (const RequestOutput& o : outputs) {
    Outcome& r = (*out)[o.request_id];
    r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    if (!o.new_token_ids.empty() || o.finished()) r.num_cached_tokens = o.num_cached_tokens;
    if (o.finished()) r.finish = o.finish_reason;
  }
}

std::map<int64_t, Outcome> RunAll(Engine& engine, std::map<int64_t, Outcome> out = {}) {
  for (int step = 0; engine.HasWork() && step < 100000; ++step) {
    auto outputs = engine.Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status().ToString();
    if (!outputs.ok()) break;
    Collect(*outputs, &out);
  }
  return out;
}

// Every page free or cached-evictable, and the recount agrees.
void ExpectAllPagesBack(const Engine& engine) {
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.num_free_pages, s.num_total_pages);
  EXPECT_EQ(s.num_running + s.num_waiting, 0);
  Status check = engine.CheckPages();
  EXPECT_TRUE(check.ok()) << check.ToString();
}

TEST(PrefixCacheEngineTest, PromptsSharingNoneSomeOrAllPagesGetTheOracleTokens) {
  constexpr int kPage = 4;
  auto engine = MakeEngine(kPage, 64, 64, true);
  // Request 0 fills the cache; then, one at a time: all pages shared (same prompt), some shared
  // (same 10-token head: 2 full pages), none shared (another family), the same prompt again.
  const std::vector<std::vector<int32_t>> prompts = {Prompt(10, 5, 0, 0), Prompt(10, 5, 0, 0),
                                                     Prompt(10, 7, 0, 1), Prompt(10, 5, 1, 0),
                                                     Prompt(10, 5, 0, 0), Prompt(12, 0, 0, 0)};
  const std::vector<int> want_cached = {0, 12, 8, 0, 12, 8};  // 12 of 12: the last token runs
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(engine->AddRequest(Greedy(i, prompts[i], 6)).ok());
    auto out = RunAll(*engine);
    EXPECT_EQ(out[i].tokens, FakeRunner::GreedyOracle(prompts[i], kVocab, 6)) << "request " << i;
    EXPECT_EQ(out[i].num_cached_tokens, want_cached[i]) << "request " << i;
  }
  const EngineStats s = engine->stats();
  int64_t queried = 0;
  for (const auto& p : prompts) queried += static_cast<int64_t>(p.size());
  EXPECT_EQ(s.prefix_cache_queries, queried);
  EXPECT_EQ(s.prefix_cache_hits, 12 + 8 + 12 + 8);
  ExpectAllPagesBack(*engine);
  EXPECT_GT(s.num_cached_pages, 0);
}

TEST(PrefixCacheEngineTest, AWholePagePromptStillComputesItsLastToken) {
  constexpr int kPage = 4;
  auto engine = MakeEngine(kPage, 16, 64, true);
  const auto p = Prompt(8, 0, 2, 0);  // exactly 2 pages
  ASSERT_TRUE(engine->AddRequest(Greedy(1, p, 3)).ok());
  RunAll(*engine);
  ASSERT_TRUE(engine->AddRequest(Greedy(2, p, 3)).ok());
  auto out = RunAll(*engine);
  EXPECT_EQ(out[2].num_cached_tokens, 4) << "the second page holds the last token, which runs";
  EXPECT_EQ(out[2].tokens, FakeRunner::GreedyOracle(p, kVocab, 3));
  ExpectAllPagesBack(*engine);
}

TEST(PrefixCacheEngineTest, WithTheCacheOffNothingIsReusedAndTokensAreTheSame) {
  auto on = MakeEngine(3, 64, 64, true);
  auto off = MakeEngine(3, 64, 64, false);
  for (int64_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(on->AddRequest(Greedy(i, Prompt(9, 4, 0, i), 5)).ok());
    ASSERT_TRUE(off->AddRequest(Greedy(i, Prompt(9, 4, 0, i), 5)).ok());
  }
  auto a = RunAll(*on), b = RunAll(*off);
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(b[i].num_cached_tokens, 0);
  }
  EXPECT_EQ(off->stats().num_cached_pages, 0);
  EXPECT_EQ(off->stats().prefix_cache_queries, 0);
  ExpectAllPagesBack(*off);
}

// Five families of shared prefixes, 40 requests in waves of 8 through a pool of 40 pages (about
// four requests' worth: cached pages are evicted all along), chunked (budget 7) or whole (budget
// 64, where a wave preempts).
TEST(PrefixCacheEngineTest, EvictionPressureChunksAndPreemptionKeepTheOracleTokens) {
  for (const int budget : {7, 64}) {
    constexpr int kPage = 3;
    auto engine = MakeEngine(kPage, 40, budget, true, 6);
    std::map<int64_t, std::vector<int32_t>> prompts;
    std::map<int64_t, Outcome> out;
    for (int64_t i = 0; i < 40; ++i) {  // in waves of 8: later waves find earlier ones' pages
      prompts[i] = Prompt(8 + static_cast<int>(i % 3) * 4, 3 + static_cast<int>(i % 4),
                          static_cast<int>(i % 5), static_cast<int>(i / 5));
      ASSERT_TRUE(engine->AddRequest(Greedy(i, prompts[i], 4 + static_cast<int>(i % 6))).ok());
      if (i % 8 == 7) out = RunAll(*engine, std::move(out));
    }
    int hits = 0;
    for (const auto& [id, p] : prompts) {
      EXPECT_EQ(out[id].tokens, FakeRunner::GreedyOracle(p, kVocab, 4 + static_cast<int>(id % 6)))
          << "request " << id << " budget " << budget;
      hits += out[id].num_cached_tokens > 0;
    }
    EXPECT_GE(hits, 20) << "budget " << budget;  // 30 to 35 of 40 when written
    if (budget == 64) {
      EXPECT_GT(engine->stats().num_preemptions, 0);
    }
    ExpectAllPagesBack(*engine);
  }
}

TEST(PrefixCacheEngineTest, CancellationsAndEvictionLeaveEveryPageFreeOrCachedAndCounted) {
  constexpr int kPage = 2;
  auto engine = MakeEngine(kPage, 30, 9, true, 5);
  std::mt19937 rng(11);
  std::map<int64_t, Outcome> out;
  std::map<int64_t, std::vector<int32_t>> prompts;
  int64_t next = 0;
  for (int round = 0; round < 30; ++round) {
    for (int k = 0; k < 3; ++k, ++next) {
      prompts[next] = Prompt(6 + static_cast<int>(rng() % 8), 1 + static_cast<int>(rng() % 5),
                             static_cast<int>(rng() % 4), static_cast<int>(next));
      ASSERT_TRUE(engine->AddRequest(Greedy(next, prompts[next], 3 + rng() % 5)).ok());
    }
    for (int s = 0; s < 3; ++s) {
      auto outputs = engine->Step();
      ASSERT_TRUE(outputs.ok());
      Collect(*outputs, &out);
    }
    engine->Abort(next - 1 - static_cast<int64_t>(rng() % 5));  // running, waiting or done
    Status check = engine->CheckPages();
    ASSERT_TRUE(check.ok()) << "round " << round << ": " << check.ToString();
  }
  out = RunAll(*engine, std::move(out));
  for (const auto& [id, o] : out) {
    if (o.finish == FinishReason::kAbort) continue;
    EXPECT_EQ(o.tokens,
              FakeRunner::GreedyOracle(prompts[id], kVocab, static_cast<int>(o.tokens.size())))
        << "request " << id;
  }
  ExpectAllPagesBack(*engine);
  const EngineStats s = engine->stats();
  EXPECT_GT(s.prefix_cache_hits, 0);
  EXPECT_LE(s.num_cached_pages, s.num_total_pages);
}

TEST(PrefixCacheEngineTest, APrefillOnlyRequestSharesCachedPagesAndHandsOverTheWholeTable) {
  constexpr int kPage = 4;
  auto engine = MakeEngine(kPage, 32, 64, true);
  DisaggHooks* hooks = engine->disagg_hooks();
  const auto p = Prompt(13, 2, 3, 0);
  std::vector<std::shared_ptr<const PrefillResult>> results;
  for (int64_t id : {1, 2}) {
    Request r;
    r.id = id;
    r.prompt_ids = p;
    ASSERT_TRUE(hooks->AddPrefillOnlyRequest(r).ok());
    while (engine->HasWork()) {
      auto outputs = engine->Step();
      ASSERT_TRUE(outputs.ok());
      for (const RequestOutput& o : *outputs) {
        if (o.prefill_result) {
          results.push_back(o.prefill_result);
          EXPECT_EQ(o.num_cached_tokens, id == 1 ? 0 : 12);
        }
      }
    }
  }
  ASSERT_EQ(results.size(), 2u);
  ASSERT_EQ(results[1]->page_table.size(), 4u);
  EXPECT_EQ(
      std::vector<int32_t>(results[0]->page_table.begin(), results[0]->page_table.begin() + 3),
      std::vector<int32_t>(results[1]->page_table.begin(), results[1]->page_table.begin() + 3))
      << "the second request's first 3 pages are the first's";
  for (const auto& r : results) hooks->ReleasePages(r->page_table);
  ExpectAllPagesBack(*engine);
}

// Decode side: pages received for a remote-KV request are registered once it has run, and a later
// request with that prompt finds them.
TEST(PrefixCacheEngineTest, ReceivedPagesAreCachedOnceTheirRequestRan) {
  constexpr int kPage = 4;
  auto engine = MakeEngine(kPage, 32, 64, true);
  DisaggHooks* hooks = engine->disagg_hooks();
  const auto p = Prompt(11, 2, 1, 0);
  ASSERT_TRUE(hooks->AddRemoteKvRequest(Greedy(1, p, 4)).ok());
  auto reservations = hooks->TakeKvReservations();
  ASSERT_EQ(reservations.size(), 1u);
  // "Transfer" the prompt's KV (all but its last token): the fake runner's KV is the token id.
  KvRegion& region = engine->runner().region();
  for (size_t pos = 0; pos + 1 < p.size(); ++pos) {
    float* slot =
        reinterpret_cast<float*>(region.Block(0, reservations[0].page_table[pos / kPage]));
    slot[region.spec().ElemOffset(static_cast<int>(pos % kPage), 0, 0)] =
        static_cast<float>(p[pos]);
  }
  ASSERT_TRUE(hooks->MarkKvReady(1).ok());
  auto first = RunAll(*engine);
  EXPECT_EQ(first[1].tokens, FakeRunner::GreedyOracle(p, kVocab, 4));
  ASSERT_TRUE(engine->AddRequest(Greedy(2, p, 4)).ok());
  auto second = RunAll(*engine);
  EXPECT_EQ(second[2].num_cached_tokens, 12);
  EXPECT_EQ(second[2].tokens, FakeRunner::GreedyOracle(p, kVocab, 4));
  ExpectAllPagesBack(*engine);
}

}  // namespace
}  // namespace pd::engine
