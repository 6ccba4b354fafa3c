#include "messenger/channel.h"

#include <gtest/gtest.h>

#include <thread>

namespace pd::messenger {
namespace {

TEST(ReplayGuardTest, RefusesARepeatedOrAncientSequenceNumberPerSender) {
  ReplayGuard g;
  EXPECT_TRUE(g.Check("a", 100).ok());
  EXPECT_TRUE(g.Check("a", 99).ok());  // reordered but new
  EXPECT_EQ(g.Check("a", 100).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(g.Check("b", 100).ok());  // another sender
  EXPECT_TRUE(g.Check("a", 100 + ReplayGuard::kWindow + 5).ok());
  Status old = g.Check("a", 101);
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(old.message().find("replay window"), std::string::npos);
}

TEST(FrameCodecTest, SequenceNumbersIncreaseAndTheSecretIsChecked) {
  FrameCodec a("s1"), b("s1"), c("s2");
  auto f1 = b.Decode(a.Encode(Cancel{1}));
  auto f2 = b.Decode(a.Encode(Cancel{2}));
  ASSERT_TRUE(f1.ok() && f2.ok());
  EXPECT_LT(f1->sender_seq, f2->sender_seq);
  EXPECT_FALSE(c.Decode(a.Encode(Cancel{3})).ok());
  EXPECT_FALSE(b.Decode("short").ok());
}

TEST(TaskQueueTest, RunsPostedTasksInOrderAndStops) {
  TaskQueue q;
  std::vector<int> order;
  std::thread t([&] {
    for (int i = 0; i < 3; ++i) q.Post([&order, i] { order.push_back(i); });
  });
  t.join();
  EXPECT_TRUE(q.RunFor(std::chrono::milliseconds(0)));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  q.Stop();
  q.Post([&] { order.push_back(9); });
  EXPECT_FALSE(q.RunFor(std::chrono::milliseconds(0)));
  EXPECT_EQ(order.size(), 3u);
}

// A Wake is kept until a RunFor consumes it: one posted before the wait ends it at once, as one
// posted by another thread during it does (a lost wake-up would hang here for a minute).
TEST(TaskQueueTest, WakeEndsTheWaitWithoutATaskAndIsNeverLost) {
  TaskQueue q;
  q.Wake();
  EXPECT_TRUE(q.RunFor(std::chrono::minutes(1)));
  std::thread waker([&] { q.Wake(); });
  EXPECT_TRUE(q.RunFor(std::chrono::minutes(1)));
  waker.join();
  int ran = 0;
  q.Post([&] { ++ran; });
  q.Wake();
  EXPECT_TRUE(q.RunFor(std::chrono::minutes(1)));
  EXPECT_EQ(ran, 1);
}

TEST(TaskQueueTest, WakeAfterStopDoesNotRestart) {
  TaskQueue q;
  q.Stop();
  q.Wake();
  EXPECT_FALSE(q.RunFor(std::chrono::minutes(1)));
}

}  // namespace
}  // namespace pd::messenger
