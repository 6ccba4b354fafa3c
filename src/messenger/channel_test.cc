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
  auto f1 = b.Decode(a.Encode(Cancel{1}, b.session()));
  auto f2 = b.Decode(a.Encode(Cancel{2}, b.session()));
  ASSERT_TRUE(f1.ok() && f2.ok());
  EXPECT_LT(f1->sender_seq, f2->sender_seq);
  EXPECT_EQ(f1->sender_session, a.session());
  EXPECT_EQ(f1->recipient_session, b.session());
  EXPECT_TRUE(b.CheckRecipient(*f1).ok());
  EXPECT_FALSE(c.Decode(a.Encode(Cancel{3}, c.session())).ok());
  EXPECT_FALSE(b.Decode("short").ok());
}

// Each process draws its own session; a frame is accepted only by the session it names (a Hello,
// sent before the recipient's session is known, by any).
TEST(FrameCodecTest, AFrameIsAcceptedOnlyByTheSessionItNames) {
  FrameCodec sender("s"), a("s"), b("s"), a_restarted("s");
  EXPECT_NE(a.session(), b.session());
  EXPECT_NE(a.session(), a_restarted.session());
  EXPECT_NE(a.session(), 0u);
  auto to_a = a.Decode(sender.Encode(Cancel{1}, a.session()));
  ASSERT_TRUE(to_a.ok());
  EXPECT_TRUE(a.CheckRecipient(*to_a).ok());
  for (const FrameCodec* other : {&b, &a_restarted}) {
    auto f = other->Decode(sender.Encode(Cancel{1}, a.session()));
    ASSERT_TRUE(f.ok());  // the same secret: authentic, but not for it
    Status s = other->CheckRecipient(*f);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("not ours"), std::string::npos) << s.message();
  }
  auto hello = b.Decode(sender.Encode(Hello{}, 0));
  ASSERT_TRUE(hello.ok());
  EXPECT_TRUE(b.CheckRecipient(*hello).ok());
  auto no_session = b.Decode(sender.Encode(Cancel{1}, 0));  // only a Hello may name none
  ASSERT_TRUE(no_session.ok());
  EXPECT_FALSE(b.CheckRecipient(*no_session).ok());
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
