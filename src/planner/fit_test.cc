#include "planner/fit.h"

#include <gtest/gtest.h>

#include <random>

namespace pd::planner {
namespace {

TEST(Fit, RecoversKnownPrefillCoefficients) {
  const std::array<double, 3> truth = {18.1, 0.1019, 7.12e-6};
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0.0, 0.002);  // 0.2% multiplicative noise
  std::vector<PrefillSample> samples;
  for (int bs : {1, 2, 4, 8})
    for (int len : {16, 64, 256, 512, 1024, 2000}) {
      const double tokens = double(bs) * len, sq = double(bs) * len * len;
      const double ms = truth[0] + truth[1] * tokens + truth[2] * sq;
      samples.push_back({int64_t(tokens), sq, ms * (1 + noise(rng))});
    }
  auto w = FitPrefill(samples);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_NEAR((*w)[0], truth[0], 0.02 * truth[0]);
  EXPECT_NEAR((*w)[1], truth[1], 0.01 * truth[1]);
  EXPECT_NEAR((*w)[2], truth[2], 0.05 * truth[2]);
}

TEST(Fit, RecoversBothDecodeRegimes) {
  const std::array<double, 3> small = {19.9, 6.27e-4, 0.0385};
  const std::array<double, 3> large = {7.17, 5.8e-4, 0.158};
  std::vector<DecodeSample> samples;
  for (int bs : {1, 4, 16, 32, 64, 96, 128, 192, 256})
    for (int ctx : {64, 300, 1000, 1900}) {
      const auto& c = bs < 95 ? small : large;
      const double sum = double(bs) * (ctx + 1);
      samples.push_back({bs, int64_t(sum), c[0] + c[1] * sum + c[2] * bs});
    }
  std::vector<PrefillSample> prefill = {
      {10, 100, 2}, {100, 10000, 12}, {300, 90000, 40}, {1000, 1e6, 200}};
  auto c = FitStepCoeffs(prefill, samples, 95);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(c->decode_small[i], small[i], 1e-6 * std::abs(small[i]) + 1e-9);
    EXPECT_NEAR(c->decode_large[i], large[i], 1e-6 * std::abs(large[i]) + 1e-9);
  }
  EXPECT_LT(DecodeRelRmse(*c, samples), 1e-9);
}

TEST(Fit, TooFewOrDegenerateSamplesAreErrors) {
  std::vector<PrefillSample> two = {{1, 1, 1}, {2, 4, 2}};
  EXPECT_EQ(FitPrefill(two).status().code(), StatusCode::kInvalidArgument);
  // Every sample has the same shape: the coefficients are not determined.
  std::vector<DecodeSample> same = {{4, 100, 5}, {4, 100, 5.1}, {4, 100, 4.9}};
  auto r = FitDecode(same);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("decode fit"), std::string::npos);
  EXPECT_EQ(FitStepCoeffs({}, {}, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(Fit, OneSidedDecodeSamplesShareCoefficients) {
  std::vector<DecodeSample> samples = {{1, 10, 1.1}, {2, 50, 1.3}, {8, 100, 1.9}, {3, 400, 1.8}};
  std::vector<PrefillSample> prefill = {{10, 100, 2}, {100, 10000, 12}, {300, 90000, 40}};
  auto c = FitStepCoeffs(prefill, samples, 95);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->decode_small, c->decode_large);
}

TEST(Fit, NonNegativeLeastSquaresKeepsAFeasibleSolutionAndClampsOthers) {
  std::vector<std::array<double, 3>> x = {{1, 1, 1}, {1, 2, 4}, {1, 3, 9}, {1, 4, 16}};
  std::vector<double> y = {3, 5, 7, 9};  // 1 + 2·t exactly
  auto free_fit = LeastSquares3(x, y);
  auto nn = NonNegativeLeastSquares3(x, y);
  ASSERT_TRUE(free_fit.ok() && nn.ok());
  for (int i = 0; i < 3; ++i) EXPECT_NEAR((*nn)[i], (*free_fit)[i], 1e-12);
  // Concave data: the free fit takes a negative t² term; the constrained one holds it at 0.
  std::vector<double> concave = {3, 5, 6.5, 7.5};
  auto bent = LeastSquares3(x, concave);
  ASSERT_TRUE(bent.ok());
  EXPECT_LT((*bent)[2], 0.0);
  auto clamped = NonNegativeLeastSquares3(x, concave);
  ASSERT_TRUE(clamped.ok());
  EXPECT_EQ((*clamped)[2], 0.0);
  EXPECT_GT((*clamped)[1], 0.0);
  // Every subset's solution is negative: an error, not a silent zero model.
  std::vector<double> negative = {-1, -2, -3, -4};
  auto none = NonNegativeLeastSquares3(x, negative);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no non-negative solution"), std::string::npos);
}

TEST(Fit, RelativeFitNeedsPositiveTimes) {
  std::vector<PrefillSample> s = {{10, 100, 1}, {20, 400, 0}, {40, 1600, 3}};
  auto r = FitPrefill(s, FitOptions{/*relative=*/true, false});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not positive"), std::string::npos);
}

}  // namespace
}  // namespace pd::planner
