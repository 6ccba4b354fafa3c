#include "engine/async_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "engine/engine_test_util.h"

namespace pd::engine {
namespace {

using ::pd::engine::testing::FakeEngineOptions;
using ::pd::engine::testing::FakeRunner;
using ::testing::HasSubstr;

constexpr auto kDeadline = std::chrono::seconds(30);

// A one-shot event to wait on with a deadline (never a sleep).
class Event {
 public:
  void Set() {
    std::lock_guard<std::mutex> lock(mu_);
    set_ = true;
    cv_.notify_all();
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kDeadline, [&] { return set_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

// Collects every request's outputs, thread-safe; waits until n requests have finished.
class Collector {
 public:
  struct PerRequest {
    std::vector<int32_t> tokens;
    int num_outputs = 0;
    int num_final = 0;
    int num_after_final = 0;
    FinishReason finish = FinishReason::kNone;
  };
  OutputCallback Callback() {
    return [this](const RequestOutput& out) {
      std::lock_guard<std::mutex> lock(mu_);
      PerRequest& r = requests_[out.request_id];
      if (r.num_final > 0) r.num_after_final++;
      r.num_outputs++;
      r.tokens.insert(r.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (out.finished()) {
        r.num_final++;
        r.finish = out.finish_reason;
        ++num_finished_;
        cv_.notify_all();
      }
    };
  }
  bool WaitFinished(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kDeadline, [&] { return num_finished_ >= n; });
  }
  std::map<int64_t, PerRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, PerRequest> requests_;
  int num_finished_ = 0;
};

std::unique_ptr<AsyncEngine> MakeAsync(int max_pending, FakeRunner::Options ro = {},
                                       int64_t idle_poll_us = 0) {
  auto engine = Engine::CreateWithRunner(FakeRunner::Make(ro), FakeEngineOptions(16, 4));
  PD_CHECK(engine.ok());
  AsyncEngineOptions ao;
  ao.max_pending_requests = max_pending;
  ao.idle_poll_us = idle_poll_us;
  auto async = AsyncEngine::Create(std::move(engine).value(), ao);
  PD_CHECK(async.ok());
  return std::move(async).value();
}

SamplingParams Greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

std::vector<int32_t> PromptOf(int len, int salt) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = (i * 5 + salt * 11 + 2) % 64;
  return p;
}

TEST(AsyncEngineTest, ManySubmittersGetEveryTokenAndOneFinalOutput) {
  auto async = MakeAsync(256);
  Collector collector;
  std::mutex ids_mu;
  std::map<int64_t, int> salt_of;  // request id -> prompt salt
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        int salt = t * 8 + i;
        auto id = async->Submit(PromptOf(1 + salt % 13, salt), Greedy(1 + salt % 9),
                                collector.Callback());
        ASSERT_TRUE(id.ok()) << id.status().ToString();
        std::lock_guard<std::mutex> lock(ids_mu);
        salt_of[*id] = salt;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(collector.WaitFinished(32));
  auto requests = collector.requests();
  ASSERT_EQ(requests.size(), 32u);
  for (const auto& [id, salt] : salt_of) {
    const auto& r = requests.at(id);
    EXPECT_EQ(r.num_final, 1);
    EXPECT_EQ(r.num_after_final, 0);
    EXPECT_EQ(r.finish, FinishReason::kLength);
    EXPECT_EQ(r.tokens, FakeRunner::GreedyOracle(PromptOf(1 + salt % 13, salt), 64, 1 + salt % 9));
    EXPECT_EQ(r.num_outputs, 1 + salt % 9);  // one output per token, the last one final
  }
  EngineStats stats = async->stats();
  EXPECT_EQ(stats.num_free_pages, stats.num_total_pages);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
}

TEST(AsyncEngineTest, InvalidSubmissionsFailAtOnceWithoutACallback) {
  auto async = MakeAsync(4);
  bool called = false;
  auto id = async->Submit({}, Greedy(4), [&](const RequestOutput&) { called = true; });
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(id.status().message(), HasSubstr("prompt_ids"));
  SamplingParams bad = Greedy(4);
  bad.top_p = 2.0f;
  id = async->Submit({1, 2}, bad, [&](const RequestOutput&) { called = true; });
  EXPECT_THAT(id.status().message(), HasSubstr("top_p"));
  async->Shutdown();
  EXPECT_FALSE(called);
}

TEST(AsyncEngineTest, AbortMidwayEndsWithAbortAndFreesPages) {
  auto async = MakeAsync(8);
  Collector collector;
  Event first_token, aborted;
  auto inner = collector.Callback();
  bool seen = false;
  auto id = async->Submit(PromptOf(5, 1), Greedy(200), [&](const RequestOutput& out) {
    inner(out);
    if (!seen) {  // hold the loop until the abort is queued: the request cannot finish first
      seen = true;
      first_token.Set();
      aborted.Wait();
    }
  });
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(first_token.Wait());
  async->Abort(*id);
  async->Abort(*id + 1000);  // unknown ids are ignored
  aborted.Set();
  ASSERT_TRUE(collector.WaitFinished(1));
  auto r = collector.requests().at(*id);
  EXPECT_EQ(r.finish, FinishReason::kAbort);
  EXPECT_EQ(r.num_final, 1);
  EXPECT_LT(r.tokens.size(), 200u);
  EngineStats stats = async->stats();  // refreshed before the final output was delivered
  EXPECT_EQ(stats.num_free_pages, stats.num_total_pages);
}

TEST(AsyncEngineTest, QueueFullIsResourceExhaustedUntilRequestsFinish) {
  auto async = MakeAsync(2);
  Collector collector;
  Event in_callback, release;
  auto inner = collector.Callback();
  bool held = false;
  auto first = async->Submit(PromptOf(3, 1), Greedy(3), [&](const RequestOutput& out) {
    inner(out);
    if (!held) {
      held = true;
      in_callback.Set();
      release.Wait();
    }
  });
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(in_callback.Wait());  // the loop is busy; the first request is still pending
  auto second = async->Submit(PromptOf(3, 2), Greedy(3), collector.Callback());
  ASSERT_TRUE(second.ok());
  auto third = async->Submit(PromptOf(3, 3), Greedy(3), collector.Callback());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("max_pending_requests = 2"));
  release.Set();
  ASSERT_TRUE(collector.WaitFinished(2));
  auto fourth = async->Submit(PromptOf(3, 4), Greedy(3), collector.Callback());
  EXPECT_TRUE(fourth.ok());
  ASSERT_TRUE(collector.WaitFinished(3));
  EXPECT_EQ(collector.requests().at(*fourth).finish, FinishReason::kLength);
}

TEST(AsyncEngineTest, ShutdownWithWorkPendingEndsEverythingWithAbort) {
  auto async = MakeAsync(1000);
  Collector collector;
  Event in_callback, release;
  auto inner = collector.Callback();
  bool held = false;
  int submitted = 0;
  auto first = async->Submit(PromptOf(4, 1), Greedy(200), [&](const RequestOutput& out) {
    inner(out);
    if (!held) {
      held = true;
      in_callback.Set();
      release.Wait();
    }
  });
  ASSERT_TRUE(first.ok());
  ++submitted;
  ASSERT_TRUE(in_callback.Wait());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(async->Submit(PromptOf(4, i + 2), Greedy(200), collector.Callback()).ok());
    ++submitted;
  }
  std::thread shutdown([&] { async->Shutdown(); });
  // Submit until the engine says it is shut down; every accepted request must end with kAbort.
  Status last;
  for (int i = 0; i < 100000000; ++i) {
    auto id = async->Submit(PromptOf(4, 9), Greedy(200), collector.Callback());
    if (id.ok()) {
      ++submitted;
    } else if (id.status().code() == StatusCode::kResourceExhausted) {
      std::this_thread::yield();  // the queue is full until Shutdown aborts it
    } else {
      last = id.status();
      break;
    }
  }
  EXPECT_EQ(last.code(), StatusCode::kUnavailable);
  release.Set();
  shutdown.join();
  ASSERT_TRUE(collector.WaitFinished(submitted));
  auto requests = collector.requests();
  EXPECT_EQ(static_cast<int>(requests.size()), submitted);
  for (const auto& [id, r] : requests) {
    EXPECT_EQ(r.num_final, 1) << id;
    EXPECT_EQ(r.finish, FinishReason::kAbort) << id;
    EXPECT_EQ(r.num_after_final, 0);
  }
  EngineStats stats = async->stats();
  EXPECT_EQ(stats.num_free_pages, stats.num_total_pages);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
  async->Shutdown();     // idempotent
  async->Abort(*first);  // harmless after shutdown
}

TEST(AsyncEngineTest, DestructorEndsEveryRequestExactlyOnce) {
  Collector collector;
  int submitted = 0;
  {
    auto async = MakeAsync(100);
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(async->Submit(PromptOf(6, i), Greedy(100), collector.Callback()).ok());
      ++submitted;
    }
  }  // ~AsyncEngine: joined, no callback after this point
  auto requests = collector.requests();
  ASSERT_EQ(static_cast<int>(requests.size()), submitted);
  for (const auto& [id, r] : requests) {
    EXPECT_EQ(r.num_final, 1);
    EXPECT_TRUE(r.finish == FinishReason::kAbort || r.finish == FinishReason::kLength);
  }
}

// A loop that spins for an hour when idle must still notice each submission and the shutdown at
// once (through the "work arrived" flag, not its budget): else this test hangs and times out.
TEST(AsyncEngineTest, IdlePollingLoopSeesEachSubmissionAndTheShutdown) {
  Collector collector;
  {
    auto async = MakeAsync(16, {}, /*idle_poll_us=*/3'600'000'000);
    for (int i = 0; i < 5; ++i) {  // one at a time: the loop is idle (polling) before each
      auto id = async->Submit(PromptOf(3 + i, i), Greedy(4), collector.Callback());
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      ASSERT_TRUE(collector.WaitFinished(i + 1)) << "request " << i << " was not served";
    }
    const EngineStats stats = async->stats();
    EXPECT_EQ(stats.num_free_pages, stats.num_total_pages);
  }  // ~AsyncEngine while the loop polls
  auto requests = collector.requests();
  ASSERT_EQ(requests.size(), 5u);
  for (const auto& [id, r] : requests) EXPECT_EQ(r.finish, FinishReason::kLength);
}

TEST(AsyncEngineTest, CreateRefusesBadArguments) {
  EXPECT_FALSE(AsyncEngine::Create(nullptr, {}).ok());
  auto engine = Engine::CreateWithRunner(FakeRunner::Make({}), FakeEngineOptions());
  ASSERT_TRUE(engine.ok());
  AsyncEngineOptions ao;
  ao.max_pending_requests = 0;
  auto async = AsyncEngine::Create(std::move(engine).value(), ao);
  EXPECT_EQ(async.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(async.status().message(), HasSubstr("max_pending_requests"));
  auto engine2 = Engine::CreateWithRunner(FakeRunner::Make({}), FakeEngineOptions());
  ASSERT_TRUE(engine2.ok());
  AsyncEngineOptions negative;
  negative.idle_poll_us = -1;
  auto refused = AsyncEngine::Create(std::move(engine2).value(), negative);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("idle_poll_us"));
}

}  // namespace
}  // namespace pd::engine
