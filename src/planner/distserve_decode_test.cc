#include "planner/distserve_decode.h"

#include <gtest/gtest.h>

#include <vector>

#include "planner/distserve_prefill.h"
#include "planner/simulator.h"

namespace pd::planner {
namespace {

// A prefill instance of 5 ms steps and a decode instance of 10 ms steps (any batch) running
// DistServe's decoding loop with `pp` stages.
std::vector<InstanceConfig> PrefillAndLoop(int pp) {
  InstanceConfig prefill;
  prefill.role = Role::kPrefill;
  prefill.coeffs.prefill = {5, 0, 0};
  InstanceConfig decode;
  decode.role = Role::kDecode;
  decode.pp = pp;
  decode.coeffs.decode_small = decode.coeffs.decode_large = {10, 0, 0};
  decode.distserve_decode_loop = true;
  return {prefill, decode};
}

// PP 2. A's first token comes from the prefill at 5 ms; the loop launches A's micro-batch (5..15,
// its first stage free at 10), finds the other micro-batch empty (a 3 ms turn) and waits for A.
// B is handed over at 11 ms, during that wait, so the loop accepts it after A's token at 15 and
// puts it in the micro-batch whose turn is next: A's. B's second token comes at 25 ms with A's
// third, not at 21 as a micro-batch of its own would give it. A: 5, 15, 25, 35, 45; B: 11, 25, 35.
TEST(DistServeDecodeLoop, HandOverDuringTheWaitJoinsTheNextTurnsMicroBatch) {
  const std::vector<InstanceConfig> insts = PrefillAndLoop(2);
  const std::vector<SimRequest> reqs = {{0, 0.0, 8, 5}, {1, 0.006, 8, 3}};
  SimOptions opts;
  opts.record_steps = true;
  auto r = Simulate(insts, ClusterLinks{}, reqs, opts);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->requests[0].first_token_s, 0.005, 1e-9);
  EXPECT_NEAR(r->requests[1].first_token_s, 0.011, 1e-9);
  EXPECT_NEAR(r->requests[0].finish_s, 0.045, 1e-9);
  EXPECT_NEAR(r->requests[1].finish_s, 0.035, 1e-9);
  std::vector<std::pair<double, int>> decode_steps;
  for (const SimStep& s : r->steps)
    if (s.instance == 1) decode_steps.push_back({s.start_s, s.decode_seqs});
  const std::vector<std::pair<double, int>> expected = {
      {0.005, 1}, {0.015, 2}, {0.025, 2}, {0.035, 1}};
  ASSERT_EQ(decode_steps.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(decode_steps[i].first, expected[i].first, 1e-9) << "step " << i;
    EXPECT_EQ(decode_steps[i].second, expected[i].second) << "step " << i;
  }
}

// PP 1, migrations of 4 ms. The loop migrates A's KV (5..9) and decodes it (9..19). B, handed over
// at 11 ms, is migrated after A's step returns (19..23): A's next step waits for it. A: 5, 19,
// 33, 43; B: 11, 33, 43.
TEST(DistServeDecodeLoop, MigrationsStallTheLoop) {
  const std::vector<InstanceConfig> insts = PrefillAndLoop(1);
  ClusterLinks links;
  links.transfer_latency_s = 0.004;
  const std::vector<SimRequest> reqs = {{0, 0.0, 8, 4}, {1, 0.006, 8, 3}};
  auto r = Simulate(insts, links, reqs, SimOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->requests[0].kv_arrived_s, 0.009, 1e-9);
  EXPECT_NEAR(r->requests[1].kv_arrived_s, 0.023, 1e-9);
  EXPECT_NEAR(r->requests[0].finish_s, 0.043, 1e-9);
  EXPECT_NEAR(r->requests[1].finish_s, 0.043, 1e-9);
}

// The loop accepts a hand-over only while its blocks are free: with room for one 2-block
// sequence (page 4, 8 tokens), B waits on the prefill side until A finishes. (DistServe's
// admission counts a waiting sequence's blocks twice, which here could never pass; with nothing
// decoding the loop admits a sequence that fits once.)
TEST(DistServeDecodeLoop, WaitsForBlocksBeforeAccepting) {
  std::vector<InstanceConfig> insts = PrefillAndLoop(1);
  insts[1].policy.page_size = 4;
  insts[1].policy.kv_capacity_tokens = 8;
  const std::vector<SimRequest> reqs = {{0, 0.0, 5, 3}, {1, 0.0, 5, 2}};
  auto r = Simulate(insts, ClusterLinks{}, reqs, SimOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Both prompts share the prefill step (0..5). A decodes 5..15, 15..25 (6, then 7 tokens: 2
  // blocks); B is accepted after A finishes at 25 and decodes 25..35.
  EXPECT_NEAR(r->requests[0].finish_s, 0.025, 1e-9);
  EXPECT_NEAR(r->requests[1].kv_arrived_s, 0.025, 1e-9);
  EXPECT_NEAR(r->requests[1].finish_s, 0.035, 1e-9);
}

// Back-pressure. Prefill: DistServe's scheduler, room for two 5-token prompts (4 blocks of 4
// tokens), 5 ms steps. Decode: PP 1, room for 4 blocks; a sequence joins a micro-batch only when
// its blocks fit twice over (DistServe counts a waiting sequence's blocks again as it adds it),
// and a hand-over is accepted only while the waiting ones hold under 5% of the blocks.
//   0..5    prefill A and B; C (arrived at 0) has no blocks left on the prefill instance.
//   5       A accepted (its prefill blocks freed: C prefills 5..10); A decodes 5..15.
//   6       D arrives; B and C hold the prefill instance's blocks.
//   15      B accepted (D prefills 15..20) but does not fit beside A; A decodes 15..25.
//   25      A done; B decodes 25..35. 35: C accepted, 35..45. 45: D accepted, 45..55.
TEST(DistServeDecodeLoop, PrefillKeepsKvUntilDecodeAccepts) {
  std::vector<InstanceConfig> insts = PrefillAndLoop(1);
  insts[0].policy.rule = BatchRule::kDistServePrefill;
  insts[0].policy.page_size = insts[1].policy.page_size = 4;
  insts[0].policy.kv_capacity_tokens = insts[1].policy.kv_capacity_tokens = 16;
  const std::vector<SimRequest> reqs = {
      {0, 0.0, 5, 3}, {1, 0.0, 5, 2}, {2, 0.0, 5, 2}, {3, 0.006, 5, 2}};
  auto r = Simulate(insts, ClusterLinks{}, reqs, SimOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& q = r->requests;
  EXPECT_NEAR(q[0].finish_s, 0.025, 1e-9);
  EXPECT_NEAR(q[1].kv_arrived_s, 0.015, 1e-9);
  EXPECT_NEAR(q[1].finish_s, 0.035, 1e-9);
  EXPECT_NEAR(q[2].first_token_s, 0.010, 1e-9);
  EXPECT_NEAR(q[2].kv_arrived_s, 0.035, 1e-9);
  EXPECT_NEAR(q[2].finish_s, 0.045, 1e-9);
  EXPECT_NEAR(q[3].first_token_s, 0.020, 1e-9);
  EXPECT_NEAR(q[3].kv_arrived_s, 0.045, 1e-9);
  EXPECT_NEAR(q[3].finish_s, 0.055, 1e-9);
}

TEST(DistServePrefillScheduler, BatchLimits) {
  SchedPolicy p;
  p.rule = BatchRule::kDistServePrefill;
  p.max_num_seqs = 2;
  p.max_num_batched_tokens = 10;
  DistServePrefillScheduler s(p);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.Add(i, 4, 0, 0.0).ok());
  SimBatch b = s.Schedule(0.0);
  EXPECT_EQ(b.items.size(), 2u);  // two prompts per step
  EXPECT_TRUE(s.Schedule(0.0).empty()) << "one step in flight";
  s.Update(b, {});
  ASSERT_TRUE(s.Add(3, 7, 0, 0.0).ok());
  b = s.Schedule(0.0);
  EXPECT_EQ(b.items.size(), 1u);  // 4 + 7 tokens > 10
  EXPECT_EQ(s.held_blocks(), 3);  // 16-token blocks, each prompt one, none released yet
  s.ReleaseKv(0);
  s.ReleaseKv(0);  // twice: no effect
  EXPECT_EQ(s.held_blocks(), 2);
  EXPECT_EQ(s.Add(4, 11, 0, 0.0).code(), StatusCode::kResourceExhausted);
}

TEST(DistServeDecodeLoop, OnlyOnDecodeInstances) {
  std::vector<InstanceConfig> insts = PrefillAndLoop(1);
  insts[0].distserve_decode_loop = true;
  const std::vector<SimRequest> reqs = {{0, 0.0, 8, 2}};
  EXPECT_EQ(Simulate(insts, ClusterLinks{}, reqs, SimOptions{}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::planner
