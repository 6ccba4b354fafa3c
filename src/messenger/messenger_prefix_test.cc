// Prefix caching across the split, in one process: the decode instance looks a prompt up in its
// own prefix cache, asks the prefill instance only for the pages it lacks (first_page), and
// computes a short uncached part itself (local_prefill_max_tokens). Greedy tokens and logprobs
// must equal a colocated engine's without a cache, the transfer must carry exactly the pages
// decode lacked, and every page on both sides must end free or cached-evictable with the page
// recount (Engine::CheckPages) clean, also after eviction, aborts and a prefill instance that
// stops.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "engine/engine.h"
#include "messenger/decode_side.h"
#include "messenger/messenger_test_util.h"
#include "messenger/prefill_side.h"

namespace pd::messenger {
namespace {

using testing::AllPagesFree;
using testing::Async;
using testing::BaseDecodeOptions;
using testing::BasePrefillOptions;
using testing::kDeadlineS;
using testing::LaunchPrefill;
using testing::MakeEngine;
using testing::PrefillInstance;
using testing::PromptOf;
using testing::Shape;
using testing::WaitUntil;

constexpr int kMaxTokens = 4;

// What one request produced.
struct RunResult {
  std::vector<int32_t> tokens;
  std::vector<engine::TokenLogprob> logprobs;
  int num_cached_tokens = -1;
  engine::FinishReason finish = engine::FinishReason::kNone;
  Status error;
};

// Runs one greedy request (top-2 logprobs) through `engine` to its end.
RunResult RunOne(engine::AsyncEngine& engine, const std::vector<int32_t>& prompt) {
  struct State {
    Mutex mu;
    CondVar cv;
    RunResult run GUARDED_BY(mu);
    bool done GUARDED_BY(mu) = false;
  };
  auto state = std::make_shared<State>();
  engine::SamplingParams p = testing::GreedyParams(kMaxTokens);
  p.logprobs = 2;
  auto id = engine.Submit(prompt, p, [state](const engine::RequestOutput& out) {
    MutexLock lock(&state->mu);
    RunResult& r = state->run;
    r.tokens.insert(r.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    r.logprobs.insert(r.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
    r.num_cached_tokens = out.num_cached_tokens;
    if (out.finished()) {
      r.finish = out.finish_reason;
      r.error = out.error;
      state->done = true;
      state->cv.SignalAll();
    }
  });
  MutexLock lock(&state->mu);
  if (!id.ok()) {
    state->run.finish = engine::FinishReason::kError;
    state->run.error = id.status();
    return state->run;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!state->done) {
    if (!state->cv.WaitUntil(&state->mu, deadline)) break;
  }
  EXPECT_TRUE(state->done) << "request did not finish";
  return state->run;
}

void ExpectSameRun(const RunResult& got, const RunResult& want) {
  ASSERT_EQ(got.finish, engine::FinishReason::kLength) << got.error.ToString();
  ASSERT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t t = 0; t < want.logprobs.size(); ++t) {
    // Equal up to float summation order (the prompt ran in other chunks).
    EXPECT_NEAR(got.logprobs[t].logprob, want.logprobs[t].logprob, 1e-4) << "token " << t;
    ASSERT_EQ(got.logprobs[t].top.size(), want.logprobs[t].top.size());
    for (size_t k = 0; k < want.logprobs[t].top.size(); ++k) {
      EXPECT_EQ(got.logprobs[t].top[k].first, want.logprobs[t].top[k].first);
      EXPECT_NEAR(got.logprobs[t].top[k].second, want.logprobs[t].top[k].second, 1e-4);
    }
  }
}

// A prefill instance and a decode messenger, with their engines borrowed for the page recount
// (read once both async engines have stopped).
struct Split {
  std::unique_ptr<PrefillInstance> prefill;
  engine::Engine* prefill_engine = nullptr;
  std::unique_ptr<DecodeMessenger> decode;
  engine::Engine* decode_engine = nullptr;

  // Stops both sides, then recounts every page of both engines.
  void StopAndCheckPages() {
    decode->Shutdown();
    prefill->messenger->Stop();
    prefill->engine->Shutdown();
    Status d = decode_engine->CheckPages();
    EXPECT_TRUE(d.ok()) << "decode: " << d.ToString();
    Status p = prefill_engine->CheckPages();
    EXPECT_TRUE(p.ok()) << "prefill: " << p.ToString();
  }
};

// Null when the fabric is unavailable.
std::unique_ptr<Split> StartSplit(const Shape& s, int local_prefill_max_tokens) {
  auto split = std::make_unique<Split>();
  auto pe = MakeEngine(s);
  split->prefill_engine = pe.get();
  split->prefill = LaunchPrefill(std::move(pe), BasePrefillOptions());
  if (split->prefill == nullptr) return nullptr;
  auto de = MakeEngine(s);
  split->decode_engine = de.get();
  engine::ModelRunner& runner = de->runner();
  DecodeMessengerOptions o =
      BaseDecodeOptions({{"p0", split->prefill->messenger->fabric_address()}});
  o.local_prefill_max_tokens = local_prefill_max_tokens;
  auto d = DecodeMessenger::Create(o, runner, Async(std::move(de)));
  PD_CHECK(d.ok()) << d.status().ToString();
  split->decode = std::move(d).value();
  EXPECT_TRUE(split->decode->WaitForPeers(kDeadlineS).ok());
  return split;
}

// A colocated engine without a prefix cache: the reference.
std::unique_ptr<engine::AsyncEngine> Reference(const Shape& s) {
  engine::EngineOptions o;
  o.runner.kv.page_size = s.page_size;
  o.runner.kv.layout = s.layout;
  o.runner.num_pages = 256;
  o.runner.num_threads = 1;
  o.scheduler.max_num_batched_tokens = s.budget;
  o.scheduler.max_num_seqs = std::min(8, s.budget);
  o.scheduler.max_model_len = 128;
  o.scheduler.enable_prefix_caching = false;
  auto e = engine::Engine::Create(testing::Model().weights, o);
  PD_CHECK(e.ok()) << e.status().ToString();
  return Async(std::move(e).value());
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class PrefixSplitTest : public ::testing::TestWithParam<Shape> {};

// Prompts sharing none, some and all of their pages with earlier ones: the decode instance takes
// the shared pages from its cache, only the others cross, and the outputs do not change.
TEST_P(PrefixSplitTest, OnlyThePagesDecodeLacksCrossAndOutputsEqualColocated) {
  const Shape s = GetParam();
  auto split = StartSplit(s, /*local_prefill_max_tokens=*/-1);
  if (split == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto reference = Reference(s);
  const int ps = s.page_size;
  const int len = std::min(10 * ps, 60);  // 48 pages hold every prompt below at once
  const auto head = PromptOf(len, 1);
  const int shared = len / 2 + 1;
  const auto some = Concat({head.begin(), head.begin() + shared}, PromptOf(len - shared, 5));
  struct Case {
    std::vector<int32_t> prompt;
    int shared_tokens;  // with the prompts before it
  };
  const std::vector<Case> cases = {
      {head, 0}, {head, len}, {some, shared}, {PromptOf(len, 9), 0}, {some, len}};
  DecodeMessenger& decode = *split->decode;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const Case& c = cases[i];
    const int prefill_tokens = static_cast<int>(c.prompt.size()) - 1;
    const int cached_pages = std::min(c.shared_tokens, prefill_tokens) / ps;
    const int prompt_pages = (prefill_tokens + ps - 1) / ps;
    const uint64_t moved0 = decode.metrics().pages_transferred();
    const uint64_t cached0 = decode.metrics().pages_cached();
    const uint64_t local0 = decode.metrics().local_prefills();
    const uint64_t written0 = split->prefill->messenger->metrics().pages_transferred();
    RunResult got = RunOne(decode, c.prompt);
    ExpectSameRun(got, RunOne(*reference, c.prompt));
    EXPECT_EQ(got.num_cached_tokens, cached_pages * ps);
    EXPECT_EQ(decode.metrics().pages_cached() - cached0, static_cast<uint64_t>(cached_pages));
    const bool all_cached = cached_pages * ps >= prefill_tokens;
    EXPECT_EQ(decode.metrics().local_prefills() - local0, all_cached ? 1u : 0u);
    const uint64_t want_moved = all_cached ? 0 : static_cast<uint64_t>(prompt_pages - cached_pages);
    EXPECT_EQ(decode.metrics().pages_transferred() - moved0, want_moved);
    EXPECT_TRUE(WaitUntil([&] {
      return split->prefill->messenger->metrics().pages_transferred() - written0 == want_moved;
    })) << "the prefill instance wrote "
        << split->prefill->messenger->metrics().pages_transferred() - written0 << " pages";
  }
  EXPECT_EQ(decode.metrics().failed(), 0u);
  EXPECT_TRUE(AllPagesFree(decode));
  EXPECT_TRUE(AllPagesFree(*split->prefill->engine));
  split->StopAndCheckPages();
}

INSTANTIATE_TEST_SUITE_P(Shapes, PrefixSplitTest,
                         ::testing::Values(Shape{engine::KvLayout::kHND, 1, 64},
                                           Shape{engine::KvLayout::kNHD, 4, 64},
                                           Shape{engine::KvLayout::kHND, 4, 5},
                                           Shape{engine::KvLayout::kHND, 16, 64}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::string(engine::KvLayoutName(info.param.layout)) + "_page" +
                                  std::to_string(info.param.page_size) + "_budget" +
                                  std::to_string(info.param.budget);
                         });

// Conditional disaggregation: an uncached part of at most local_prefill_max_tokens runs on the
// decode instance, no transfer; a longer one goes to the prefill instance.
TEST(PrefixSplitLocalTest, AShortUncachedPartIsComputedOnTheDecodeInstance) {
  const Shape s{engine::KvLayout::kHND, 4, 64};
  auto split = StartSplit(s, /*local_prefill_max_tokens=*/8);
  if (split == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto reference = Reference(s);
  DecodeMessenger& decode = *split->decode;
  const auto long_prompt = PromptOf(30, 2);
  const auto extended = Concat(long_prompt, PromptOf(4, 3));  // 28 cached + 5 uncached
  // 9 tokens: 8 uncached before the last: local. 30: remote. 34 sharing 28 with it: local.
  for (const auto& prompt : {PromptOf(9, 1), long_prompt, extended}) {
    SCOPED_TRACE("prompt of " + std::to_string(prompt.size()) + " tokens");
    ExpectSameRun(RunOne(decode, prompt), RunOne(*reference, prompt));
  }
  EXPECT_EQ(decode.metrics().local_prefills(), 2u);
  EXPECT_EQ(decode.metrics().succeeded(), 1u);
  EXPECT_EQ(decode.metrics().pages_transferred(), 8u);        // the 30-token prompt's 29 tokens
  EXPECT_EQ(RunOne(decode, extended).num_cached_tokens, 32);  // its own pages now too
  EXPECT_TRUE(AllPagesFree(decode));
  split->StopAndCheckPages();
}

// Eviction on both sides (more distinct prompts than either engine's 48 pages hold), requests
// sharing a cached prefix aborted while their suffix is in flight, then the prefill instance
// stopped under a transfer: every page ends free or cached-evictable on both sides, and the
// recount of each engine's pages and prefix-cache counts agrees.
TEST(PrefixSplitLeakTest, EvictionAbortsAndAStoppedPrefillLeaveEveryPageFreeOrCached) {
  const Shape s{engine::KvLayout::kHND, 4, 8};  // small chunks: transfers take several steps
  auto split = StartSplit(s, /*local_prefill_max_tokens=*/-1);
  if (split == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  DecodeMessenger& decode = *split->decode;
  const auto head = PromptOf(24, 4);
  ASSERT_EQ(RunOne(decode, head).finish, engine::FinishReason::kLength);
  // 6 prompts of 11 pages each: the least recently used cached pages, the head's first, go.
  for (int i = 0; i < 6; ++i)
    ASSERT_EQ(RunOne(decode, PromptOf(40, 30 + i)).finish, engine::FinishReason::kLength);
  const RunResult again = RunOne(decode, head);
  ASSERT_EQ(again.finish, engine::FinishReason::kLength);
  EXPECT_EQ(again.num_cached_tokens, 0) << "the head's pages were not evicted";
  EXPECT_TRUE(AllPagesFree(decode));
  EXPECT_TRUE(AllPagesFree(*split->prefill->engine));
  {
    std::vector<std::unique_ptr<testing::PendingRequest>> pending;
    for (int i = 0; i < 4; ++i) {
      pending.push_back(std::make_unique<testing::PendingRequest>(
          decode, Concat(head, PromptOf(20, 10 + i)), testing::GreedyParams(kMaxTokens)));
    }
    for (auto& p : pending) decode.Abort(p->id());
    for (auto& p : pending) EXPECT_NE(p->Wait().finish, engine::FinishReason::kNone);
  }
  EXPECT_TRUE(AllPagesFree(decode));
  EXPECT_TRUE(AllPagesFree(*split->prefill->engine));
  // A transfer whose prefill instance goes away: the attempt fails (no other instance).
  testing::PendingRequest last(decode, Concat(head, PromptOf(30, 20)),
                               testing::GreedyParams(kMaxTokens));
  split->prefill->messenger->Stop();
  const testing::Outcome o = last.Wait();
  EXPECT_NE(o.finish, engine::FinishReason::kNone);
  EXPECT_TRUE(AllPagesFree(decode));
  EXPECT_GT(decode.stats().num_cached_pages, 0);
  split->StopAndCheckPages();
}

}  // namespace
}  // namespace pd::messenger
