#include "planner/cpu_contention.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>

namespace pd::planner {
namespace {

TEST(CpuContention, ParsesSchedstatLines) {
  auto t = ParseSchedstat("2000000000 500000000 42\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_DOUBLE_EQ(t->run_s, 2.0);
  EXPECT_DOUBLE_EQ(t->wait_s, 0.5);
  for (const char* bad : {"", "12 34", "a b c", "1 2 3 4"}) {
    EXPECT_EQ(ParseSchedstat(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CpuContention, BusiestThreadTimesAreTheLongestRunnersRunAndWait) {
  // Thread 2 ran longest (0.8 s) and waited 0.3 s; thread 1 waited longer but ran less; thread 3
  // is new.
  ThreadCpuTimes before = {{1, {10.0, 2.0}}, {2, {1.0, 5.0}}};
  ThreadCpuTimes after = {{1, {10.5, 4.0}}, {2, {1.8, 5.3}}, {3, {0.2, 0.0}}};
  const CpuTimes t = BusiestThreadTimes(before, after);
  EXPECT_NEAR(t.run_s, 0.8, 1e-12);
  EXPECT_NEAR(t.wait_s, 0.3, 1e-12);
  const CpuTimes none = BusiestThreadTimes(before, {});
  EXPECT_EQ(none.run_s, 0.0);
  EXPECT_EQ(none.wait_s, 0.0);
}

TEST(CpuContention, ReadsThisProcessAndFindsItsChildren) {
  auto before = ProcessCpuTimes(getpid());
  if (!before.ok()) GTEST_SKIP() << "no schedstat: " << before.status().ToString();
  // Burn CPU until schedstat shows 5 ms more run time (on a busy machine 20 ms of wall time may
  // hold less than that); a reader that never sees it grow fails after 10 s.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  volatile double x = 1.0;
  auto after = ProcessCpuTimes(getpid());
  while (after.ok() && after->run_s - before->run_s <= 0.005 &&
         std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 10000; ++i) x = std::sqrt(x + 1.0);
    after = ProcessCpuTimes(getpid());
  }
  ASSERT_TRUE(after.ok());
  EXPECT_GT(after->run_s - before->run_s, 0.005);

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execl("/bin/sleep", "sleep", "5", static_cast<char*>(nullptr));
    _exit(127);
  }
  bool found = false;
  for (int attempt = 0; attempt < 200 && !found; ++attempt) {  // until exec has happened
    for (const ChildProcess& c : ChildrenOf(getpid())) {
      if (c.pid == child && c.cmdline.rfind("sleep", 0) == 0) found = true;
    }
    if (!found) usleep(5000);
  }
  EXPECT_TRUE(found);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(ProcessCpuTimes(child).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pd::planner
