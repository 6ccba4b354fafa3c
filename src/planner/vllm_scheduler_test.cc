#include "planner/vllm_scheduler.h"

#include <gtest/gtest.h>

#include <vector>

#include "planner/simulator.h"

namespace pd::planner {
namespace {

std::vector<int64_t> Ids(const SimBatch& b) {
  std::vector<int64_t> ids;
  for (const BatchItem& item : b.items) ids.push_back(item.seq_id);
  return ids;
}

SchedPolicy Policy(int64_t kv_tokens, int page_size) {
  SchedPolicy p;
  p.rule = BatchRule::kVllmV0;
  p.kv_capacity_tokens = kv_tokens;
  p.page_size = page_size;
  p.max_num_batched_tokens = 16384;
  p.max_num_seqs = 1024;
  return p;
}

// A prompt that arrives while a sequence decodes runs in a step of its own; the decoding sequence
// gets no token from it, then both decode together.
TEST(VllmStepScheduler, PromptStepsNeverCarryDecodes) {
  VllmStepScheduler s(Policy(1 << 16, 16));
  ASSERT_TRUE(s.Add(1, 10, 0, 0.0).ok());
  SimBatch b = s.Schedule(0.0);
  ASSERT_EQ(Ids(b), (std::vector<int64_t>{1}));
  EXPECT_FALSE(b.items[0].decode);
  EXPECT_EQ(b.items[0].num_tokens, 10);
  s.Update(b, {});
  b = s.Schedule(0.0);
  ASSERT_EQ(Ids(b), (std::vector<int64_t>{1}));
  EXPECT_TRUE(b.items[0].decode);
  ASSERT_TRUE(s.Add(2, 20, 0, 0.0).ok());
  EXPECT_TRUE(s.Schedule(0.0).empty()) << "one batch in flight";
  s.Update(b, {});
  b = s.Schedule(0.0);
  ASSERT_EQ(Ids(b), (std::vector<int64_t>{2}));  // the prompt alone
  EXPECT_FALSE(b.items[0].decode);
  s.Update(b, {});
  b = s.Schedule(0.0);
  ASSERT_EQ(Ids(b), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(b.items[0].decode && b.items[1].decode);
  EXPECT_EQ(b.items[0].start + b.items[0].num_tokens, 12);  // prompt 10 + 2 tokens
}

// Prompts of 100 and 300 tokens batch (200 padding tokens); 100 and 400 do not (300 > 256).
TEST(VllmStepScheduler, PaddedPromptBatch) {
  for (int second : {300, 400}) {
    VllmStepScheduler s(Policy(1 << 16, 16));
    ASSERT_TRUE(s.Add(1, 100, 0, 0.0).ok());
    ASSERT_TRUE(s.Add(2, second, 0, 0.0).ok());
    const size_t expected = second - 100 <= kVllmMaxPaddings ? 2 : 1;
    EXPECT_EQ(s.Schedule(0.0).items.size(), expected) << "second prompt " << second;
  }
  // The padded total counts against max_num_batched_tokens: 3 × 300 > 800.
  SchedPolicy p = Policy(1 << 16, 16);
  p.max_num_batched_tokens = 800;
  VllmStepScheduler s(p);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.Add(i, 300, 0, 0.0).ok());
  EXPECT_EQ(s.Schedule(0.0).items.size(), 2u);
}

// Three 4-token blocks, no watermark (1% of 3 blocks rounds to 0). Two 4-token prompts take a
// block each; decoding their first tokens needs a second block each: the older sequence gets the
// last free block and the newer one, finding none, is preempted by recompute (its block freed).
// Once the older finishes, the newer runs again as a prompt of its 4 tokens and the 1 it
// generated.
TEST(VllmStepScheduler, PreemptsTheNewestByRecompute) {
  VllmStepScheduler s(Policy(12, 4));
  ASSERT_TRUE(s.Add(1, 4, 0, 0.0).ok());
  ASSERT_TRUE(s.Add(2, 4, 0, 0.0).ok());
  SimBatch b = s.Schedule(0.0);
  ASSERT_EQ(Ids(b), (std::vector<int64_t>{1, 2}));
  s.Update(b, {});
  EXPECT_EQ(s.free_blocks(), 1);
  b = s.Schedule(0.0);
  ASSERT_EQ(Ids(b), (std::vector<int64_t>{1}));
  EXPECT_TRUE(b.items[0].decode);
  EXPECT_EQ(s.num_preemptions(), 1);
  EXPECT_EQ(s.free_blocks(), 1);  // the newer one's block came back
  s.Update(b, {});
  b = s.Schedule(0.0);  // the recomputed prompt needs 2 blocks: it waits, the older decodes
  ASSERT_EQ(Ids(b), (std::vector<int64_t>{1}));
  EXPECT_TRUE(b.items[0].decode);
  const std::vector<int64_t> done = {1};
  s.Update(b, done);
  EXPECT_EQ(s.free_blocks(), 3);
  b = s.Schedule(0.0);
  ASSERT_EQ(Ids(b), (std::vector<int64_t>{2}));
  EXPECT_FALSE(b.items[0].decode);
  EXPECT_EQ(b.items[0].num_tokens, 5);
}

TEST(VllmStepScheduler, RejectsWhatCanNeverFit) {
  VllmStepScheduler s(Policy(12, 4));
  EXPECT_EQ(s.Add(1, 13, 0, 0.0).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.Add(2, 5, 4, 0.0).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.Add(3, 5, 0, 0.0).ok());
  EXPECT_EQ(s.Add(3, 5, 0, 0.0).code(), StatusCode::kAlreadyExists);
}

// In the simulator: prompt 0 arrives at 0 (10 ms prompt steps, 20 ms decode steps), prompt 1 at
// 15 ms, during request 0's first decode step (15..30). Request 1's prompt runs alone at 30..40;
// request 0's next token waits for it: tokens at 10, 30, 60 (the step after the prompt step).
TEST(VllmStepScheduler, SimulatedPromptStepDelaysDecodes) {
  InstanceConfig c;
  c.role = Role::kColocated;
  c.coeffs.prefill = {10, 0, 0};
  c.coeffs.decode_small = c.coeffs.decode_large = {20, 0, 0};
  c.policy = Policy(1 << 16, 16);
  const std::vector<SimRequest> reqs = {{0, 0.0, 8, 3}, {1, 0.015, 8, 2}};
  auto r = Simulate({&c, 1}, ClusterLinks{}, reqs, SimOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->requests[0].first_token_s, 0.010, 1e-9);
  EXPECT_NEAR(r->requests[1].first_token_s, 0.040, 1e-9);
  EXPECT_NEAR(r->requests[0].finish_s, 0.060, 1e-9);
  EXPECT_NEAR(r->requests[1].finish_s, 0.060, 1e-9);
}

}  // namespace
}  // namespace pd::planner
