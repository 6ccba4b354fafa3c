// The engine's disaggregation hooks: remote-KV requests (decode side), prefill-only requests
// (prefill side) and the step observer, on the scheduler, the Engine and the AsyncEngine. The
// end-to-end check moves the fake runner's KV by hand from a prefill engine into a decode engine
// and asks for the tokens a colocated run gives.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "engine/async_engine.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/scheduler.h"

namespace pd::engine {
namespace {

using ::pd::engine::testing::FakeEngineOptions;
using ::pd::engine::testing::FakeRunner;
using ::pd::engine::testing::Greedy;
using ::testing::HasSubstr;

std::vector<int32_t> PromptOf(int len, int salt) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = (i * 7 + salt * 13 + 1) % 64;
  return p;
}

SchedulerOptions Opts(int budget, int max_seqs = 8) {
  SchedulerOptions o;
  o.max_num_batched_tokens = budget;
  o.max_num_seqs = max_seqs;
  return o;
}

// ---------------------------------------------------------------- scheduler

TEST(DisaggSchedulerTest, RemoteKvReservesThePromptWaitsThenDecodesItsLastToken) {
  PagePool pool(10);
  SimClock clock;
  Scheduler s(Opts(16), &pool, /*page_size=*/4, &clock);
  ASSERT_TRUE(s.AddRemoteKvSequence(1, PromptOf(9, 1), 0.0).ok());
  EXPECT_EQ(s.num_awaiting_pages(), 1);
  std::vector<int64_t> reserved = s.ReserveRemoteKv();
  ASSERT_EQ(reserved, std::vector<int64_t>{1});
  EXPECT_EQ(s.Find(1)->page_table.size(), 3u);
  EXPECT_EQ(s.Find(1)->num_computed_tokens, 8);
  EXPECT_EQ(pool.num_free(), 7);
  EXPECT_FALSE(s.HasWork());
  EXPECT_TRUE(s.Schedule().empty());

  ASSERT_TRUE(s.MarkKvReady(1).ok());
  ScheduledBatch batch = s.Schedule();
  ASSERT_EQ(batch.seqs.size(), 1u);
  EXPECT_EQ(batch.seqs[0].start_pos, 8);
  EXPECT_EQ(batch.seqs[0].num_tokens, 1);
  EXPECT_TRUE(batch.seqs[0].is_decode);
  EXPECT_TRUE(batch.seqs[0].samples);
  EXPECT_EQ(batch.num_decode_tokens, 1);
  EXPECT_EQ(pool.num_free(), 7);  // no page allocated beyond the reservation
}

TEST(DisaggSchedulerTest, ReservationsWaitFcfsForFreePages) {
  PagePool pool(4);
  SimClock clock;
  Scheduler s(Opts(16), &pool, /*page_size=*/4, &clock);
  ASSERT_TRUE(s.AddSequence(1, PromptOf(12, 1), 0.0).ok());
  s.Schedule();                                                     // takes 3 pages
  ASSERT_TRUE(s.AddRemoteKvSequence(2, PromptOf(8, 2), 0.0).ok());  // 2 pages
  ASSERT_TRUE(s.AddRemoteKvSequence(3, PromptOf(2, 3), 0.0).ok());  // 1 page, must not jump
  EXPECT_TRUE(s.ReserveRemoteKv().empty());
  EXPECT_EQ(s.num_awaiting_pages(), 2);
  EXPECT_TRUE(s.Abort(1));
  EXPECT_EQ(s.ReserveRemoteKv(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(s.num_awaiting_kv(), 2);
  EXPECT_EQ(pool.num_free(), 1);
}

// A decode instance with every page taken: sequence 1 decodes, sequence 2's KV has arrived into
// the rest. Sequence 1 needs a page, preempts itself and waits at the front, needing 5 pages of
// the 4 free: the 6 it waits for are sequence 2's, which must pass it and run (the CI hang of
// MessengerGoldenTest.ConcurrentRequestsAllMatch/hnd_page1_budget64).
class PreemptedBeforeAKvReadySequence : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(s_.AddRemoteKvSequence(1, PromptOf(4, 1), 0.0).ok());
    ASSERT_EQ(s_.ReserveRemoteKv(), std::vector<int64_t>{1});
    ASSERT_TRUE(s_.MarkKvReady(1).ok());
    ScheduledBatch first = s_.Schedule();
    ASSERT_EQ(first.seqs.size(), 1u);
    s_.Update(first, std::vector<SeqUpdate>{{1, 5, false}});
    ASSERT_TRUE(s_.AddRemoteKvSequence(2, PromptOf(6, 2), 0.0).ok());
    ASSERT_EQ(s_.ReserveRemoteKv(), std::vector<int64_t>{2});
    ASSERT_TRUE(s_.MarkKvReady(2).ok());
    ASSERT_EQ(pool_.num_free(), 0);
    ScheduledBatch preempting = s_.Schedule();
    ASSERT_TRUE(preempting.empty());
    ASSERT_EQ(preempting.preempted_seq_ids, std::vector<int64_t>{1});
    ASSERT_EQ(pool_.num_free(), 4);
  }
  PagePool pool_{10};
  SimClock clock_;
  Scheduler s_{Opts(16), &pool_, /*page_size=*/1, &clock_};
};

TEST_F(PreemptedBeforeAKvReadySequence, TheKvReadySequencePassesAndThenThePreemptedOneRuns) {
  ScheduledBatch batch = s_.Schedule();
  ASSERT_EQ(batch.seqs.size(), 1u);
  EXPECT_EQ(batch.seqs[0].seq_id, 2);
  EXPECT_TRUE(batch.seqs[0].is_decode);
  EXPECT_EQ(pool_.num_free(), 4);  // it took no page: sequence 1 still waits for 5
  EXPECT_EQ(s_.Find(1)->state, SeqState::kWaiting);
  s_.Update(batch, std::vector<SeqUpdate>{{2, 7, true}});
  EXPECT_EQ(pool_.num_free(), 10);
  batch = s_.Schedule();
  ASSERT_EQ(batch.seqs.size(), 1u);
  EXPECT_EQ(batch.seqs[0].seq_id, 1);
  EXPECT_EQ(batch.seqs[0].start_pos, 0);  // recomputed: its prompt and its token
  EXPECT_EQ(batch.seqs[0].num_tokens, 5);
}

TEST_F(PreemptedBeforeAKvReadySequence, NoReservationTakesThePagesThePreemptedOneWaitsFor) {
  ASSERT_TRUE(s_.AddRemoteKvSequence(3, PromptOf(2, 3), 0.0).ok());
  EXPECT_TRUE(s_.ReserveRemoteKv().empty());  // 2 of the 4 free would leave it waiting
  ScheduledBatch batch = s_.Schedule();       // sequence 2 runs and finishes
  s_.Update(batch, std::vector<SeqUpdate>{{2, 7, true}});
  EXPECT_TRUE(s_.ReserveRemoteKv().empty());  // sequence 1 still waits (admitted next step)
  batch = s_.Schedule();
  ASSERT_EQ(batch.seqs.size(), 1u);
  EXPECT_EQ(batch.seqs[0].seq_id, 1);
  EXPECT_EQ(s_.ReserveRemoteKv(), std::vector<int64_t>{3});
  EXPECT_EQ(pool_.num_free(), 3);
}

TEST(DisaggSchedulerTest, AbortReleasesPagesInEveryRemoteState) {
  PagePool pool(3);
  SimClock clock;
  Scheduler s(Opts(16), &pool, /*page_size=*/4, &clock);
  ASSERT_TRUE(s.AddRemoteKvSequence(1, PromptOf(8, 1), 0.0).ok());
  ASSERT_TRUE(s.AddRemoteKvSequence(2, PromptOf(8, 2), 0.0).ok());
  s.ReserveRemoteKv();
  EXPECT_EQ(s.num_awaiting_kv(), 1);
  EXPECT_EQ(s.num_awaiting_pages(), 1);
  EXPECT_TRUE(s.Abort(2));  // still queued for pages
  EXPECT_TRUE(s.Abort(1));  // reserved, awaiting its KV
  EXPECT_EQ(s.num_awaiting_kv(), 0);
  EXPECT_EQ(s.num_awaiting_pages(), 0);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_FALSE(s.Abort(1));
}

TEST(DisaggSchedulerTest, MarkKvReadyRefusesUnknownAndUnreservedSequences) {
  PagePool pool(1);
  SimClock clock;
  Scheduler s(Opts(16), &pool, /*page_size=*/4, &clock);
  EXPECT_EQ(s.MarkKvReady(7).code(), StatusCode::kNotFound);
  ASSERT_TRUE(s.AddRemoteKvSequence(1, PromptOf(8, 1), 0.0).ok());  // needs 2 pages of 1
  EXPECT_TRUE(s.ReserveRemoteKv().empty());
  Status st = s.MarkKvReady(1);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("not awaiting its KV"));
  ASSERT_TRUE(s.AddSequence(2, PromptOf(2, 2), 0.0).ok());
  EXPECT_EQ(s.MarkKvReady(2).code(), StatusCode::kFailedPrecondition);
}

TEST(DisaggSchedulerTest, PrefillOnlyTakesAllPagesAtOnceAndIsNeverPreempted) {
  PagePool pool(5);
  SimClock clock;
  Scheduler s(Opts(/*budget=*/8), &pool, /*page_size=*/4, &clock);
  ASSERT_TRUE(s.AddSequence(2, PromptOf(7, 2), 0.0).ok());              // 2 pages, then grows
  ASSERT_TRUE(s.AddPrefillOnlySequence(1, PromptOf(12, 1), 0.0).ok());  // 3 pages
  ScheduledBatch b1 = s.Schedule();
  ASSERT_EQ(b1.seqs.size(), 2u);
  EXPECT_EQ(b1.seqs[1].seq_id, 1);
  EXPECT_EQ(b1.seqs[1].num_tokens, 1);          // a one-token chunk...
  EXPECT_EQ(s.Find(1)->page_table.size(), 3u);  // ...but the whole prompt's pages
  EXPECT_EQ(pool.num_free(), 0);
  bool preempted_normal = false;
  ScheduledBatch b = std::move(b1);
  for (int step = 0; step < 4 && s.Find(1) != nullptr; ++step) {
    std::vector<SeqUpdate> updates;
    for (const ScheduledSeq& q : b.seqs) {
      if (q.samples) updates.push_back({q.seq_id, 5, q.seq_id == 1});
    }
    s.Update(b, updates);
    b = s.Schedule();
    for (int64_t id : b.preempted_seq_ids) {
      EXPECT_NE(id, 1);
      preempted_normal |= id == 2;
    }
  }
  EXPECT_TRUE(preempted_normal);  // the pool ran out while the prefill-only one held its pages
}

// ---------------------------------------------------------------- engine

std::unique_ptr<Engine> MakeEngine(int page_size, int num_pages, int budget) {
  FakeRunner::Options ro;
  ro.page_size = page_size;
  ro.num_pages = num_pages;
  auto engine = Engine::CreateWithRunner(FakeRunner::Make(ro),
                                         FakeEngineOptions(budget, std::min(4, budget)));
  PD_CHECK(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

DisaggHooks& Hooks(Engine& engine) {
  PD_CHECK(engine.disagg_hooks() != nullptr);
  return *engine.disagg_hooks();
}

// Copies the fake runner's KV pages (one layer) from one engine's region into another's.
void CopyPages(Engine& from, const std::vector<int32_t>& src, Engine& to,
               const std::vector<int32_t>& dst, int num_pages) {
  KvRegion& a = from.runner().region();
  KvRegion& b = to.runner().region();
  for (int k = 0; k < num_pages; ++k) {
    std::memcpy(b.Block(0, dst[k]), a.Block(0, src[k]), a.spec().page_bytes());
  }
}

// (page_size, prefill budget): chunked and whole prefill, pages of 1 and 4 tokens.
class DisaggEngineTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(DisaggEngineTest, HandedOverKvGivesTheColocatedGreedyTokens) {
  const auto [page_size, budget] = GetParam();
  auto prefill = MakeEngine(page_size, 64, budget);
  auto decode = MakeEngine(page_size, 64, 16);
  std::vector<StepInfo> steps;
  Hooks(*prefill).SetStepObserver([&](const StepInfo& info) { steps.push_back(info); });
  for (int len : {1, 2, 3, 4, 5, 9, 13}) {
    SCOPED_TRACE("prompt length " + std::to_string(len));
    const std::vector<int32_t> prompt = PromptOf(len, len);
    const int64_t id = 100 + len;
    ASSERT_TRUE(Hooks(*decode).AddRemoteKvRequest(Greedy(id, prompt, 6)).ok());
    std::vector<KvReservation> res = Hooks(*decode).TakeKvReservations();
    ASSERT_EQ(res.size(), 1u);
    ASSERT_EQ(static_cast<int>(res[0].page_table.size()), (len + page_size - 1) / page_size);
    if (len > 1) {
      steps.clear();
      std::vector<int32_t> head(prompt.begin(), prompt.end() - 1);
      ASSERT_TRUE(Hooks(*prefill).AddPrefillOnlyRequest(Greedy(id, head, 1)).ok());
      std::shared_ptr<const PrefillResult> result;
      while (prefill->HasWork()) {
        auto outs = prefill->Step();
        ASSERT_TRUE(outs.ok());
        for (const RequestOutput& out : *outs) {
          EXPECT_TRUE(out.new_token_ids.empty());
          EXPECT_EQ(out.finish_reason, FinishReason::kStop);
          result = out.prefill_result;
        }
      }
      ASSERT_NE(result, nullptr);
      EXPECT_EQ(result->num_tokens, len - 1);
      // The observer saw contiguous chunks covering the prompt, the last one marked.
      int pos = 0;
      for (size_t k = 0; k < steps.size(); ++k) {
        ASSERT_EQ(steps[k].prefill_chunks.size(), 1u);
        const PrefillChunk& c = steps[k].prefill_chunks[0];
        EXPECT_EQ(c.request_id, id);
        EXPECT_EQ(c.start_pos, pos);
        EXPECT_EQ(c.page_table, result->page_table);
        EXPECT_EQ(c.is_last_chunk, k + 1 == steps.size());
        if (k > 0) {
          EXPECT_EQ(steps[k].runner_step, steps[k - 1].runner_step + 1);
        }
        pos += c.num_tokens;
      }
      EXPECT_EQ(pos, len - 1);
      // Kept for the messenger until released.
      EXPECT_EQ(prefill->stats().num_free_pages, 64 - static_cast<int>(result->page_table.size()));
      CopyPages(*prefill, result->page_table, *decode, res[0].page_table,
                static_cast<int>(result->page_table.size()));
      Hooks(*prefill).ReleasePages(result->page_table);
      EXPECT_EQ(prefill->stats().num_free_pages, 64);
    }
    EXPECT_FALSE(decode->HasWork());
    ASSERT_TRUE(Hooks(*decode).MarkKvReady(id).ok());
    std::vector<int32_t> tokens;
    while (decode->HasWork()) {
      auto outs = decode->Step();
      ASSERT_TRUE(outs.ok());
      for (const RequestOutput& out : *outs) {
        tokens.insert(tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      }
    }
    EXPECT_EQ(tokens, FakeRunner::GreedyOracle(prompt, 64, 6));
    EXPECT_EQ(decode->stats().num_free_pages, 64);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DisaggEngineTest,
                         ::testing::Values(std::make_tuple(1, 64), std::make_tuple(4, 64),
                                           std::make_tuple(4, 3), std::make_tuple(1, 2)));

TEST(DisaggEngineTest, AbortedPrefillOnlyRequestKeepsNoPage) {
  auto engine = MakeEngine(4, 16, 4);
  ASSERT_TRUE(Hooks(*engine).AddPrefillOnlyRequest(Greedy(1, PromptOf(12, 1), 1)).ok());
  auto outs = engine->Step();  // first chunk only
  ASSERT_TRUE(outs.ok());
  EXPECT_TRUE(outs->empty());
  engine->Abort(1);
  outs = engine->Step();
  ASSERT_TRUE(outs.ok());
  ASSERT_EQ(outs->size(), 1u);
  EXPECT_EQ((*outs)[0].finish_reason, FinishReason::kAbort);
  EXPECT_EQ((*outs)[0].prefill_result, nullptr);
  EXPECT_EQ(engine->stats().num_free_pages, 16);
}

TEST(DisaggEngineTest, AForwardFailureFailsThePrefillOnlyRequestWithoutKeepingPages) {
  FakeRunner::Options ro;
  ro.page_size = 4;
  ro.num_pages = 16;
  ro.fail_on_step = 0;
  auto engine =
      std::move(Engine::CreateWithRunner(FakeRunner::Make(ro), FakeEngineOptions(64, 4))).value();
  StepInfo seen;
  Hooks(*engine).SetStepObserver([&](const StepInfo& info) { seen = info; });
  ASSERT_TRUE(Hooks(*engine).AddPrefillOnlyRequest(Greedy(1, PromptOf(6, 1), 1)).ok());
  auto outs = engine->Step();
  ASSERT_TRUE(outs.ok());
  ASSERT_EQ(outs->size(), 1u);
  EXPECT_EQ((*outs)[0].finish_reason, FinishReason::kError);
  EXPECT_EQ((*outs)[0].prefill_result, nullptr);
  EXPECT_EQ(seen.prefill_chunks.size(), 1u);  // told before Forward
  EXPECT_EQ(engine->stats().num_free_pages, 16);
}

TEST(DisaggEngineTest, RemoteKvRequestsCountAsAwaitingAndAreValidated) {
  auto engine = MakeEngine(4, 4, 16);
  Request bad = Greedy(1, {}, 4);
  EXPECT_EQ(Hooks(*engine).AddRemoteKvRequest(bad).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(Hooks(*engine).AddRemoteKvRequest(Greedy(2, PromptOf(8, 2), 4)).ok());
  ASSERT_TRUE(Hooks(*engine).AddRemoteKvRequest(Greedy(3, PromptOf(8, 3), 4)).ok());
  EXPECT_EQ(Hooks(*engine).TakeKvReservations().size(), 2u);
  EXPECT_EQ(engine->stats().num_awaiting_kv, 2);
  EXPECT_EQ(engine->stats().num_free_pages, 0);
  engine->Abort(2);
  engine->Abort(3);
  EXPECT_EQ(engine->stats().num_free_pages, 4);
  EXPECT_EQ(engine->stats().num_awaiting_kv, 0);
}

TEST(DisaggEngineTest, RetainedPagesOutliveTheirAbortedRequestUntilReleased) {
  auto engine = MakeEngine(4, 4, 16);
  ASSERT_TRUE(Hooks(*engine).AddRemoteKvRequest(Greedy(2, PromptOf(8, 2), 4)).ok());
  std::vector<KvReservation> res = Hooks(*engine).TakeKvReservations();
  ASSERT_EQ(res.size(), 1u);
  Hooks(*engine).RetainPages(res[0].page_table);  // a transfer may still write into them
  engine->Abort(2);
  EXPECT_EQ(engine->stats().num_free_pages, 2) << "retained pages must not be free";
  EXPECT_EQ(engine->stats().num_awaiting_kv, 0);
  // Nothing else can take them meanwhile.
  ASSERT_TRUE(Hooks(*engine).AddRemoteKvRequest(Greedy(3, PromptOf(12, 3), 4)).ok());
  EXPECT_TRUE(Hooks(*engine).TakeKvReservations().empty());
  Hooks(*engine).ReleasePages(res[0].page_table);
  EXPECT_EQ(Hooks(*engine).TakeKvReservations().size(), 1u);
  engine->Abort(3);
  EXPECT_EQ(engine->stats().num_free_pages, 4);
}

// The prefill instance's hidden state of the last prefilled position stays on the remote-KV
// request from when it comes (before or after its KV) until the request ends.
TEST(DisaggEngineTest, PrefilledHiddenStaysOnTheRequestUntilItEnds) {
  FakeRunner::Options ro;
  ro.page_size = 4;
  ro.num_pages = 16;
  ro.hidden_size = 3;
  auto made = Engine::CreateWithRunner(FakeRunner::Make(ro), FakeEngineOptions(16, 4));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Engine& engine = **made;
  DisaggHooks& hooks = Hooks(engine);
  EXPECT_EQ(hooks.SetPrefilledHidden(2, {1, 2, 3}).code(), StatusCode::kNotFound);
  ASSERT_TRUE(hooks.AddRemoteKvRequest(Greedy(2, PromptOf(8, 2), 3)).ok());
  EXPECT_TRUE(hooks.PrefilledHidden(2).empty()) << "nothing came yet";
  const Status bad = hooks.SetPrefilledHidden(2, {1, 2});
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("has 2 floats, expected hidden_size 3"));
  ASSERT_TRUE(hooks.SetPrefilledHidden(2, {0.5f, -1.0f, 2.0f}).ok());  // before its KV
  ASSERT_EQ(hooks.TakeKvReservations().size(), 1u);
  ASSERT_TRUE(hooks.MarkKvReady(2).ok());
  ASSERT_TRUE(engine.Step().ok());  // the first decode step
  EXPECT_THAT(hooks.PrefilledHidden(2), ::testing::ElementsAre(0.5f, -1.0f, 2.0f));
  while (engine.HasWork()) ASSERT_TRUE(engine.Step().ok());
  EXPECT_TRUE(hooks.PrefilledHidden(2).empty()) << "the request ended";
  EXPECT_EQ(hooks.SetPrefilledHidden(2, {1, 2, 3}).code(), StatusCode::kNotFound);
  EXPECT_TRUE(engine.CheckPages().ok());
}

// ---------------------------------------------------------------- async engine

constexpr auto kDeadline = std::chrono::seconds(30);

// Thread-safe box for a value set once on the engine thread.
template <typename T>
class Box {
 public:
  void Set(T value) {
    std::lock_guard<std::mutex> lock(mu_);
    value_ = std::move(value);
    set_ = true;
    cv_.notify_all();
  }
  bool Wait(T* out) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, kDeadline, [&] { return set_; })) return false;
    *out = value_;
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  T value_{};
  bool set_ = false;
};

std::unique_ptr<AsyncEngine> MakeAsync(std::unique_ptr<Engine> engine) {
  auto async = AsyncEngine::Create(std::move(engine), AsyncEngineOptions{});
  PD_CHECK(async.ok());
  return std::move(async).value();
}

TEST(DisaggAsyncEngineTest, PrefillOnlyAndRemoteKvRoundTripThroughTheLoops) {
  auto prefill_engine = MakeEngine(4, 32, 3);
  auto decode_engine = MakeEngine(4, 32, 16);
  Engine* prefill_raw = prefill_engine.get();
  Engine* decode_raw = decode_engine.get();
  auto prefill = MakeAsync(std::move(prefill_engine));
  auto decode = MakeAsync(std::move(decode_engine));
  const std::vector<int32_t> prompt = PromptOf(11, 5);

  Box<std::vector<int32_t>> reserved;
  Box<std::vector<int32_t>> tokens;
  std::vector<int32_t> acc;  // decode loop thread only
  auto id = decode->SubmitRemoteKv(
      prompt,
      [] {
        SamplingParams p;
        p.temperature = 0.0f;
        p.max_tokens = 5;
        return p;
      }(),
      [&](const RequestOutput& out) {
        acc.insert(acc.end(), out.new_token_ids.begin(), out.new_token_ids.end());
        if (out.finished()) tokens.Set(acc);
      },
      [&](const KvReservation& r) { reserved.Set(r.page_table); });
  ASSERT_TRUE(id.ok());
  std::vector<int32_t> dst;
  ASSERT_TRUE(reserved.Wait(&dst));
  EXPECT_EQ(dst.size(), 3u);

  Box<std::shared_ptr<const PrefillResult>> result;
  auto pid = prefill->SubmitPrefillOnly(std::vector<int32_t>(prompt.begin(), prompt.end() - 1),
                                        [&](const RequestOutput& out) {
                                          if (out.finished()) result.Set(out.prefill_result);
                                        });
  ASSERT_TRUE(pid.ok());
  std::shared_ptr<const PrefillResult> r;
  ASSERT_TRUE(result.Wait(&r));
  ASSERT_NE(r, nullptr);
  // Both loops are idle on these pages now: the prefill pages are referenced, the decode pages
  // reserved and out of scheduling.
  CopyPages(*prefill_raw, r->page_table, *decode_raw, dst, static_cast<int>(r->page_table.size()));
  prefill->ReleasePages(r->page_table);
  decode->MarkKvReady(*id);
  std::vector<int32_t> out;
  ASSERT_TRUE(tokens.Wait(&out));
  EXPECT_EQ(out, FakeRunner::GreedyOracle(prompt, 64, 5));
  prefill->Shutdown();
  decode->Shutdown();
  EXPECT_EQ(prefill->stats().num_free_pages, 32);
  EXPECT_EQ(decode->stats().num_free_pages, 32);
}

// A remote-KV request whose reserved pages go to `reserved` and whose finish reason to `finish`.
Result<int64_t> SubmitRemoteKv(AsyncEngine& async, std::vector<int32_t> prompt,
                               const SamplingParams& p, Box<FinishReason>* finish,
                               Box<std::vector<int32_t>>* reserved) {
  return async.SubmitRemoteKv(
      std::move(prompt), p,
      [finish](const RequestOutput& out) {
        if (out.finished()) finish->Set(out.finish_reason);
      },
      [reserved](const KvReservation& r) { reserved->Set(r.page_table); });
}

TEST(DisaggAsyncEngineTest, AbortingARemoteKvRequestFreesItsReservedPages) {
  auto async = MakeAsync(MakeEngine(4, 8, 16));
  Box<std::vector<int32_t>> reserved;
  Box<FinishReason> finish;
  SamplingParams p;
  p.max_tokens = 4;
  auto id = SubmitRemoteKv(*async, PromptOf(9, 1), p, &finish, &reserved);
  ASSERT_TRUE(id.ok());
  std::vector<int32_t> pages;
  ASSERT_TRUE(reserved.Wait(&pages));
  async->Abort(*id);
  FinishReason reason = FinishReason::kNone;
  ASSERT_TRUE(finish.Wait(&reason));
  EXPECT_EQ(reason, FinishReason::kAbort);
  async->MarkKvReady(*id);  // too late: ignored
  async->Shutdown();
  EXPECT_EQ(async->stats().num_free_pages, 8);
  EXPECT_EQ(async->stats().num_awaiting_kv, 0);
}

// Counts Step calls, forwarding everything to a real Engine (the loop's calls are what is tested);
// without expose_hooks it stands for an engine that has no disaggregation hooks.
class StepCountingEngine final : public Engine {
 public:
  explicit StepCountingEngine(std::unique_ptr<Engine> inner, bool expose_hooks = true)
      : inner_(std::move(inner)), expose_hooks_(expose_hooks) {}
  int64_t steps() const { return steps_.load(); }
  int64_t stalled_steps() const { return stalled_steps_.load(); }

  Status ValidateRequest(const Request& r) const override { return inner_->ValidateRequest(r); }
  Status AddRequest(Request r) override { return inner_->AddRequest(std::move(r)); }
  void Abort(int64_t id) override { inner_->Abort(id); }
  bool HasWork() const override { return inner_->HasWork(); }
  bool Stalled() const override { return inner_->Stalled(); }
  Result<std::vector<RequestOutput>> Step() override {
    auto out = inner_->Step();
    ++steps_;
    if (inner_->Stalled()) ++stalled_steps_;
    return out;
  }
  EngineStats stats() const override { return inner_->stats(); }
  const model::ModelConfig& config() const override { return inner_->config(); }
  ModelRunner& runner() override { return inner_->runner(); }
  Status CheckPages() const override { return inner_->CheckPages(); }
  DisaggHooks* disagg_hooks() override { return expose_hooks_ ? inner_->disagg_hooks() : nullptr; }

 private:
  std::unique_ptr<Engine> inner_;
  const bool expose_hooks_;
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> stalled_steps_{0};
};

TEST(DisaggAsyncEngineTest, AnEngineWithoutHooksRefusesDisaggregatedRequestsOnly) {
  auto async = MakeAsync(std::make_unique<StepCountingEngine>(MakeEngine(4, 8, 16), false));
  SamplingParams p;
  p.max_tokens = 2;
  EXPECT_EQ(async->SubmitPrefillOnly(PromptOf(5, 1), nullptr).status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(async->SubmitRemoteKv(PromptOf(5, 1), p, nullptr, nullptr).status().code(),
            StatusCode::kUnimplemented);
  async->ReleasePages({0});  // nothing to give back to: ignored
  Box<FinishReason> finish;
  auto id = async->Submit(PromptOf(5, 1), p, [&](const RequestOutput& out) {
    if (out.finished()) finish.Set(out.finish_reason);
  });
  ASSERT_TRUE(id.ok());
  FinishReason reason = FinishReason::kNone;
  ASSERT_TRUE(finish.Wait(&reason));
  EXPECT_EQ(reason, FinishReason::kLength);
  async->Shutdown();
  EXPECT_EQ(async->stats().num_free_pages, 8);
}

TEST(DisaggEngineTest, AStepThatCanScheduleNothingLeavesTheEngineStalledUntilPagesCome) {
  auto engine = MakeEngine(4, 4, 16);
  ASSERT_TRUE(Hooks(*engine).AddRemoteKvRequest(Greedy(1, PromptOf(9, 1), 1)).ok());
  ASSERT_EQ(Hooks(*engine).TakeKvReservations().size(), 1u);           // 3 of the 4 pages
  ASSERT_TRUE(engine->AddRequest(Greedy(2, PromptOf(8, 2), 1)).ok());  // needs 3
  EXPECT_FALSE(engine->Stalled());
  auto out = engine->Step();
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->empty());
  EXPECT_TRUE(engine->HasWork());
  EXPECT_TRUE(engine->Stalled());
  engine->Abort(2);
  EXPECT_FALSE(engine->Stalled());  // an abort to report
  ASSERT_TRUE(engine->AddRequest(Greedy(3, PromptOf(8, 3), 1)).ok());
  ASSERT_TRUE(engine->Step().ok());  // reports the abort; request 3 cannot start
  EXPECT_TRUE(engine->Stalled());
  ASSERT_TRUE(Hooks(*engine).MarkKvReady(1).ok());
  out = engine->Step();  // request 1 decodes its one token and ends
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(engine->Stalled());
  ASSERT_EQ(out->size(), 1u);
  EXPECT_TRUE((*out)[0].finished());
  out = engine->Step();  // request 3 now has its pages
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].request_id, 3);
}

// An engine that can schedule nothing until pages come (a request waits for pages a remote-KV
// one holds while its KV is on its way) sleeps: no empty steps while nothing changes.
TEST(DisaggAsyncEngineTest, AStalledLoopWaitsForNewsInsteadOfSpinning) {
  Box<std::vector<int32_t>> reserved;  // before the engine: its shutdown may still call back
  Box<FinishReason> first, second;
  auto counting = std::make_unique<StepCountingEngine>(MakeEngine(4, 4, 16));
  StepCountingEngine* engine = counting.get();
  auto async = MakeAsync(std::move(counting));
  SamplingParams p;
  p.max_tokens = 1;
  auto remote = SubmitRemoteKv(*async, PromptOf(9, 1), p, &first, &reserved);
  ASSERT_TRUE(remote.ok());
  std::vector<int32_t> pages;
  ASSERT_TRUE(reserved.Wait(&pages));  // 3 of the 4 pages
  auto normal = async->Submit(PromptOf(8, 2), p, [&](const RequestOutput& out) {
    if (out.finished()) second.Set(out.finish_reason);
  });
  ASSERT_TRUE(normal.ok());
  const auto end = std::chrono::steady_clock::now() + kDeadline;
  while (engine->stalled_steps() == 0 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(engine->stalled_steps(), 1);
  const int64_t steps = engine->steps();
  // Nothing changes here: a spinning loop would run thousands of empty steps meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(engine->steps(), steps);
  async->MarkKvReady(*remote);  // the news: both requests run to their end
  FinishReason a = FinishReason::kNone, b = FinishReason::kNone;
  ASSERT_TRUE(first.Wait(&a));
  ASSERT_TRUE(second.Wait(&b));
  EXPECT_EQ(a, FinishReason::kLength);
  EXPECT_EQ(b, FinishReason::kLength);
  async->Shutdown();
  EXPECT_EQ(async->stats().num_free_pages, 4);
}

}  // namespace
}  // namespace pd::engine
