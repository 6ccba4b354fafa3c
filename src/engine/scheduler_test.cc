#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

namespace pd::engine {
namespace {

SchedulerOptions Opts(int budget, int max_seqs = 64, bool chunked = true) {
  SchedulerOptions o;
  o.max_num_batched_tokens = budget;
  o.max_num_seqs = max_seqs;
  o.enable_chunked_prefill = chunked;
  return o;
}

std::vector<int32_t> Prompt(int n, int32_t first = 1) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = first + i;
  return p;
}

// A fake executor: the token a sequence samples depends only on its id and length, so recomputed
// sequences must produce the same tokens. Each sequence stops after max_tokens[id] tokens.
struct Driver {
  Driver(Scheduler* s, const PagePool* p, std::map<int64_t, int> max = {})
      : sched(s), pool(p), max_tokens(std::move(max)) {}
  Scheduler* sched;
  const PagePool* pool;
  std::map<int64_t, int> max_tokens;
  std::map<int64_t, std::vector<int32_t>> generated;
  std::vector<ScheduledBatch> history;

  static int32_t TokenFor(int64_t id, int len) { return static_cast<int32_t>(id * 1000 + len); }

  std::vector<SeqUpdate> Execute(const ScheduledBatch& batch) {
    std::vector<SeqUpdate> updates;
    for (const ScheduledSeq& s : batch.seqs) {
      if (!s.samples) continue;
      int32_t tok = TokenFor(s.seq_id, s.context_len());
      generated[s.seq_id].push_back(tok);
      bool done = static_cast<int>(generated[s.seq_id].size()) >= max_tokens[s.seq_id];
      updates.push_back({s.seq_id, tok, done});
    }
    return updates;
  }

  void CheckInvariants(const ScheduledBatch& batch, const SchedulerOptions& o) {
    EXPECT_LE(batch.num_tokens(), o.max_num_batched_tokens);
    EXPECT_LE(static_cast<int>(batch.seqs.size()), o.max_num_seqs);
    EXPECT_LE(sched->num_running(), o.max_num_seqs);
    int sum = 0;
    std::set<int32_t> pages_in_batch;
    bool seen_prefill = false;
    for (const ScheduledSeq& s : batch.seqs) {
      sum += s.num_tokens;
      if (!s.is_decode) seen_prefill = true;
      EXPECT_FALSE(s.is_decode && seen_prefill) << "decode after a prefill chunk";
      EXPECT_EQ(s.start_pos, s.seq->num_computed_tokens);
      EXPECT_GE(static_cast<int>(s.seq->page_table.size()), sched->PagesFor(s.context_len()));
      EXPECT_EQ(s.samples, s.context_len() == s.seq->num_tokens());
      for (int32_t p : s.seq->page_table) {
        EXPECT_TRUE(pages_in_batch.insert(p).second) << "page " << p << " shared";
        EXPECT_EQ(pool->RefCount(p), 1);
      }
    }
    EXPECT_EQ(sum, batch.num_tokens());
  }

  // Runs until no work is left; returns the number of steps.
  int Run(const SchedulerOptions& o, int max_steps = 10000) {
    int steps = 0;
    while (sched->HasWork() && steps < max_steps) {
      ScheduledBatch batch = sched->Schedule();
      CheckInvariants(batch, o);
      std::vector<SeqUpdate> updates = Execute(batch);
      sched->Update(batch, updates);
      history.push_back(std::move(batch));
      ++steps;
    }
    return steps;
  }
};

TEST(SchedulerTest, ChunksAPromptLargerThanTheBudget) {
  PagePool pool(64);
  SimClock clock;
  Scheduler sched(Opts(4), &pool, 16, &clock);
  ASSERT_TRUE(sched.AddSequence(1, Prompt(10), 0.0).ok());
  std::vector<std::pair<int, int>> chunks;
  for (int i = 0; i < 3; ++i) {
    ScheduledBatch b = sched.Schedule();
    ASSERT_EQ(b.seqs.size(), 1u);
    chunks.push_back({b.seqs[0].start_pos, b.seqs[0].num_tokens});
    EXPECT_EQ(b.seqs[0].samples, i == 2);
    EXPECT_EQ(b.num_prefill_tokens, b.seqs[0].num_tokens);
    std::vector<SeqUpdate> u;
    if (b.seqs[0].samples) u.push_back({1, 42, false});
    sched.Update(b, u);
  }
  EXPECT_EQ(chunks, (std::vector<std::pair<int, int>>{{0, 4}, {4, 4}, {8, 2}}));
  ScheduledBatch d = sched.Schedule();  // now a decode of the sampled token
  ASSERT_EQ(d.seqs.size(), 1u);
  EXPECT_TRUE(d.seqs[0].is_decode);
  EXPECT_EQ(d.seqs[0].start_pos, 10);
  EXPECT_EQ(d.num_decode_tokens, 1);
  EXPECT_EQ(d.seqs[0].seq->token_ids.back(), 42);
}

TEST(SchedulerTest, WithoutChunkingAPromptWaitsForAWholeBudgetFcfs) {
  PagePool pool(64);
  SimClock clock;
  SchedulerOptions o = Opts(8, 64, /*chunked=*/false);
  Scheduler sched(o, &pool, 4, &clock);
  ASSERT_TRUE(sched.AddSequence(1, Prompt(6), 0.0).ok());
  ASSERT_TRUE(sched.AddSequence(2, Prompt(5), 0.0).ok());  // 6 + 5 > 8: waits, whole
  ASSERT_TRUE(sched.AddSequence(3, Prompt(1), 0.0).ok());  // fits, but FCFS: no jumping ahead
  ScheduledBatch b = sched.Schedule();
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].seq_id, 1);
  EXPECT_EQ(b.seqs[0].num_tokens, 6);
  EXPECT_EQ(sched.num_waiting(), 2);
  sched.Update(b, std::vector<SeqUpdate>{{1, 9, false}});
  b = sched.Schedule();  // decode of 1 (1 token) + the whole of 2 (5) + the whole of 3 (1)
  ASSERT_EQ(b.seqs.size(), 3u);
  EXPECT_EQ(b.seqs[0].seq_id, 1);
  EXPECT_EQ(b.seqs[1].num_tokens, 5);
  EXPECT_EQ(b.seqs[2].seq_id, 3);
}

TEST(SchedulerTest, DecodesGoFirstAndARunningPrefillContinuesBeforeNewPrompts) {
  PagePool pool(64);
  SimClock clock;
  Scheduler sched(Opts(6), &pool, 16, &clock);
  ASSERT_TRUE(sched.AddSequence(1, Prompt(3), 0.0).ok());
  ScheduledBatch b = sched.Schedule();
  sched.Update(b, std::vector<SeqUpdate>{{1, 5, false}});
  ASSERT_TRUE(sched.AddSequence(2, Prompt(20), 1.0).ok());
  ASSERT_TRUE(sched.AddSequence(3, Prompt(2), 2.0).ok());
  b = sched.Schedule();  // decode of 1, then a 5-token chunk of 2; 3 gets nothing
  ASSERT_EQ(b.seqs.size(), 2u);
  EXPECT_EQ(b.seqs[0].seq_id, 1);
  EXPECT_TRUE(b.seqs[0].is_decode);
  EXPECT_EQ(b.seqs[1].seq_id, 2);
  EXPECT_EQ(b.seqs[1].num_tokens, 5);
  EXPECT_EQ(b.num_decode_tokens, 1);
  EXPECT_EQ(b.num_prefill_tokens, 5);
  sched.Update(b, std::vector<SeqUpdate>{{1, 6, false}});
  b = sched.Schedule();  // decode of 1, 2's next chunk (running prefills before waiting)
  ASSERT_EQ(b.seqs.size(), 2u);
  EXPECT_EQ(b.seqs[1].seq_id, 2);
  EXPECT_EQ(b.seqs[1].start_pos, 5);
  EXPECT_EQ(b.seqs[1].num_tokens, 5);
}

TEST(SchedulerTest, RespectsMaxNumSeqs) {
  PagePool pool(64);
  SimClock clock;
  SchedulerOptions o = Opts(100, /*max_seqs=*/2);
  Scheduler sched(o, &pool, 4, &clock);
  for (int i = 1; i <= 5; ++i) ASSERT_TRUE(sched.AddSequence(i, Prompt(3), 0.0).ok());
  ScheduledBatch b = sched.Schedule();
  EXPECT_EQ(b.seqs.size(), 2u);
  EXPECT_EQ(sched.num_running(), 2);
  EXPECT_EQ(sched.num_waiting(), 3);
}

TEST(SchedulerTest, AllocatesPagesAsPositionsGrow) {
  PagePool pool(16);
  SimClock clock;
  Scheduler sched(Opts(64), &pool, 3, &clock);
  ASSERT_TRUE(sched.AddSequence(1, Prompt(5), 0.0).ok());
  ScheduledBatch b = sched.Schedule();
  EXPECT_EQ(sched.Find(1)->page_table.size(), 2u);  // 5 tokens in pages of 3
  EXPECT_EQ(pool.num_free(), 14);
  sched.Update(b, std::vector<SeqUpdate>{{1, 7, false}});
  b = sched.Schedule();  // position 5: still page 2
  EXPECT_EQ(sched.Find(1)->page_table.size(), 2u);
  sched.Update(b, std::vector<SeqUpdate>{{1, 7, false}});
  b = sched.Schedule();  // position 6: a third page
  EXPECT_EQ(sched.Find(1)->page_table.size(), 3u);
  EXPECT_EQ(pool.num_free(), 13);
  sched.Update(b, std::vector<SeqUpdate>{{1, 7, true}});
  EXPECT_EQ(sched.Find(1), nullptr);
  EXPECT_EQ(pool.num_free(), 16);
  EXPECT_FALSE(sched.HasWork());
}

TEST(SchedulerTest, RecordsTimesFromTheInjectedClock) {
  PagePool pool(8);
  SimClock clock;
  clock.Set(5.0);
  Scheduler sched(Opts(2), &pool, 4, &clock);
  ASSERT_TRUE(sched.AddSequence(1, Prompt(4), 1.5).ok());
  ScheduledBatch b = sched.Schedule();
  EXPECT_DOUBLE_EQ(b.time, 5.0);
  EXPECT_DOUBLE_EQ(sched.Find(1)->arrival_time, 1.5);
  EXPECT_DOUBLE_EQ(sched.Find(1)->first_scheduled_time, 5.0);
  sched.Update(b, {});
  clock.Advance(1.0);
  b = sched.Schedule();
  EXPECT_DOUBLE_EQ(b.time, 6.0);
  EXPECT_DOUBLE_EQ(sched.Find(1)->first_scheduled_time, 5.0);  // unchanged
}

TEST(SchedulerTest, PreemptsTheNewestAndRecomputesPromptAndGeneratedTokens) {
  PagePool pool(4);  // 8 tokens in pages of 2
  SimClock clock;
  SchedulerOptions o = Opts(16);
  Scheduler sched(o, &pool, 2, &clock);
  Driver d(&sched, &pool);
  ASSERT_TRUE(sched.AddSequence(1, Prompt(3), 0.0).ok());
  ASSERT_TRUE(sched.AddSequence(2, Prompt(3), 0.0).ok());
  d.max_tokens = {{1, 5}, {2, 3}};
  // Step 1: both prompts (2 pages each: the pool is full). Step 2: decodes at position 3 fit.
  // Step 3: both need a third page; 1 goes first and preempts 2 (the newest).
  for (int i = 0; i < 2; ++i) {
    ScheduledBatch b = sched.Schedule();
    EXPECT_TRUE(b.preempted_seq_ids.empty());
    sched.Update(b, d.Execute(b));
  }
  EXPECT_EQ(pool.num_free(), 0);
  ScheduledBatch b = sched.Schedule();
  EXPECT_EQ(b.preempted_seq_ids, std::vector<int64_t>{2});
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].seq_id, 1);
  EXPECT_EQ(sched.num_preemptions(), 1);
  const Sequence* two = sched.Find(2);
  EXPECT_EQ(two->state, SeqState::kWaiting);
  EXPECT_TRUE(two->page_table.empty());
  EXPECT_EQ(two->num_computed_tokens, 0);
  EXPECT_EQ(two->num_tokens(), 5);  // prompt + 2 generated, kept for the re-prefill
  sched.Update(b, d.Execute(b));
  d.Run(o);
  // 2 came back as one prefill of all its 5 tokens, at position 0.
  bool recomputed = false;
  for (const ScheduledBatch& h : d.history) {
    for (const ScheduledSeq& s : h.seqs) {
      if (s.seq_id == 2 && s.start_pos == 0 && s.num_tokens == 5) recomputed = s.samples;
    }
  }
  EXPECT_TRUE(recomputed);
  // Tokens are those of an unpreempted run: each depends only on (id, length).
  std::vector<int32_t> want1, want2;
  for (int i = 0; i < 5; ++i) want1.push_back(Driver::TokenFor(1, 3 + i));
  for (int i = 0; i < 3; ++i) want2.push_back(Driver::TokenFor(2, 3 + i));
  EXPECT_EQ(d.generated[1], want1);
  EXPECT_EQ(d.generated[2], want2);
  EXPECT_EQ(pool.num_free(), pool.num_total());
}

TEST(SchedulerTest, PreemptedSequencesReturnToTheFrontOfWaitingOldestFirst) {
  PagePool pool(6);
  SimClock clock;
  SchedulerOptions o = Opts(16);
  Scheduler sched(o, &pool, 1, &clock);
  Driver d(&sched, &pool);
  d.max_tokens = {{1, 3}, {2, 8}, {3, 8}};
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(sched.AddSequence(i, Prompt(2), 0.0).ok());
  ScheduledBatch b = sched.Schedule();  // all three prompts: 6 pages
  sched.Update(b, d.Execute(b));
  EXPECT_EQ(pool.num_free(), 0);
  b = sched.Schedule();  // 1's decode preempts 3; 2's decode takes 3's other page
  EXPECT_EQ(b.preempted_seq_ids, std::vector<int64_t>{3});
  ASSERT_EQ(b.seqs.size(), 2u);
  sched.Update(b, d.Execute(b));
  b = sched.Schedule();  // 1's decode preempts 2; nothing is admitted in a preempting step
  EXPECT_EQ(b.preempted_seq_ids, std::vector<int64_t>{2});
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].seq_id, 1);
  sched.Update(b, d.Execute(b));  // 1 finishes (3 tokens)
  EXPECT_EQ(pool.num_free(), 6);
  EXPECT_EQ(sched.num_waiting(), 2);
  b = sched.Schedule();  // 2 (older) first: all its 4 tokens; 3 (3 tokens) does not fit
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].seq_id, 2);
  EXPECT_EQ(b.seqs[0].start_pos, 0);
  EXPECT_EQ(b.seqs[0].num_tokens, 4);
  EXPECT_TRUE(b.seqs[0].samples);
  EXPECT_FALSE(b.seqs[0].is_decode);
  EXPECT_EQ(b.num_prefill_tokens, 4);
  EXPECT_EQ(sched.Find(2)->num_preemptions, 1);
  EXPECT_EQ(sched.num_preemptions(), 2);
}

TEST(SchedulerTest, AbortReleasesPagesOfRunningAndWaitingSequences) {
  PagePool pool(8);
  SimClock clock;
  Scheduler sched(Opts(4), &pool, 2, &clock);
  ASSERT_TRUE(sched.AddSequence(1, Prompt(6), 0.0).ok());
  ASSERT_TRUE(sched.AddSequence(2, Prompt(6), 0.0).ok());
  ScheduledBatch b = sched.Schedule();  // 1: [0, 4)
  sched.Update(b, {});
  EXPECT_EQ(pool.num_free(), 6);
  EXPECT_TRUE(sched.Abort(1));
  EXPECT_EQ(pool.num_free(), 8);
  EXPECT_TRUE(sched.Abort(2));
  EXPECT_FALSE(sched.Abort(2));
  EXPECT_FALSE(sched.Abort(99));
  EXPECT_FALSE(sched.HasWork());
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(SchedulerTest, UpdateIgnoresSequencesAbortedAfterSchedule) {
  PagePool pool(8);
  SimClock clock;
  Scheduler sched(Opts(8), &pool, 2, &clock);
  ASSERT_TRUE(sched.AddSequence(1, Prompt(3), 0.0).ok());
  ScheduledBatch b = sched.Schedule();
  EXPECT_TRUE(sched.Abort(1));
  sched.Update(b, std::vector<SeqUpdate>{{1, 4, false}});
  EXPECT_FALSE(sched.HasWork());
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(SchedulerTest, RejectsEmptyPromptsAndDuplicateIds) {
  PagePool pool(8);
  SimClock clock;
  Scheduler sched(Opts(8), &pool, 2, &clock);
  EXPECT_EQ(sched.AddSequence(1, {}, 0.0).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(sched.AddSequence(1, Prompt(2), 0.0).ok());
  EXPECT_EQ(sched.AddSequence(1, Prompt(2), 0.0).code(), StatusCode::kAlreadyExists);
}

TEST(SchedulerTest, DestructorReleasesPages) {
  PagePool pool(8);
  SimClock clock;
  {
    Scheduler sched(Opts(8), &pool, 2, &clock);
    ASSERT_TRUE(sched.AddSequence(1, Prompt(5), 0.0).ok());
    ScheduledBatch b = sched.Schedule();
    EXPECT_LT(pool.num_free(), 8);
  }
  EXPECT_EQ(pool.num_free(), 8);
}

// Random workloads under tight pools and budgets: every step respects the limits, every sequence
// finishes with the tokens an unconstrained run gives, and every page comes back.
TEST(SchedulerTest, RandomWorkloadsFinishWithoutLeaks) {
  std::mt19937 rng(1234);
  int64_t total_preemptions = 0;
  for (int trial = 0; trial < 60; ++trial) {
    int page_size = 1 + rng() % 5;
    int budget = 2 + rng() % 20;
    int max_seqs = 1 + rng() % 8;
    bool chunked = trial % 4 != 0;
    int num_seqs = 1 + rng() % 12;
    std::map<int64_t, int> prompt_len, max_tokens;
    int longest = 0;
    for (int i = 0; i < num_seqs; ++i) {
      // Without chunking a sequence must fit one step whole, also when it is recomputed.
      max_tokens[i] = 1 + rng() % (chunked ? 12 : budget - 1);
      prompt_len[i] = 1 + rng() % (chunked ? 30 : budget - max_tokens[i]);
      longest = std::max(longest, prompt_len[i] + max_tokens[i]);
    }
    int pages = (longest + page_size - 1) / page_size + rng() % 6;  // the longest always fits
    PagePool pool(pages);
    SimClock clock;
    SchedulerOptions o = Opts(budget, max_seqs, chunked);
    Scheduler sched(o, &pool, page_size, &clock);
    Driver d(&sched, &pool, max_tokens);
    for (int i = 0; i < num_seqs; ++i) {
      ASSERT_TRUE(sched.AddSequence(i, Prompt(prompt_len[i]), 0.0).ok());
    }
    int steps = d.Run(o);
    ASSERT_FALSE(sched.HasWork()) << "trial " << trial << " did not finish in " << steps;
    for (int i = 0; i < num_seqs; ++i) {
      ASSERT_EQ(static_cast<int>(d.generated[i].size()), max_tokens[i]) << "trial " << trial;
      for (int k = 0; k < max_tokens[i]; ++k) {
        EXPECT_EQ(d.generated[i][k], Driver::TokenFor(i, prompt_len[i] + k));
      }
    }
    EXPECT_EQ(pool.num_free(), pool.num_total()) << "trial " << trial;
    total_preemptions += sched.num_preemptions();
  }
  EXPECT_GT(total_preemptions, 20);  // the workloads do exercise preemption
}

}  // namespace
}  // namespace pd::engine
