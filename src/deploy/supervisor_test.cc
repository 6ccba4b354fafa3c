// The supervisor with real child processes (/bin/sh, no health URL: healthy once running) and
// short backoffs.
#include "deploy/supervisor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

namespace pd::deploy {
namespace {

using ::testing::HasSubstr;

ChildSpec Shell(const std::string& name, const std::string& script) {
  ChildSpec c;
  c.name = name;
  c.process.argv = {"/bin/sh", "-c", script};
  return c;
}

SupervisorOptions Options(OnFailure on_failure, std::vector<std::string>* log) {
  SupervisorOptions o;
  o.on_failure = on_failure;
  o.policy.initial_backoff_s = 0.01;
  o.policy.max_backoff_s = 0.04;
  o.policy.max_failures_in_a_row = 3;
  o.log = [log](const std::string& line) { log->push_back(line); };
  return o;
}

// Steps `s` every 5 ms until `done` holds (true), Step fails (its status in `*failed`) or 20 s
// pass.
bool StepUntil(Supervisor& s, const std::function<bool()>& done, Status* failed = nullptr) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < end) {
    Status st = s.Step();
    if (!st.ok()) {
      if (failed != nullptr) *failed = st;
      return false;
    }
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(SupervisorTest, RestartsAKilledChildAndLogsTheSignalWhileOthersKeepRunning) {
  std::vector<std::string> log;
  Supervisor s(Options(OnFailure::kRestart, &log));
  const size_t a = s.Add(Shell("a", "exec sleep 100"));
  const size_t b = s.Add(Shell("b", "exec sleep 100"));
  ASSERT_TRUE(s.Start(a).ok());
  ASSERT_TRUE(s.Start(b).ok());
  ASSERT_TRUE(s.WaitHealthy({a, b}, 10.0).ok());
  const pid_t first = s.pid(a);
  const pid_t other = s.pid(b);
  ASSERT_EQ(kill(first, SIGKILL), 0);
  ASSERT_TRUE(StepUntil(s, [&] { return s.healthy(a) && s.pid(a) != first; }));
  EXPECT_EQ(s.restarts(a), 1);
  EXPECT_EQ(s.pid(b), other);  // untouched
  EXPECT_EQ(kill(other, 0), 0);
  ASSERT_GE(log.size(), 3u);
  EXPECT_THAT(log[0], HasSubstr("a (pid " + std::to_string(first) +
                                ") was killed by signal 9 (SIGKILL); restarting it in 0.0 s"));
  EXPECT_THAT(log[1], HasSubstr("restarted a (pid " + std::to_string(s.pid(a)) + ")"));
  EXPECT_THAT(log[2], HasSubstr("is healthy again"));
  s.StopAll(std::chrono::seconds(5));
  EXPECT_NE(kill(other, 0), 0);  // reaped: gone
}

TEST(SupervisorTest, GivesUpAfterRepeatedFastFailuresSayingWhy) {
  std::vector<std::string> log;
  Supervisor s(Options(OnFailure::kRestart, &log));
  const size_t k = s.Add(Shell("crashy", "exit 3"));
  ASSERT_TRUE(s.Start(k).ok());
  Status failed;
  EXPECT_FALSE(StepUntil(
      s, [] { return false; }, &failed));
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable);
  EXPECT_THAT(failed.message(), HasSubstr("crashy (pid "));
  EXPECT_THAT(failed.message(), HasSubstr("exited with status 3: it failed 4 times in a row"));
  EXPECT_THAT(failed.message(), HasSubstr("giving up"));
  EXPECT_EQ(s.restarts(k), 3);
  int restarting = 0;
  for (const std::string& line : log) restarting += line.find("; restarting it in") != line.npos;
  EXPECT_EQ(restarting, 3);
}

TEST(SupervisorTest, OnFailureStopEndsAtTheFirstDeath) {
  std::vector<std::string> log;
  Supervisor s(Options(OnFailure::kStop, &log));
  const size_t a = s.Add(Shell("a", "exec sleep 100"));
  const size_t b = s.Add(Shell("b", "exec sleep 100"));
  ASSERT_TRUE(s.Start(a).ok());
  ASSERT_TRUE(s.Start(b).ok());
  const pid_t pid = s.pid(b);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  Status failed;
  EXPECT_FALSE(StepUntil(
      s, [] { return false; }, &failed));
  EXPECT_EQ(failed.message(), "b (pid " + std::to_string(pid) +
                                  ") was killed by signal 15 (SIGTERM): stopping every instance "
                                  "(--on-failure stop)");
  EXPECT_TRUE(log.empty());
  EXPECT_EQ(s.restarts(b), 0);
}

TEST(SupervisorTest, ADeathDuringTheFirstStartFailsWaitHealthy) {
  std::vector<std::string> log;
  Supervisor s(Options(OnFailure::kRestart, &log));
  const size_t ok = s.Add(Shell("ok", "exec sleep 100"));
  ChildSpec never = Shell("never", "exec sleep 100");
  never.health_url = "http://127.0.0.1:1";  // nothing answers there
  ChildSpec exits = Shell("bad", "exit 7");
  exits.health_url = never.health_url;
  const size_t bad = s.Add(exits);
  ASSERT_TRUE(s.Start(ok).ok());
  ASSERT_TRUE(s.Start(bad).ok());
  Status st = s.WaitHealthy({ok, bad}, 10.0);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("bad (pid "));
  EXPECT_THAT(st.message(), HasSubstr("exited with status 7 during start-up"));
  Supervisor t(Options(OnFailure::kRestart, &log));
  const size_t k = t.Add(never);
  ASSERT_TRUE(t.Start(k).ok());
  st = t.WaitHealthy({k}, 0.3);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(st.message(), "never did not become healthy within 0.3 s");
}

TEST(SupervisorTest, WaitHealthyEndsWhenCancelled) {
  std::vector<std::string> log;
  Supervisor s(Options(OnFailure::kRestart, &log));
  ChildSpec never = Shell("never", "exec sleep 100");
  never.health_url = "http://127.0.0.1:1";  // nothing answers there
  const size_t k = s.Add(never);
  ASSERT_TRUE(s.Start(k).ok());
  int checks = 0;
  const Status st = s.WaitHealthy({k}, 60.0, [&] { return ++checks == 3; });
  EXPECT_EQ(st.code(), StatusCode::kCancelled) << st.ToString();
  EXPECT_EQ(checks, 3);
}

}  // namespace
}  // namespace pd::deploy
