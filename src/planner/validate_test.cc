#include "planner/validate.h"

#include <gtest/gtest.h>

namespace pd::planner {
namespace {

TEST(Validate, MeasuredFromBenchJsonTakesTtftAndMeanGap) {
  nlohmann::json bench = {{"ttfts", {0.1, 0.2}},
                          {"itls", {{0.01, 0.03}, nlohmann::json::array()}},
                          {"output_lens", {3, 1}},
                          {"failed", 1}};
  auto r = MeasuredFromBenchJson(bench, "b.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_DOUBLE_EQ((*r)[0].ttft_s(), 0.1);
  EXPECT_NEAR((*r)[0].tpot_s(), 0.02, 1e-12);  // (0.01 + 0.03) / (3 - 1)
  EXPECT_DOUBLE_EQ((*r)[1].tpot_s(), 0.0);
  EXPECT_TRUE((*r)[2].failed);
  const Summary s = Summarize(*r, Slo{0.15, 0.05});
  EXPECT_EQ(s.num_failed, 1);
  EXPECT_NEAR(s.attainment, 1.0 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(s.other_attainment, -1.0);  // no second SLO
  // A second SLO on the same requests: a looser TTFT takes in the second request too; the
  // failed one meets no SLO.
  const Summary both = Summarize(*r, Slo{0.15, 0.05}, Slo{0.25, 0.05});
  EXPECT_NEAR(both.attainment, 1.0 / 3, 1e-12);
  EXPECT_NEAR(both.other_attainment, 2.0 / 3, 1e-12);
  EXPECT_NEAR(Attainment(*r, Slo{0.25, 0.01}), 1.0 / 3, 1e-12);  // the first's TPOT misses
  EXPECT_DOUBLE_EQ(Attainment({}, Slo{1, 1}), 0.0);
}

TEST(Validate, MalformedBenchJsonIsAClearError) {
  auto missing = MeasuredFromBenchJson({{"ttfts", {0.1}}}, "b.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("b.json: missing array 'itls'"), std::string::npos);
  auto uneven = MeasuredFromBenchJson(
      {{"ttfts", {0.1, 0.2}}, {"itls", {{0.1}}}, {"output_lens", {2, 2}}}, "b.json");
  EXPECT_NE(uneven.status().message().find("differ in length"), std::string::npos);
  auto bad =
      MeasuredFromBenchJson({{"ttfts", {"x"}}, {"itls", {{0.1}}}, {"output_lens", {2}}}, "b.json");
  EXPECT_NE(bad.status().message().find("request 0 is malformed"), std::string::npos);
}

// A TTFT probe whose modelled prefill step is `prefill_ms` and first decode step 1 ms, measured
// as `fixed_ms` + scale · prefill + 1 ms.
IdleProbe Probe(int len, double prefill_ms, double fixed_ms, double scale) {
  return {len, (fixed_ms + scale * prefill_ms + 1.0) * 1e-3, (prefill_ms + 1.0) * 1e-3,
          prefill_ms * 1e-3};
}

TEST(Validate, SolveOverheadsRecoversFixedCostPrefillScaleAndDecodeCosts) {
  // The real prefill is 1.4x the profile, 3 ms fixed; decode 0.1 ms per step + 0.2 per sequence.
  std::vector<IdleProbe> probes = {Probe(16, 1.5, 3, 1.4), Probe(128, 12, 3, 1.4),
                                   Probe(256, 28, 3, 1.4)};
  std::vector<DecodeProbe> decode = {{1, 1.3e-3, 1.0e-3}, {8, 3.4e-3, 1.7e-3}};
  auto o = SolveOverheads(probes, decode);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_NEAR(o->fixed_s, 2.7e-3, 1e-9);  // 3 ms less the first token's 0.3 ms decode costs
  EXPECT_NEAR(o->prefill_scale, 1.4, 1e-9);
  EXPECT_NEAR(o->decode_fixed_ms, 0.1, 1e-9);
  EXPECT_NEAR(o->decode_seq_ms, 0.2, 1e-9);
}

TEST(Validate, SolveOverheadsTakesTheMeasuredPrefillComputeAndFitsTheRestAsTransfer) {
  // The prefill instance computes 1.2x the profile (measured); the TTFT also holds 2 ms fixed and
  // 0.01 ms per prompt token of transfer; decode 0.1 ms per step + 0.2 per sequence.
  std::vector<IdleProbe> probes;
  for (auto [len, prefill_ms] : {std::pair{16, 1.5}, {128, 12.0}, {256, 28.0}}) {
    IdleProbe p = Probe(len, prefill_ms, 0, 1.2);
    p.measured_ttft_s += (2.0 + 0.3 + 0.01 * len) * 1e-3;  // + the first step's 0.3 ms extra
    p.measured_prefill_cpu_s = 1.2 * prefill_ms * 1e-3;
    probes.push_back(p);
  }
  auto o = SolveOverheads(probes, {{1, 1.3e-3, 1.0e-3}, {8, 3.4e-3, 1.7e-3}});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_NEAR(o->prefill_scale, 1.2, 1e-9);
  EXPECT_NEAR(o->fixed_s, 2.0e-3, 1e-9);
  EXPECT_NEAR(o->transfer_s_per_token, 0.01e-3, 1e-12);
  // One probe without its compute time: the TTFT-only fit, no transfer term.
  probes[1].measured_prefill_cpu_s = 0;
  auto old = SolveOverheads(probes, {{1, 1.3e-3, 1.0e-3}, {8, 3.4e-3, 1.7e-3}});
  ASSERT_TRUE(old.ok());
  EXPECT_DOUBLE_EQ(old->transfer_s_per_token, 0.0);
}

TEST(Validate, SolveOverheadsWithMeasuredPrefillKeepsTheRestNonNegative) {
  // The TTFT holds less than the measured compute (noise): no fixed cost, no transfer.
  std::vector<IdleProbe> probes = {Probe(16, 1.5, 0, 1.0), Probe(256, 28, 0, 1.0)};
  for (IdleProbe& p : probes) p.measured_prefill_cpu_s = 1.5 * p.modelled_prefill_s;
  auto o = SolveOverheads(probes, {{1, 1.0e-3, 1.0e-3}});
  ASSERT_TRUE(o.ok());
  EXPECT_NEAR(o->prefill_scale, 1.5, 1e-9);
  EXPECT_DOUBLE_EQ(o->fixed_s, 0.0);
  EXPECT_DOUBLE_EQ(o->transfer_s_per_token, 0.0);
}

TEST(Validate, SolveOverheadsKeepsEveryTermWithinItsBound) {
  // The real system faster than the model everywhere: no cost, the scale at its floor.
  std::vector<IdleProbe> faster = {Probe(16, 2, 0, 0.1), Probe(256, 40, 0, 0.1)};
  auto z = SolveOverheads(faster, {{1, 0.5e-3, 1e-3}, {8, 1e-3, 2e-3}});
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->fixed_s, 0.0);
  EXPECT_EQ(z->prefill_scale, kMinPrefillScale);
  EXPECT_EQ(z->decode_fixed_ms, 0.0);
  EXPECT_EQ(z->decode_seq_ms, 0.0);
  // A slope that would make the fixed cost negative: fixed held at 0, the scale refitted.
  std::vector<IdleProbe> steep = {Probe(16, 2, -1, 1.5), Probe(256, 40, -1, 1.5)};
  auto s = SolveOverheads(steep, {{1, 1e-3, 1e-3}});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->fixed_s, 0.0);
  EXPECT_GT(s->prefill_scale, 1.4);
  EXPECT_LT(s->prefill_scale, 1.5);
  // Per-sequence cost falling with the batch: all per step instead.
  auto d = SolveOverheads({Probe(16, 2, 1, 1)}, {{1, 1.5e-3, 1e-3}, {8, 1.4e-3, 1e-3}});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->decode_seq_ms, 0.0);
  EXPECT_NEAR(d->decode_fixed_ms, 0.45, 1e-9);
}

TEST(Validate, SolveOverheadsWithOneShapeEachFallsBackToTheModelsForm) {
  // One prompt length: the scale is not identifiable, the residual is all fixed.
  auto one = SolveOverheads({Probe(64, 10, 2, 1.5)}, {{4, 2e-3, 1e-3}});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->prefill_scale, 1.0);
  EXPECT_NEAR(one->fixed_s, 6.75e-3, 1e-12);  // 2 ms + 0.5 x 10 ms, less the 0.25 ms below
  // One batch size: the residual is per sequence (1 ms over a batch of 4).
  EXPECT_EQ(one->decode_fixed_ms, 0.0);
  EXPECT_NEAR(one->decode_seq_ms, 0.25, 1e-12);
}

TEST(Validate, SolveOverheadsNeedsProbesOfBothKinds) {
  EXPECT_EQ(SolveOverheads({}, {{1, 1e-3, 1e-3}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SolveOverheads({Probe(16, 1, 1, 1)}, {}).status().code(), StatusCode::kInvalidArgument);
  auto bad = SolveOverheads({Probe(16, 1, 1, 1)}, {{0, 1e-3, 1e-3}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("batch must be >= 1"), std::string::npos);
}

TEST(Validate, ComparisonTableHasEveryMetricAndTheRelativeDifference) {
  ComparisonRow row;
  row.rate = 2;
  row.simulated.attainment = 0.9;
  row.measured.attainment = 1.0;
  row.simulated.ttft_p50_s = 0.11;
  row.measured.ttft_p50_s = 0.1;
  const std::string t = FormatComparison({row});
  for (const char* m : {"SLO att.", "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90"}) {
    EXPECT_NE(t.find(m), std::string::npos) << m;
  }
  EXPECT_NE(t.find("-10.0%"), std::string::npos) << t;
  EXPECT_NE(t.find("+10.0%"), std::string::npos) << t;
  EXPECT_DOUBLE_EQ(RelDiff(0, 0), 0.0);
  EXPECT_TRUE(std::isinf(RelDiff(1, 0)));
  EXPECT_EQ(t.find("att. other"), std::string::npos) << t;  // neither side has a second SLO
  auto j = ComparisonToJson({row});
  EXPECT_DOUBLE_EQ(j[0]["measured"]["attainment"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j[0]["rate"].get<double>(), 2.0);
  EXPECT_FALSE(j[0]["measured"].contains("other_attainment"));
  row.simulated.other_attainment = 0.6;
  row.measured.other_attainment = 0.5;
  const std::string other = FormatComparison({row});
  EXPECT_NE(other.find("att. other"), std::string::npos) << other;
  EXPECT_NE(other.find("+20.0%  (not compared)"), std::string::npos) << other;
  j = ComparisonToJson({row});
  EXPECT_DOUBLE_EQ(j[0]["simulated"]["other_attainment"].get<double>(), 0.6);
  EXPECT_DOUBLE_EQ(j[0]["measured"]["other_attainment"].get<double>(), 0.5);
}

}  // namespace
}  // namespace pd::planner
