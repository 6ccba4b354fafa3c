#include "planner/validate_stats.h"

#include <cmath>

#include <gtest/gtest.h>

namespace pd::planner {
namespace {

Summary Round(double att, double ttft50, double tpot90, int failed = 0) {
  Summary s;
  s.num_requests = 100;
  s.num_failed = failed;
  s.attainment = att;
  s.ttft_p50_s = ttft50;
  s.ttft_p90_s = 2 * ttft50;
  s.tpot_p50_s = tpot90 / 2;
  s.tpot_p90_s = tpot90;
  return s;
}

TEST(ValidateStats, MedianSummaryTakesEachMetricsMedianSeparately) {
  const std::vector<Summary> rounds = {Round(0.9, 0.030, 0.004, 1), Round(0.7, 0.010, 0.002, 3),
                                       Round(0.8, 0.020, 0.009, 2)};
  const Summary m = MedianSummary(rounds);
  EXPECT_DOUBLE_EQ(m.attainment, 0.8);
  EXPECT_DOUBLE_EQ(m.ttft_p50_s, 0.020);
  EXPECT_DOUBLE_EQ(m.ttft_p90_s, 0.040);
  EXPECT_DOUBLE_EQ(m.tpot_p90_s, 0.004);  // from round 1, while TTFT's came from round 3
  EXPECT_EQ(m.num_failed, 2);             // the round with the median attainment
  EXPECT_EQ(m.num_requests, 100);
  EXPECT_DOUBLE_EQ(m.other_attainment, -1.0);  // no round has a second SLO
}

TEST(ValidateStats, TheOtherAttainmentHasItsOwnMedianAndSpreadWhenEveryRoundHasOne) {
  std::vector<Summary> rounds = {Round(0.9, 0.030, 0.004), Round(0.7, 0.010, 0.002),
                                 Round(0.8, 0.020, 0.009)};
  rounds[0].other_attainment = 0.95;
  rounds[1].other_attainment = 0.99;
  EXPECT_DOUBLE_EQ(MedianSummary(rounds).other_attainment, -1.0);  // one round lacks it
  EXPECT_DOUBLE_EQ(RelativeSpread(rounds).other_attainment, -1.0);
  rounds[2].other_attainment = 0.97;
  EXPECT_DOUBLE_EQ(MedianSummary(rounds).other_attainment, 0.97);
  const Spread s = RelativeSpread(rounds);
  EXPECT_NEAR(s.other_attainment, 0.04 / 0.97, 1e-12);
  EXPECT_NEAR(s.attainment, 0.2 / 0.8, 1e-12);
  EXPECT_NE(FormatSpread(s).find("| att at the other SLO 4%"), std::string::npos)
      << FormatSpread(s);
}

TEST(ValidateStats, MedianOfAnEvenCountIsTheUpperOneAndOfNothingIsEmpty) {
  const std::vector<Summary> two = {Round(0.5, 0.01, 0.001), Round(0.6, 0.02, 0.002)};
  EXPECT_DOUBLE_EQ(MedianSummary(two).attainment, 0.6);
  const Summary none = MedianSummary({});
  EXPECT_EQ(none.num_requests, 0);
  EXPECT_DOUBLE_EQ(none.ttft_p50_s, 0.0);
}

TEST(ValidateStats, SteadyCapacityIgnoresOneFastSet) {
  // Run 3 of 2026-11-29: the first set caught a fast spell (+25%); the median does not follow it.
  auto c = SteadyCapacity({85.7, 68.9, 68.0});
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(*c, 68.9);
  auto slow = SteadyCapacity({50.0, 69.0, 70.0, 90.0, 71.0});
  ASSERT_TRUE(slow.ok());
  EXPECT_DOUBLE_EQ(*slow, 70.0);
}

TEST(ValidateStats, SteadyCapacityOfAnEvenCountIsTheLowerMiddle) {
  auto two = SteadyCapacity({80.0, 60.0});
  ASSERT_TRUE(two.ok());
  EXPECT_DOUBLE_EQ(*two, 60.0);
  auto four = SteadyCapacity({60.0, 90.0, 70.0, 80.0});
  ASSERT_TRUE(four.ok());
  EXPECT_DOUBLE_EQ(*four, 70.0);
}

TEST(ValidateStats, SteadyCapacityRejectsOneSetAndBadCapacities) {
  EXPECT_EQ(SteadyCapacity({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SteadyCapacity({60.0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SteadyCapacity({60.0, 0.0, 70.0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SteadyCapacity({60.0, -1.0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SteadyCapacity({60.0, std::nan("")}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SteadyCapacity({60.0, INFINITY}).status().code(), StatusCode::kInvalidArgument);
}

TEST(ValidateStats, RelativeSpreadIsRangeOverMedian) {
  const std::vector<Summary> rounds = {Round(0.9, 0.030, 0.004), Round(0.7, 0.010, 0.002),
                                       Round(0.8, 0.020, 0.010)};
  const Spread s = RelativeSpread(rounds);
  EXPECT_NEAR(s.attainment, 0.2 / 0.8, 1e-12);
  EXPECT_NEAR(s.ttft_p50, 0.020 / 0.020, 1e-12);
  EXPECT_NEAR(s.tpot_p90, 0.008 / 0.004, 1e-12);
  EXPECT_DOUBLE_EQ(RelativeSpread({}).attainment, 0.0);
  const std::vector<Summary> zero = {Round(0.0, 0.01, 0.001), Round(0.0, 0.01, 0.001)};
  EXPECT_DOUBLE_EQ(RelativeSpread(zero).attainment, 0.0);  // median 0: no spread reported
  EXPECT_DOUBLE_EQ(RelativeSpread(zero).ttft_p50, 0.0);    // identical rounds
  EXPECT_EQ(FormatSpread(s), "att 25% | TTFT p50 100% p90 100% | TPOT p50 200% p90 200%");
}

TEST(ValidateStats, ClientCpuCostSplitsFixedAndPerTokenParts) {
  // 1 ms per request + 0.05 ms per token: 2 tokens cost 1.1 ms, 32 tokens 2.6 ms.
  auto c = SolveClientCpuCost(2, 1.1e-3, 32, 2.6e-3);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NEAR(c->per_request_s, 1e-3, 1e-12);
  EXPECT_NEAR(c->per_token_s, 0.05e-3, 1e-12);
  EXPECT_NEAR(c->Seconds(10), 1.5e-3, 1e-12);
}

TEST(ValidateStats, ClientCpuCostKeepsBothPartsNonNegative) {
  auto flat = SolveClientCpuCost(2, 2e-3, 32, 1e-3);  // longer outputs cheaper: noise
  ASSERT_TRUE(flat.ok());
  EXPECT_DOUBLE_EQ(flat->per_token_s, 0.0);
  EXPECT_NEAR(flat->per_request_s, 1.5e-3, 1e-12);
  auto steep = SolveClientCpuCost(2, 0.1e-3, 32, 3.2e-3);  // would need a negative fixed part
  ASSERT_TRUE(steep.ok());
  EXPECT_DOUBLE_EQ(steep->per_request_s, 0.0);
  EXPECT_NEAR(steep->per_token_s, (0.2e-3 + 102.4e-3) / (4 + 1024), 1e-12);
}

TEST(ValidateStats, LoadedClientCpuCostKeepsTheProbesSplitAtTheMeasuredMean) {
  const ClientCpuCost probe{1e-3, 0.0625e-3};  // 3 ms for a 32-token request
  // 100 requests of 32 tokens cost 0.6 s under load: 6 ms each, twice the probes' figure.
  auto c = LoadedClientCpuCost(probe, 0.6, 100, 32);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NEAR(c->per_request_s, 2e-3, 1e-12);
  EXPECT_NEAR(c->per_token_s, 0.125e-3, 1e-12);
  EXPECT_NEAR(c->Seconds(32), 6e-3, 1e-12);
  // Cheaper under load scales down alike.
  auto cheaper = LoadedClientCpuCost(probe, 0.15, 100, 32);
  ASSERT_TRUE(cheaper.ok());
  EXPECT_NEAR(cheaper->Seconds(32), 1.5e-3, 1e-12);
  EXPECT_NEAR(cheaper->per_request_s / cheaper->per_token_s, 16.0, 1e-9);
}

TEST(ValidateStats, LoadedClientCpuCostWithoutAProbeFigureIsAllPerRequest) {
  auto c = LoadedClientCpuCost({}, 0.4, 100, 32);
  ASSERT_TRUE(c.ok());
  EXPECT_NEAR(c->per_request_s, 4e-3, 1e-12);
  EXPECT_EQ(c->per_token_s, 0.0);
  auto none = LoadedClientCpuCost({1e-3, 0.0}, 0.0, 10, 32);  // nothing measured: costs nothing
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->Seconds(32), 0.0);
}

TEST(ValidateStats, LoadedClientCpuCostRefusesUnusableRuns) {
  const ClientCpuCost probe{1e-3, 0.0};
  EXPECT_EQ(LoadedClientCpuCost(probe, 0.5, 0, 32).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadedClientCpuCost(probe, -0.5, 10, 32).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadedClientCpuCost(probe, 0.5, 10, -1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadedClientCpuCost(probe, std::nan(""), 10, 32).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ValidateStats, ClientCpuCostRefusesUnusableProbes) {
  EXPECT_EQ(SolveClientCpuCost(8, 1e-3, 8, 2e-3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SolveClientCpuCost(0, 1e-3, 8, 2e-3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SolveClientCpuCost(2, -1e-3, 8, 2e-3).status().code(), StatusCode::kInvalidArgument);
}

TEST(ValidateStats, BackgroundCpuStretchIsOneOverTheCoreShareLeft) {
  const ClientCpuCost cost{1e-3, 0.1e-3};  // 4 ms for 30 tokens
  // 50 req/s x 4 ms = 0.2 cores over 2 cores: u = 0.1, stretch 1 / 0.9.
  auto s = BackgroundCpuStretch(cost, 50, 30, 2);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(*s, 1 / 0.9, 1e-12);
  EXPECT_DOUBLE_EQ(*BackgroundCpuStretch(cost, 0, 30, 2), 1.0);
  EXPECT_NEAR(*BackgroundCpuStretch(cost, 1e6, 30, 2), 10.0, 1e-9);  // u capped at 0.9
  // The instance's own threads, 2 ms per request on its core alone: u = 0.1 + 50 x 2 ms = 0.2.
  EXPECT_NEAR(*BackgroundCpuStretch(cost, 50, 30, 2, ClientCpuCost{2e-3, 0.0}), 1 / 0.8, 1e-12);
  EXPECT_NEAR(*BackgroundCpuStretch({}, 50, 30, 1, ClientCpuCost{0.0, 0.1e-3}), 1 / 0.85, 1e-12);
  EXPECT_EQ(BackgroundCpuStretch(cost, -1, 30, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BackgroundCpuStretch(cost, 1, 30, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(ValidateStats, SaturationRateKeepsTheStretchedInstanceExactlyBusy) {
  // 10 ms of work per request; the client and router take 2 ms per request over 2 cores (1 ms
  // from this core) and the instance's own threads 1 ms: 2 ms of background per request.
  const ClientCpuCost shared{2e-3, 0.0}, own{1e-3, 0.0};
  auto rate = SaturationRate(10e-3, 2e-3);
  ASSERT_TRUE(rate.ok());
  EXPECT_NEAR(*rate, 1 / 12e-3, 1e-9);
  auto stretch = BackgroundCpuStretch(shared, *rate, 0, 2, own);
  ASSERT_TRUE(stretch.ok());
  EXPECT_NEAR(*rate * 10e-3 * *stretch, 1.0, 1e-12);  // busy all the time
  EXPECT_NEAR(*SaturationRate(10e-3, 0), 100.0, 1e-9);
  EXPECT_EQ(SaturationRate(0, 1e-3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SaturationRate(1e-3, -1e-3).status().code(), StatusCode::kInvalidArgument);
}

TEST(ValidateStats, CorunFactorIsTheMedianPairRatioHeldBetweenOneAndFour) {
  // Ratios 1.10, 1.30, 1.05: the median pair, not the ratio of the sums (1.30 would pull it).
  const std::vector<double> alone = {1.0, 2.0, 4.0}, busy = {1.1, 2.6, 4.2};
  EXPECT_NEAR(CorunFactor(alone, busy), 1.10, 1e-12);
  // Faster while busy is noise: 1. A ratio past 4 is capped.
  EXPECT_EQ(CorunFactor(std::vector<double>{2.0, 2.0}, std::vector<double>{1.5, 1.9}), 1.0);
  EXPECT_EQ(CorunFactor(std::vector<double>{1.0}, std::vector<double>{9.0}), 4.0);
}

TEST(ValidateStats, CorunFactorSkipsUnmeasuredPairsAndIsOneWithoutAny) {
  // The pair with a zero side (an unreadable schedstat) is left out: median of 1.2 and 1.4.
  EXPECT_NEAR(CorunFactor(std::vector<double>{1.0, 0.0, 1.0}, std::vector<double>{1.2, 5.0, 1.4}),
              1.4, 1e-12);
  EXPECT_EQ(CorunFactor(std::vector<double>{}, std::vector<double>{}), 1.0);
  EXPECT_EQ(CorunFactor(std::vector<double>{0.0}, std::vector<double>{1.0}), 1.0);
  EXPECT_EQ(CorunFactor(std::vector<double>{1.0, 1.0}, std::vector<double>{2.0}), 1.0);
}

TEST(ValidateStats, StretchAtRateScalesTheMeasuredCoreShareWithTheRate) {
  // 1.25 at 30 req/s: a fifth of the core; at 15 req/s a tenth, at 0 none.
  auto at = [](double rate) { return StretchAtRate(1.25, 30.0, rate); };
  ASSERT_TRUE(at(30).ok());
  EXPECT_NEAR(*at(30), 1.25, 1e-12);
  EXPECT_NEAR(*at(15), 1.0 / 0.9, 1e-12);
  EXPECT_NEAR(*at(0), 1.0, 1e-12);
  EXPECT_NEAR(*at(135), 10.0, 1e-9);  // the share capped at 0.9
  // Steps faster than the model under load: the share is negative and scales alike.
  EXPECT_NEAR(*StretchAtRate(0.8, 30.0, 15.0), 1.0 / 1.125, 1e-12);
}

TEST(ValidateStats, StretchAtRateRefusesUnusableMeasurements) {
  EXPECT_EQ(StretchAtRate(0.0, 30, 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(StretchAtRate(1.1, 0.0, 10).ok());
  EXPECT_FALSE(StretchAtRate(1.1, 30, -1).ok());
  EXPECT_FALSE(StretchAtRate(std::nan(""), 30, 10).ok());
}

}  // namespace
}  // namespace pd::planner
