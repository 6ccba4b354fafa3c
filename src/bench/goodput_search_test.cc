#include "bench/goodput_search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "bench/report.h"

namespace pd::bench {
namespace {

using ::testing::HasSubstr;

// What every search result must hold: the curve sorted by rate, each probe's verdict matching its
// attainment, every probe at or below the goodput meeting the target and every one at or above
// the upper end missing (the bisection keeps that bracket whatever the measurements are).
void ExpectConsistent(const GoodputSearchResult& r, double target) {
  for (size_t i = 0; i < r.curve.size(); ++i) {
    const RateProbe& p = r.curve[i];
    if (i > 0) {
      EXPECT_LE(r.curve[i - 1].rate, p.rate);
    }
    EXPECT_EQ(p.meets, p.attainment >= target - 1e-12) << p.rate;
    if (p.rate <= r.goodput) {
      EXPECT_TRUE(p.meets) << p.rate;
    }
    if (r.upper > 0 && p.rate >= r.upper) {
      EXPECT_FALSE(p.meets) << p.rate;
    }
  }
}

// A smooth monotone attainment: 1 - (r - 5) / 10 on [5, 15], so 0.9 is reached at r = 6 exactly.
double Linear(double r) { return std::clamp(1.0 - (r - 5.0) / 10.0, 0.0, 1.0); }

TEST(GoodputSearchTest, FindsAMonotoneThresholdToThePrecision) {
  for (double start : {0.3, 1.0, 6.0, 100.0}) {
    for (double precision : {0.1, 0.01}) {
      GoodputSearchOptions o;
      o.start_rate = start;
      o.precision = precision;
      auto r = SearchGoodput(o, [](double rate) -> Result<double> { return Linear(rate); });
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->bracketed);
      EXPECT_TRUE(r->monotone);
      EXPECT_LE(r->goodput, 6.0) << start;
      EXPECT_GT(r->upper, 6.0) << start;
      EXPECT_LE(r->upper - r->goodput, precision * r->goodput) << start;
      ExpectConsistent(*r, 0.9);
    }
  }
}

TEST(GoodputSearchTest, NeverMissingStopsAtTheMaxRateAndAlwaysMissingReportsZero) {
  GoodputSearchOptions o;
  o.max_rate = 50;
  auto all = SearchGoodput(o, [](double) -> Result<double> { return 1.0; });
  ASSERT_TRUE(all.ok());
  EXPECT_FALSE(all->bracketed);
  EXPECT_EQ(all->goodput, 50.0);
  EXPECT_EQ(all->upper, 0.0);
  EXPECT_EQ(all->curve.back().rate, 50.0);
  o.min_rate = 0.1;
  auto none = SearchGoodput(o, [](double) -> Result<double> { return 0.5; });
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->bracketed);
  EXPECT_EQ(none->goodput, 0.0);
  EXPECT_GE(none->curve.front().rate, 0.1);  // 1, 0.5, 0.25, 0.125: below 0.1 is not probed
  EXPECT_EQ(none->curve.size(), 4u);
}

// Noise: attainment 1 - r/20 with a ±0.04 ripple, target 0.9: the noiseless threshold is r = 2,
// the ripple moves the crossing anywhere in [1.2, 2.8] and makes attainment rise with the rate in
// places. The search trusts each probe (as DistServe's bisection does): it still returns a
// consistent bracket to the precision, somewhere in the ripple's band, and says the walked curve
// was not monotone.
TEST(GoodputSearchTest, NoisyCurveGivesAConsistentBracketAndIsFlagged) {
  GoodputSearchOptions o;
  o.start_rate = 1;
  o.precision = 0.01;
  auto noisy = [](double r) -> Result<double> {
    return std::clamp(1.0 - r / 20.0 + 0.04 * std::sin(13.0 * r), 0.0, 1.0);
  };
  auto r = SearchGoodput(o, noisy);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->bracketed);
  EXPECT_GE(r->goodput, 1.2);
  EXPECT_LE(r->goodput, 2.8);
  EXPECT_LE(r->upper - r->goodput, 0.01 * r->goodput);
  ExpectConsistent(*r, 0.9);
  EXPECT_FALSE(r->monotone);
}

TEST(GoodputSearchTest, BadOptionsAndMeasureErrors) {
  auto ok = [](double) -> Result<double> { return 1.0; };
  for (double a : {0.0, -0.5, 1.01}) {
    GoodputSearchOptions o;
    o.attainment = a;
    auto r = SearchGoodput(o, ok);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("--attainment must be in (0, 1]"));
  }
  GoodputSearchOptions p;
  p.precision = 0;
  EXPECT_THAT(SearchGoodput(p, ok).status().message(), HasSubstr("--precision"));
  GoodputSearchOptions s;
  s.start_rate = INFINITY;
  EXPECT_FALSE(SearchGoodput(s, ok).ok());
  int calls = 0;
  auto failing = [&](double) -> Result<double> {
    if (++calls == 3) return Unavailable("server gone");
    return 1.0;
  };
  auto r = SearchGoodput(GoodputSearchOptions{}, failing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(calls, 3);
}

TEST(ReportTest, ParsesSlosWithUnitsAndRateLists) {
  auto slo = ParseSlo("--slo", {"ttft:500ms", "tpot:0.1s", "e2el:2s"});
  ASSERT_TRUE(slo.ok()) << slo.status().ToString();
  EXPECT_EQ((*slo)["ttft"], 500);
  EXPECT_DOUBLE_EQ((*slo)["tpot"], 100);
  EXPECT_EQ((*slo)["e2el"], 2000);
  EXPECT_THAT(ParseSlo("--slo", {"ttft:500"}).status().message(), HasSubstr("has no unit"));
  EXPECT_THAT(ParseSlo("--slo", {"ttft:500us"}).status().message(), HasSubstr("unknown unit"));
  EXPECT_THAT(ParseSlo("--goodput-search", {"itl:5ms"}).status().message(),
              HasSubstr("--goodput-search: unknown SLO 'itl'"));
  EXPECT_FALSE(ParseSlo("--slo", {"ttft:-5ms"}).ok());
  EXPECT_FALSE(ParseSlo("--slo", {"ttft"}).ok());
  EXPECT_FALSE(ParseSlo("--slo", {"ttft:5ms", "ttft:6ms"}).ok());
  auto rates = ParseRequestRates("1,2.5,inf");
  ASSERT_TRUE(rates.ok());
  ASSERT_EQ(rates->size(), 3u);
  EXPECT_EQ((*rates)[1], 2.5);
  EXPECT_TRUE(std::isinf((*rates)[2]));
  for (const char* bad : {"0", "-1", "1,,2", "x", "1,0"}) {
    auto r = ParseRequestRates(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("--request-rate"));
  }
}

TEST(ReportTest, AttainmentPerSloCountsFailuresAsMisses) {
  std::vector<RequestResult> results(4);
  results[0] = {true, 200, "", 10, 5, 0.1, 0.5, {}, 0};  // ttft 100 ms, tpot 100 ms
  results[1] = {true, 200, "", 10, 3, 0.3, 0.4, {}, 0};  // ttft 300 ms, tpot 50 ms
  results[2] = {true, 200, "", 10, 1, 0.1, 0.1, {}, 0};  // one token: no TPOT, meets it
  results[3] = {false, 500, "boom", 10, 0, 0, 0, {}, 0};
  const Attainment a = ComputeAttainment(results, {{"ttft", 200}, {"tpot", 60}});
  EXPECT_DOUBLE_EQ(a.by_metric.at("ttft"), 0.5);
  EXPECT_DOUBLE_EQ(a.by_metric.at("tpot"), 0.5);
  EXPECT_DOUBLE_EQ(a.both, 0.25);
  const auto j = AttainmentJson(ComputeAttainment(results, {{"ttft", 200}}));
  EXPECT_TRUE(j["tpot"].is_null());
  EXPECT_DOUBLE_EQ(j["both"].get<double>(), 0.5);
}

}  // namespace
}  // namespace pd::bench
