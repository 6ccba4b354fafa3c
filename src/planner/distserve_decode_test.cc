#include "planner/distserve_decode.h"

#include <gtest/gtest.h>

#include <vector>

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
// sequence (page 4, 8 tokens), B waits on the prefill side until A finishes.
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

TEST(DistServeDecodeLoop, OnlyOnDecodeInstances) {
  std::vector<InstanceConfig> insts = PrefillAndLoop(1);
  insts[0].distserve_decode_loop = true;
  const std::vector<SimRequest> reqs = {{0, 0.0, 8, 2}};
  EXPECT_EQ(Simulate(insts, ClusterLinks{}, reqs, SimOptions{}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::planner
