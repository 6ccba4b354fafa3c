// `pdserve validate-sim`'s header-only parts (issue #7): the outside latency and the last token's
// way out that SimulateRate adds to each simulated request, and the bench's client side they are
// measured against.
#include "apps/validate_sim_simulate.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "apps/validate_sim_outside.h"
#include "planner/simulator.h"

namespace pd::apps::validate_sim {
namespace {

std::vector<planner::InstanceConfig> TwoInstances() {
  planner::InstanceConfig p;
  p.role = planner::Role::kPrefill;
  p.coeffs.prefill = {2e-3, 1e-5, 0};
  p.coeffs.decode_small = p.coeffs.decode_large = {1e-3, 0, 1e-4};
  p.policy.max_num_seqs = 8;
  p.policy.max_num_batched_tokens = 512;
  p.policy.kv_capacity_tokens = 1 << 16;
  planner::InstanceConfig d = p;
  d.role = planner::Role::kDecode;
  return {p, d};
}

TEST(ValidateSimSimulate, EachRequestsEndGetsItsDrawnTailBesideItsOutsideLatency) {
  const auto insts = TwoInstances();
  planner::ClusterLinks links;
  std::vector<planner::SimRequest> sent;
  for (int i = 0; i < 40; ++i) sent.push_back({i, 0.05 * i, 64, i % 4 == 0 ? 1 : 8 + i % 5});
  // Tails of -1, +1 and 0 ms, and one of -30 ms that would put a request's end before its first
  // token (its end stays at its first token).
  auto outside = planner::OutsideLatency::SampledWithInbound({0.002, 0.003, 0.004, 0.005}, {}, 9,
                                                             {-0.001, 0.001, 0.0, -0.030});
  ASSERT_TRUE(outside.ok()) << outside.status().ToString();
  std::vector<planner::RequestResult> with, without;
  ValidateSlo slo;
  slo.ttft_s = slo.tpot_s = 1.0;
  slo.other = {1e-9, 1e-9};  // no request meets it
  const Result<planner::Summary> summary =
      SimulateRate(insts, links, sent, slo, *outside, nullptr, &with);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->attainment, 1.0);
  EXPECT_EQ(summary->other_attainment, 0.0);
  ASSERT_TRUE(
      SimulateRate(insts, links, sent, slo, outside->WithoutTail(), nullptr, &without).ok());
  ASSERT_EQ(with.size(), sent.size());
  ASSERT_EQ(without.size(), sent.size());
  int moved = 0;
  for (size_t i = 0; i < with.size(); ++i) {
    ASSERT_TRUE(with[i].done() && without[i].done()) << i;
    EXPECT_EQ(with[i].id, without[i].id);
    // The first token as without tails: the outside latency on it.
    EXPECT_DOUBLE_EQ(with[i].first_token_s, without[i].first_token_s) << i;
    EXPECT_GE(with[i].finish_s, with[i].first_token_s) << i;
    const double tail = outside->TailFor(with[i].id);
    if (with[i].output_len <= 1) {
      EXPECT_DOUBLE_EQ(with[i].finish_s, with[i].first_token_s) << i;
    } else {
      const double expected = std::max(without[i].finish_s + tail, without[i].first_token_s);
      EXPECT_NEAR(with[i].finish_s, expected, 1e-12) << i;
      moved += tail != 0;
    }
  }
  EXPECT_GT(moved, 10);
}

// The client side of a bench run: each request's span from first token to last is its gaps'
// sum (one token: 0); without the gaps every span is unknown (-1); with a failed request, none.
TEST(ValidateSimOutside, ClientRequestsTakeTheirSpansFromTheBenchsGaps) {
  nlohmann::json bench = {
      {"failed", 0},
      {"ttfts", {0.010, 0.020, 0.030}},
      {"input_lens", {100, 120, 90}},
      {"output_lens", {3, 1, 4}},
      {"itls", {{0.001, 0.002}, nlohmann::json::array(), {0.001, 0.001, 0.003}}}};
  const std::vector<double> arrivals = {0.0, 0.1, 0.2};
  auto c = ClientRequestsOf(bench, arrivals);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->size(), 3u);
  EXPECT_NEAR((*c)[0].span_s, 0.003, 1e-12);
  EXPECT_DOUBLE_EQ((*c)[1].span_s, 0.0);
  EXPECT_NEAR((*c)[2].span_s, 0.005, 1e-12);
  EXPECT_DOUBLE_EQ((*c)[1].arrival_s, 0.1);
  EXPECT_EQ((*c)[2].prompt_tokens, 90);
  EXPECT_DOUBLE_EQ((*c)[2].ttft_s, 0.030);
  bench.erase("itls");
  c = ClientRequestsOf(bench, arrivals);
  ASSERT_TRUE(c.ok());
  for (const planner::ClientRequest& r : *c) EXPECT_DOUBLE_EQ(r.span_s, -1);
  bench["failed"] = 1;
  c = ClientRequestsOf(bench, arrivals);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->empty());
}

TEST(ValidateSimSlo, TheBatchRuleTakesTheBatchProbesTpotAndTheIdleRuleTwiceTheIdleOne) {
  ValidateFlags f;
  Result<ValidateSlo> batch = ChooseSlo(f, 0.04, 1e-3, 5e-3, 8);  // the default rule
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_DOUBLE_EQ(batch->ttft_s, 0.12);
  EXPECT_DOUBLE_EQ(batch->tpot_s, 5e-3);
  EXPECT_DOUBLE_EQ(batch->other.ttft_s, 0.12);
  EXPECT_DOUBLE_EQ(batch->other.tpot_s, 2e-3);
  f.slo_rule = "idle";
  Result<ValidateSlo> idle = ChooseSlo(f, 0.04, 1e-3, 5e-3, 8);
  ASSERT_TRUE(idle.ok());
  EXPECT_DOUBLE_EQ(idle->tpot_s, 2e-3);
  EXPECT_DOUBLE_EQ(idle->other.tpot_s, 5e-3);
  EXPECT_NE(idle->rule, batch->rule);
  EXPECT_EQ(idle->rule, batch->other_rule);
  EXPECT_EQ(batch->rule, "TPOT of the batch-8 probe");
  // --ttft / --tpot replace the used rule's figures, not the other rule's.
  f.ttft_slo_s = 0.5;
  f.tpot_slo_s = 0.01;
  Result<ValidateSlo> given = ChooseSlo(f, 0.04, 1e-3, 5e-3, 8);
  ASSERT_TRUE(given.ok());
  EXPECT_DOUBLE_EQ(given->ttft_s, 0.5);
  EXPECT_DOUBLE_EQ(given->tpot_s, 0.01);
  EXPECT_DOUBLE_EQ(given->other.tpot_s, 5e-3);
  EXPECT_DOUBLE_EQ(given->other.ttft_s, 0.12);
}

TEST(ValidateSimSlo, RejectsAnUnknownRuleAndProbesThatAreNotPositiveAndFinite) {
  ValidateFlags f;
  f.slo_rule = "p90";
  const Result<ValidateSlo> bad = ChooseSlo(f, 0.04, 1e-3, 5e-3, 8);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("--slo-rule: 'p90'"), std::string::npos);
  f.slo_rule = "batch";
  EXPECT_FALSE(ChooseSlo(f, 0.0, 1e-3, 5e-3, 8).ok());
  EXPECT_FALSE(ChooseSlo(f, 0.04, -1e-3, 5e-3, 8).ok());
  EXPECT_FALSE(ChooseSlo(f, 0.04, 1e-3, std::nan(""), 8).ok());
  EXPECT_FALSE(ChooseSlo(f, 0.04, 1e-3, INFINITY, 8).ok());
  const Result<ValidateSlo> negative = ChooseSlo(f, 0.04, -1e-3, 5e-3, 8);
  EXPECT_NE(negative.status().ToString().find("the idle TPOT probe's figure is -0.001"),
            std::string::npos)
      << negative.status().ToString();
  EXPECT_FALSE(ChooseSlo(f, 0.04, 1e-3, 5e-3, 0).ok());
}

}  // namespace
}  // namespace pd::apps::validate_sim
