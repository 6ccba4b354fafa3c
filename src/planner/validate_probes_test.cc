#include "planner/validate_probes.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>

namespace pd::planner {
namespace {

TEST(ValidateProbes, BusiestThreadTimesAreTheLongestRunnersRunAndWait) {
  // Thread 2 ran longest (0.8 s) and waited 0.3 s; thread 1 waited longer but ran less; thread 3
  // is new.
  const ThreadCpuTimes before = {{1, {10.0, 2.0}}, {2, {1.0, 5.0}}};
  const ThreadCpuTimes after = {{1, {10.5, 4.0}}, {2, {1.8, 5.3}}, {3, {0.2, 0.0}}};
  const CpuTimes t = BusiestThreadTimes(before, after);
  EXPECT_NEAR(t.run_s, 0.8, 1e-12);
  EXPECT_NEAR(t.wait_s, 0.3, 1e-12);
  EXPECT_EQ(BusiestThreadTimes(before, {}).run_s, 0.0);
}

double RunSeconds(const Result<ThreadCpuTimes>& t) {
  double sum = 0;
  for (const auto& [tid, c] : *t) sum += c.run_s;
  return sum;
}

// This process's schedstat grows as it computes (a reader that never sees 5 ms more fails after
// 10 s); the instances of a fake `up` (this process) are found by their --role.
TEST(ValidateProbes, ReadsThreadTimesAndFindsTheInstances) {
  const auto before = ProcessThreadCpuTimes(getpid());
  if (!before.ok()) GTEST_SKIP() << "no schedstat: " << before.status().ToString();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  volatile double x = 1.0;
  auto after = ProcessThreadCpuTimes(getpid());
  while (after.ok() && RunSeconds(after) - RunSeconds(before) <= 0.005 &&
         std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 10000; ++i) x = std::sqrt(x + 1.0);
    after = ProcessThreadCpuTimes(getpid());
  }
  ASSERT_TRUE(after.ok());
  EXPECT_GT(RunSeconds(after) - RunSeconds(before), 0.005);

  EXPECT_EQ(FindInstances(getpid()).status().code(), StatusCode::kNotFound);
  pid_t kids[2];
  const char* roles[] = {"prefill", "decode"};
  for (int k = 0; k < 2; ++k) {
    kids[k] = fork();
    ASSERT_GE(kids[k], 0);
    if (kids[k] == 0) {
      execl("/bin/sh", "sh", "-c", "sleep 5", "sh", "--role", roles[k], nullptr);
      _exit(127);
    }
  }
  Result<Deployment> d = NotFound("not yet");
  for (int attempt = 0; attempt < 200 && !d.ok(); ++attempt) {  // until both have exec'd
    d = FindInstances(getpid());
    if (!d.ok()) usleep(5000);
  }
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->prefill, kids[0]);
  EXPECT_EQ(d->decode, kids[1]);
  for (pid_t k : kids) {
    kill(k, SIGKILL);
    waitpid(k, nullptr, 0);
  }
  EXPECT_EQ(ProcessThreadCpuTimes(kids[0]).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pd::planner
