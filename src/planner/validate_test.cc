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

TEST(Validate, SolveOverheadsRecoversFixedAndPerTokenCosts) {
  // resid = 5 ms + 0.01 ms per token.
  std::vector<IdleProbe> probes;
  for (int len : {16, 128, 256}) probes.push_back({len, 0.1 + 0.005 + 1e-5 * len, 0.1});
  auto o = SolveOverheads(probes, 0.004, 0.003);
  ASSERT_TRUE(o.ok());
  EXPECT_NEAR(o->fixed_s, 0.005, 1e-9);
  EXPECT_NEAR(o->per_token_s, 1e-5, 1e-12);
  EXPECT_NEAR(o->decode_step_ms, 1.0, 1e-9);
  // Costs never go negative: a real system faster than the model adds nothing.
  std::vector<IdleProbe> faster = {{16, 0.05, 0.1}, {256, 0.02, 0.1}};
  auto z = SolveOverheads(faster, 0.001, 0.003);
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->per_token_s, 0.0);
  EXPECT_EQ(z->fixed_s, 0.0);
  EXPECT_EQ(z->decode_step_ms, 0.0);
  // A model that overestimates long prompts does not hide the short prompt's fixed cost.
  std::vector<IdleProbe> noisy = {
      {16, 0.0066, 0.0018}, {128, 0.0124, 0.0165}, {256, 0.0285, 0.0413}};
  auto n = SolveOverheads(noisy, 0, 0);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->per_token_s, 0.0);
  EXPECT_NEAR(n->fixed_s, 0.0048, 1e-12);
  // One prompt length: no slope.
  auto one = SolveOverheads({{64, 0.2, 0.1}}, 0, 0);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->per_token_s, 0.0);
  EXPECT_NEAR(one->fixed_s, 0.1, 1e-12);
  EXPECT_EQ(SolveOverheads({}, 0, 0).status().code(), StatusCode::kInvalidArgument);
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
  auto j = ComparisonToJson({row});
  EXPECT_DOUBLE_EQ(j[0]["measured"]["attainment"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j[0]["rate"].get<double>(), 2.0);
}

}  // namespace
}  // namespace pd::planner
