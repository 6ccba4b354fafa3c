#include "common/thread_util.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <string>
#include <thread>
#include <vector>

namespace pd {
namespace {

TEST(ParseCpuListTest, ReadsSinglesRangesAndLists) {
  EXPECT_EQ(*ParseCpuList("0"), (std::vector<int>{0}));
  EXPECT_EQ(*ParseCpuList("0-3"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(*ParseCpuList("5,1,1-2"), (std::vector<int>{1, 2, 5}));
  EXPECT_EQ(*ParseCpuList("1023"), (std::vector<int>{1023}));
}

TEST(ParseCpuListTest, NamesWhatIsWrong) {
  for (const char* bad : {"", "a", "1,,2", "1,", "-1", "3-1", "1-", "1024", "0-1x", " 1"}) {
    auto r = ParseCpuList(bad);
    ASSERT_FALSE(r.ok()) << "'" << bad << "'";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseCpuList("3-1").status().message().find("backwards"), std::string::npos);
  EXPECT_NE(ParseCpuList("0,x").status().message().find("'x'"), std::string::npos);
}

TEST(PinCurrentThreadTest, PinsAndNewThreadsInherit) {
  const std::vector<int> all = CurrentThreadCpus();
  ASSERT_FALSE(all.empty());
  std::thread t([&] {
    ASSERT_TRUE(PinCurrentThread({all.back()}).ok());
    EXPECT_EQ(CurrentThreadCpus(), (std::vector<int>{all.back()}));
    std::vector<int> child;
    std::thread([&] { child = CurrentThreadCpus(); }).join();
    EXPECT_EQ(child, (std::vector<int>{all.back()}));
  });
  t.join();
  EXPECT_EQ(CurrentThreadCpus(), all);  // other threads untouched
  EXPECT_FALSE(PinCurrentThread({}).ok());
  EXPECT_FALSE(PinCurrentThread({-1}).ok());
}

TEST(SetCurrentThreadNameTest, NamesAndCutsAt15Bytes) {
  std::string got;
  std::thread([&] {
    SetCurrentThreadName("pd-a-very-long-thread-name");
    char buf[32] = {};
    pthread_getname_np(pthread_self(), buf, sizeof(buf));
    got = buf;
  }).join();
  EXPECT_EQ(got, "pd-a-very-long-");
}

TEST(SetCurrentThreadLatencySensitiveTest, SetsTheSliceOfTheCallingThreadOnly) {
  EXPECT_EQ(SetCurrentThreadLatencySensitive(0).code(), StatusCode::kInvalidArgument);
  int64_t before = 0, after = 0, other = 0;
  Status status;
  std::thread t([&] {
    before = CurrentThreadSliceNs();
    status = SetCurrentThreadLatencySensitive(123'000);
    after = CurrentThreadSliceNs();
  });
  t.join();
  std::thread u([&] { other = CurrentThreadSliceNs(); });
  u.join();
  if (!status.ok()) GTEST_SKIP() << "this kernel takes no custom slice: " << status.ToString();
  // Kernels before EEVDF (Linux < 6.6) accept sched_runtime for SCHED_OTHER and ignore it.
  if (after == 0) GTEST_SKIP() << "this kernel ignores sched_runtime for SCHED_OTHER (before 6.6)";
  EXPECT_NE(before, 123'000);
  EXPECT_EQ(after, 123'000);
  EXPECT_NE(other, 123'000);
}

}  // namespace
}  // namespace pd
