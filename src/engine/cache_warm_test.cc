#include "engine/cache_warm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "engine/async_engine.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/model_runner.h"
#include "engine/model_runner_test_util.h"

namespace pd::engine {
namespace {

TEST(TouchRangesTest, ReadsEveryRangeWhole) {
  std::vector<uint8_t> a(1000, 1), b(64 * 1024 + 3, 2);
  const MemRange ranges[] = {{a.data(), a.size()}, {b.data(), b.size()}, {nullptr, 0}};
  EXPECT_EQ(TouchRanges(ranges, nullptr, 4096), a.size() + b.size());
}

TEST(TouchRangesTest, StopsBetweenChunksWhenAsked) {
  std::vector<uint8_t> a(10 * 4096, 7);
  const MemRange ranges[] = {{a.data(), a.size()}};
  int calls = 0;
  // Three chunks run, the fourth check stops it.
  EXPECT_EQ(TouchRanges(
                ranges, [&] { return ++calls > 3; }, 4096),
            3u * 4096);
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(TouchRanges(
                ranges, [] { return true; }, 4096),
            0u);
}

TEST(TouchRangesTest, AChunkSmallerThanALineIsALine) {
  std::vector<uint8_t> a(640, 7);
  const MemRange ranges[] = {{a.data(), a.size()}};
  int calls = 0;
  EXPECT_EQ(TouchRanges(
                ranges, [&] { return ++calls > 100; }, 1),
            a.size());
  EXPECT_EQ(calls, 10);  // one check per 64-byte chunk
}

}  // namespace
}  // namespace pd::engine

// ------------------------------------------------ the engine and runner (decode side, waiting)

namespace pd::engine {
namespace {

struct WarmFixture {
  std::unique_ptr<testing::TinyModel> model;
  std::unique_ptr<Engine> engine;
  size_t weight_bytes = 0;  // what the runner appends with no page
  size_t page_bytes_all_layers = 0;
};

WarmFixture MakeWarmEngine(model::DType dtype) {
  WarmFixture f;
  testing::TinyModelOptions mo;
  mo.dtype = dtype;
  f.model = testing::MakeTinyModel(mo);
  ModelRunnerOptions ro;
  ro.kv.page_size = 4;
  ro.num_pages = 8;
  ro.num_threads = 1;
  auto runner = ModelRunner::Create(f.model->weights, ro);
  PD_CHECK(runner.ok()) << runner.status().ToString();
  std::vector<MemRange> ranges;
  (*runner)->AppendWarmRanges({}, &ranges);
  for (const MemRange& r : ranges) f.weight_bytes += r.bytes;
  const KvRegion& region = (*runner)->region();
  f.page_bytes_all_layers = region.spec().page_bytes() * region.spec().num_layers;
  auto engine =
      Engine::CreateWithRunner(std::move(runner).value(), testing::FakeEngineOptions(16, 4));
  PD_CHECK(engine.ok()) << engine.status().ToString();
  f.engine = std::move(engine).value();
  return f;
}

Request RemoteRequest(int64_t id, int prompt_len) {
  Request r;
  r.id = id;
  for (int i = 0; i < prompt_len; ++i) r.prompt_ids.push_back(1 + (i * 7 + id) % 60);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 2;
  return r;
}

class WarmCachesTest : public ::testing::TestWithParam<model::DType> {};

TEST_P(WarmCachesTest, ReadsTheWeightsAndTheAwaitedPagesOnlyWhileKvIsAwaited) {
  WarmFixture f = MakeWarmEngine(GetParam());
  ASSERT_NE(f.engine->disagg_hooks(), nullptr);
  DisaggHooks& e = *f.engine->disagg_hooks();
  ASSERT_GT(f.weight_bytes, 0u);
  EXPECT_FALSE(e.AwaitsKv());
  EXPECT_EQ(e.WarmCaches(1ull << 30, nullptr), 0u);  // nothing awaited: nothing to keep warm

  ASSERT_TRUE(e.AddRemoteKvRequest(RemoteRequest(1, 9)).ok());  // 3 pages of 4
  ASSERT_TRUE(e.AddRemoteKvRequest(RemoteRequest(2, 4)).ok());  // 1 page
  EXPECT_FALSE(e.AwaitsKv());                                   // queued, no pages reserved yet
  ASSERT_EQ(e.TakeKvReservations().size(), 2u);
  EXPECT_TRUE(e.AwaitsKv());
  EXPECT_EQ(e.WarmCaches(1ull << 30, nullptr), f.weight_bytes + 4 * f.page_bytes_all_layers);
  // More than max_bytes: not worth a pass.
  EXPECT_EQ(e.WarmCaches(f.weight_bytes, nullptr), 0u);
  // Work arriving stops it between chunks.
  EXPECT_EQ(e.WarmCaches(1ull << 30, [] { return true; }), 0u);

  ASSERT_TRUE(e.MarkKvReady(1).ok());  // runnable now: its pages are no longer "awaited"
  EXPECT_EQ(e.WarmCaches(1ull << 30, nullptr), f.weight_bytes + 1 * f.page_bytes_all_layers);
  f.engine->Abort(2);
  EXPECT_FALSE(e.AwaitsKv());
  EXPECT_EQ(e.WarmCaches(1ull << 30, nullptr), 0u);
}

INSTANTIATE_TEST_SUITE_P(DTypes, WarmCachesTest,
                         ::testing::Values(model::DType::kF32, model::DType::kBF16),
                         [](const auto& info) {
                           return info.param == model::DType::kF32 ? std::string("f32")
                                                                   : std::string("bf16");
                         });

// The engine loop warms while a request waits for its KV, and still takes the KV-ready signal
// and runs the request to the end (the warming passes stop for it).
TEST(AsyncWarmTest, ARequestWaitingForKvWhileTheLoopWarmsStillRunsWhenItsKvArrives) {
  WarmFixture f = MakeWarmEngine(model::DType::kBF16);
  AsyncEngineOptions ao;
  ao.warm_period_s = 1e-5;  // as often as it can
  auto async = AsyncEngine::Create(std::move(f.engine), ao);
  ASSERT_TRUE(async.ok()) << async.status().ToString();
  std::mutex mu;
  std::condition_variable cv;
  bool reserved = false, finished = false;
  FinishReason reason = FinishReason::kNone;
  auto id = (*async)->SubmitRemoteKv(
      RemoteRequest(0, 9).prompt_ids, RemoteRequest(0, 9).sampling,
      [&](const RequestOutput& out) {
        if (!out.finished()) return;
        std::lock_guard<std::mutex> lock(mu);
        finished = true;
        reason = out.finish_reason;
        cv.notify_all();
      },
      [&](const KvReservation&) {
        std::lock_guard<std::mutex> lock(mu);
        reserved = true;
        cv.notify_all();
      });
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return reserved; }));
  }
  (*async)->MarkKvReady(*id);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return finished; }));
  EXPECT_EQ(reason, FinishReason::kLength);
  EXPECT_EQ((*async)->stats().num_free_pages, (*async)->stats().num_total_pages);
}

}  // namespace
}  // namespace pd::engine
