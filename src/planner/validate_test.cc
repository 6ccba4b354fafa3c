#include "planner/validate.h"

#include <gtest/gtest.h>

#include <cmath>

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
  EXPECT_TRUE((*r)[2].failed);
  EXPECT_NEAR(Summarize(*r, Slo{0.15, 0.05}).attainment, 1.0 / 3, 1e-12);
  auto missing = MeasuredFromBenchJson({{"ttfts", {0.1}}}, "b.json");
  EXPECT_NE(missing.status().message().find("b.json: missing array 'itls'"), std::string::npos);
}

// A TTFT probe whose modelled prefill step is `prefill_ms` and first decode step 1 ms, with the
// prompt holding the prefill compute thread `scale` x that step, measured as fixed + transfer +
// scale x prefill + the first decode step (1 ms + the probes' 0.3 ms decode costs).
IdleProbe Probe(int len, double prefill_ms, double fixed_ms, double per_token_ms, double scale) {
  return {len, (fixed_ms + per_token_ms * len + scale * prefill_ms + 1.3) * 1e-3,
          (prefill_ms + 1.0) * 1e-3, prefill_ms * 1e-3, scale * prefill_ms * 1e-3};
}
const std::vector<DecodeProbe> kDecode = {{1, 1.3e-3, 1.0e-3}, {8, 3.4e-3, 1.7e-3}};

TEST(Validate, SolveOverheadsTakesTheMeasuredPrefillAndFitsTheRest) {
  // Decode 0.1 ms a step + 0.2 a sequence; prefill 1.2x the profile, 2 ms fixed, 0.01 ms a token.
  const std::vector<IdleProbe> probes = {Probe(16, 1.5, 2, 0.01, 1.2), Probe(128, 12, 2, 0.01, 1.2),
                                         Probe(256, 28, 2, 0.01, 1.2)};
  auto o = SolveOverheads(probes, kDecode);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_NEAR(o->decode_fixed_ms, 0.1, 1e-9);
  EXPECT_NEAR(o->decode_seq_ms, 0.2, 1e-9);
  EXPECT_NEAR(o->prefill_scale, 1.2, 1e-9);
  EXPECT_NEAR(o->fixed_s, 2.0e-3, 1e-9);
  EXPECT_NEAR(o->transfer_s_per_token, 0.01e-3, 1e-12);
  EXPECT_EQ(o->kv_ready_fraction, 1.0);
}

TEST(Validate, SolveOverheadsKeepsEveryTermWithinItsBound) {
  // The TTFT holds less than the measured compute: no fixed cost, no transfer; the real decode
  // faster than the model: no cost; a tiny measured compute: the scale at its floor.
  const std::vector<IdleProbe> probes = {Probe(16, 2, -3, 0, 0.1), Probe(256, 40, -3, 0, 0.1)};
  auto z = SolveOverheads(probes, {{1, 0.5e-3, 1e-3}, {8, 1e-3, 2e-3}});
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->fixed_s, 0.0);
  EXPECT_EQ(z->transfer_s_per_token, 0.0);
  EXPECT_EQ(z->prefill_scale, kMinPrefillScale);
  EXPECT_EQ(z->decode_fixed_ms, 0.0);
  EXPECT_EQ(z->decode_seq_ms, 0.0);
  // One prompt length: all fixed; one batch size: all per sequence (1 ms over a batch of 4).
  auto one = SolveOverheads({Probe(64, 10, 2, 0.01, 1.0)}, {{4, 2e-3, 1e-3}});
  ASSERT_TRUE(one.ok());
  EXPECT_NEAR(one->decode_seq_ms, 0.25, 1e-12);
  EXPECT_NEAR(one->fixed_s, (2 + 0.64 + 0.3 - 0.25) * 1e-3, 1e-12);
}

TEST(Validate, SolveOverheadsNeedsMeasuredProbesOfBothKinds) {
  EXPECT_EQ(SolveOverheads({}, kDecode).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SolveOverheads({Probe(16, 1, 1, 0, 1)}, {}).status().code(),
            StatusCode::kInvalidArgument);
  auto batch = SolveOverheads({Probe(16, 1, 1, 0, 1)}, {{0, 1e-3, 1e-3}});
  EXPECT_NE(batch.status().message().find("batch must be >= 1"), std::string::npos);
  IdleProbe unmeasured = Probe(16, 1, 1, 0, 1);
  unmeasured.measured_prefill_cpu_s = 0;
  EXPECT_EQ(SolveOverheads({unmeasured}, kDecode).status().code(), StatusCode::kInvalidArgument);
}

TEST(Validate, CorunFactorAndMedians) {
  // The median ratio, clamped to [1, 4].
  EXPECT_DOUBLE_EQ(CorunFactor({1.1, 1.3, 1.2}), 1.2);
  EXPECT_DOUBLE_EQ(CorunFactor({0.5, 0.9}), 1.0);
  EXPECT_DOUBLE_EQ(CorunFactor({5.0}), 4.0);
  EXPECT_DOUBLE_EQ(CorunFactor({}), 1.0);
  EXPECT_DOUBLE_EQ(UpperMedian({60, 40, 50, 70}), 60.0);
  EXPECT_DOUBLE_EQ(UpperMedian({}), 0.0);
}

Summary Of(double att, double ttft_ms, double tpot_ms) {
  Summary s;
  s.attainment = att;
  s.ttft_p50_s = ttft_ms * 1e-3;
  s.ttft_p90_s = 2 * ttft_ms * 1e-3;
  s.tpot_p50_s = tpot_ms * 1e-3;
  s.tpot_p90_s = 2 * tpot_ms * 1e-3;
  return s;
}

TEST(Validate, RoundsCompareByTheMedianOfEachSide) {
  const std::vector<Summary> sim = {Of(0.9, 10, 1), Of(0.8, 12, 1.2), Of(1.0, 10.5, 1.3)};
  const std::vector<Summary> real = {Of(0.9, 10, 1), Of(0.9, 20, 1), Of(0.7, 10, 1)};
  const ComparisonRow row = {2.0, MedianSummary(sim), MedianSummary(real)};
  EXPECT_DOUBLE_EQ(row.simulated.attainment, 0.9);
  EXPECT_DOUBLE_EQ(row.simulated.ttft_p50_s, 10.5e-3);
  EXPECT_DOUBLE_EQ(row.measured.ttft_p50_s, 10e-3);
  std::vector<ComparisonRow> rounds;
  for (int k = 0; k < 3; ++k) rounds.push_back({2.0, sim[k], real[k]});
  EXPECT_EQ(CellsWithin(rounds, 0.10), 5 + 0 + 2);      // round 3: TTFT p50 and p90 (+5%)
  EXPECT_EQ(CellsWithin(std::span(&row, 1), 0.10), 3);  // TPOT p50 and p90 +20%
  const Summary s = RelativeSpread(real);
  EXPECT_NEAR(s.ttft_p50_s, 1.0, 1e-12);  // (20 - 10) / 10
  EXPECT_NEAR(s.attainment, 0.2 / 0.9, 1e-12);
  const std::string t = FormatComparison(std::span(&row, 1));
  for (const char* m : {"SLO att.", "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90", "+5.0%"}) {
    EXPECT_NE(t.find(m), std::string::npos) << m << "\n" << t;
  }
  EXPECT_DOUBLE_EQ(ComparisonToJson(std::span(&row, 1))[0]["rate"].get<double>(), 2.0);
  EXPECT_TRUE(std::isinf(RelDiff(1, 0)));
  EXPECT_DOUBLE_EQ(RelDiff(0, 0), 0.0);
}

}  // namespace
}  // namespace pd::planner
