#include "deploy/restart_policy.h"

#include <gtest/gtest.h>

namespace pd::deploy {
namespace {

RestartPolicy Policy() {
  RestartPolicy p;
  p.initial_backoff_s = 0.5;
  p.max_backoff_s = 3.0;
  p.stable_after_s = 10.0;
  p.max_failures_in_a_row = 4;
  return p;
}

TEST(RestartTrackerTest, BackoffDoublesUpToTheCapThenGivesUp) {
  RestartTracker t(Policy());
  double now = 0.0;
  t.Started(now);
  const double expected[] = {0.5, 1.0, 2.0, 3.0};
  for (double backoff : expected) {
    now += 1.0;
    RestartDecision d = t.Exited(now);
    ASSERT_FALSE(d.give_up);
    EXPECT_DOUBLE_EQ(d.backoff_s, backoff);
    EXPECT_DOUBLE_EQ(d.restart_at, now + backoff);
    now = d.restart_at;
    t.Started(now);
    t.Healthy(now + 0.1);  // healthy, but not for stable_after_s: still a fast failure
  }
  EXPECT_EQ(t.restarts(), 4);
  RestartDecision last = t.Exited(now + 1.0);
  EXPECT_TRUE(last.give_up);
  EXPECT_EQ(last.failures_in_a_row, 5);
}

TEST(RestartTrackerTest, AStableRunStartsTheBackoffOver) {
  RestartTracker t(Policy());
  t.Started(0.0);
  EXPECT_DOUBLE_EQ(t.Exited(1.0).backoff_s, 0.5);
  t.Started(1.5);
  EXPECT_DOUBLE_EQ(t.Exited(2.0).backoff_s, 1.0);  // never healthy: in a row
  t.Started(3.0);
  t.Healthy(4.0);
  RestartDecision d = t.Exited(14.0);  // healthy for 10 s: stable
  EXPECT_DOUBLE_EQ(d.backoff_s, 0.5);
  EXPECT_EQ(d.failures_in_a_row, 1);
}

TEST(RestartTrackerTest, HealthySinceCountsFromTheFirstAnswerOfEachStart) {
  RestartTracker t(Policy());
  t.Started(0.0);
  t.Healthy(1.0);
  t.Healthy(9.0);                                  // ignored: healthy since 1.0
  EXPECT_EQ(t.Exited(11.0).failures_in_a_row, 1);  // 10 s healthy: stable
  t.Started(11.5);                                 // a new start forgets the old health
  EXPECT_EQ(t.Exited(21.6).failures_in_a_row, 2);  // never healthy since: not stable
}

}  // namespace
}  // namespace pd::deploy
