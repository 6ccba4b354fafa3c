#include "planner/paired_rounds.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace pd::planner {
namespace {

Summary Att(double attainment, double ttft_p50_s = 0.02) {
  Summary s;
  s.attainment = attainment;
  s.ttft_p50_s = ttft_p50_s;
  s.ttft_p90_s = 2 * ttft_p50_s;
  s.tpot_p50_s = 0.001;
  s.tpot_p90_s = 0.002;
  return s;
}

TEST(ValidatePairedRounds, EachRoundTakesTheRunThatEndedLastBeforeIt) {
  // Interleaved as validate-sim runs them: run 0, round 0, run 1, round 1, run 2, round 2.
  const std::vector<RunWindow> runs = {{0, 5}, {20, 25}, {40, 45}};
  const std::vector<RunWindow> rounds = {{6, 18}, {26, 38}, {46, 58}};
  auto p = PairRunsWithRounds(runs, rounds);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, (std::vector<size_t>{0, 1, 2}));
}

TEST(ValidatePairedRounds, NeverTakesARunAfterOrDuringTheRound) {
  // Runs listed out of order; run 0 comes after every round's start but the last's, and run 2
  // ends inside round 1: neither may calibrate a round it does not precede.
  const std::vector<RunWindow> runs = {{40, 45}, {0, 5}, {20, 30}};
  const std::vector<RunWindow> rounds = {{26, 38}, {6, 18}, {46, 58}};
  auto p = PairRunsWithRounds(runs, rounds);
  // Round 0 (26-38): only run 1 ended before 26, and round 1 (6-18) needs run 1 as well.
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
  const std::vector<RunWindow> ok_rounds = {{31, 38}, {6, 18}, {46, 58}};
  auto q = PairRunsWithRounds(runs, ok_rounds);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(*q, (std::vector<size_t>{2, 1, 0}));
}

TEST(ValidatePairedRounds, RefusesARoundWithoutARunBeforeIt) {
  const std::vector<RunWindow> runs = {{10, 15}};
  const std::vector<RunWindow> rounds = {{0, 9}};
  auto p = PairRunsWithRounds(runs, rounds);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(PairRunsWithRounds({}, rounds).ok());
}

TEST(ValidatePairedRounds, RefusesTwoRoundsSharingOneRun) {
  // Round 1's own run is missing: the run before round 0 is not "just before" round 1.
  const std::vector<RunWindow> runs = {{0, 5}};
  const std::vector<RunWindow> rounds = {{6, 18}, {26, 38}};
  auto p = PairRunsWithRounds(runs, rounds);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
}

TEST(ValidatePairedRounds, RefusesBrokenWindows) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<RunWindow> good = {{0, 5}};
  for (const RunWindow bad : {RunWindow{5, 4}, RunWindow{nan, 4}, RunWindow{0, nan}}) {
    const std::vector<RunWindow> bad_runs = {bad};
    const std::vector<RunWindow> bad_rounds = {bad};
    EXPECT_EQ(PairRunsWithRounds(bad_runs, good).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(PairRunsWithRounds(good, bad_rounds).status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(ValidatePairedRounds, EachRoundGetsTheFirstRunThatBeganAfterItEnded) {
  // Listed out of order; run 1 begins inside round 0 (16 < 18), so round 0's run after is run 0
  // (20), not run 1; the last round has none.
  const std::vector<RunWindow> runs = {{20, 25}, {16, 19}, {40, 45}, {0, 5}};
  const std::vector<RunWindow> rounds = {{46, 58}, {6, 18}, {26, 38}};
  auto a = RunsAfterRounds(runs, rounds);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->size(), 3u);
  EXPECT_FALSE((*a)[0]);
  EXPECT_EQ((*a)[1], std::optional<size_t>(0));
  EXPECT_EQ((*a)[2], std::optional<size_t>(2));
  // A run beginning just as the round ends counts as after it.
  const std::vector<RunWindow> at_end = {{18, 20}};
  const std::vector<RunWindow> one = {{6, 18}};
  auto b = RunsAfterRounds(at_end, one);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)[0], std::optional<size_t>(0));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<RunWindow> broken = {{nan, 1}};
  EXPECT_EQ(RunsAfterRounds(broken, one).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RunsAfterRounds(one, broken).status().code(), StatusCode::kInvalidArgument);
}

TEST(ValidatePairedRounds, ComparesTheMediansOfEachSideAndKeepsEachRoundsPair) {
  // Round 2 fell into a slow spell, and so did the simulation from its own calibration run.
  const std::vector<Summary> sim = {Att(0.95, 0.018), Att(0.60, 0.030), Att(0.90, 0.020)};
  const std::vector<Summary> real = {Att(0.97, 0.019), Att(0.55, 0.032), Att(0.93, 0.021)};
  auto p = ComparePaired(15.0, sim, real);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_DOUBLE_EQ(p->row.rate, 15.0);
  EXPECT_DOUBLE_EQ(p->row.simulated.attainment, 0.90);
  EXPECT_DOUBLE_EQ(p->row.measured.attainment, 0.93);
  EXPECT_DOUBLE_EQ(p->row.simulated.ttft_p50_s, 0.020);
  EXPECT_DOUBLE_EQ(p->row.measured.ttft_p50_s, 0.021);
  ASSERT_EQ(p->rounds.size(), 3u);
  EXPECT_DOUBLE_EQ(p->rounds[1].simulated.attainment, 0.60);
  EXPECT_DOUBLE_EQ(p->rounds[1].measured.attainment, 0.55);
}

TEST(ValidatePairedRounds, RefusesUnpairedOrNoRounds) {
  const std::vector<Summary> two = {Att(0.9), Att(0.8)};
  const std::vector<Summary> three = {Att(0.9), Att(0.8), Att(0.7)};
  EXPECT_EQ(ComparePaired(1.0, two, three).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ComparePaired(1.0, {}, {}).status().code(), StatusCode::kInvalidArgument);
}

TEST(ValidatePairedRounds, CountsCellsWithinTheTolerance) {
  Summary real = Att(0.80, 0.020);
  Summary sim = real;
  sim.attainment = 0.88;    // +10.0%: within
  sim.ttft_p50_s = 0.0221;  // +10.5%: out
  sim.ttft_p90_s = 0.036;   // -10%: within
  const std::vector<ComparisonRow> rows = {{1.0, sim, real}, {2.0, real, real}};
  EXPECT_EQ(CellsWithin(rows, 0.10 + 1e-9), 9);
  EXPECT_EQ(CellsWithin(rows, 0.05), 7);
}

// The machine against itself: each round beside the median of the others.
TEST(ValidatePairedRounds, EachRoundAgainstTheMedianOfTheOthers) {
  const std::vector<Summary> real = {Att(0.97, 0.0195), Att(0.55, 0.032), Att(0.93, 0.021),
                                     Att(0.90, 0.020)};
  auto rows = RoundsAgainstTheOthers(15.0, real);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    SCOPED_TRACE(k);
    EXPECT_DOUBLE_EQ((*rows)[k].rate, 15.0);
    EXPECT_DOUBLE_EQ((*rows)[k].measured.attainment, real[k].attainment);
  }
  // Round 2 (the slow spell) against 0.97, 0.93, 0.90; round 1 against 0.55, 0.93, 0.90.
  EXPECT_DOUBLE_EQ((*rows)[1].simulated.attainment, 0.93);
  EXPECT_DOUBLE_EQ((*rows)[1].simulated.ttft_p50_s, 0.020);
  EXPECT_DOUBLE_EQ((*rows)[0].simulated.attainment, 0.90);
  EXPECT_DOUBLE_EQ((*rows)[0].simulated.ttft_p50_s, 0.021);
  // The slow round is out in attainment and TTFT, within in TPOT; the others are within.
  const std::vector<ComparisonRow> slow = {(*rows)[1]};
  EXPECT_EQ(CellsWithin(slow, 0.10), 2);
  const std::vector<ComparisonRow> rest = {(*rows)[0], (*rows)[2], (*rows)[3]};
  EXPECT_EQ(CellsWithin(rest, 0.10), 15);
  EXPECT_EQ(RoundsAgainstTheOthers(15.0, std::vector<Summary>{real[0]}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::planner
