// The control inbox of OpenMessengerDomain: frames are authenticated on the fabric worker before
// they are queued, and at most `max_queued` wait for the messenger thread.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "messenger/channel.h"
#include "messenger/handshake.h"
#include "messenger/transfer_metrics.h"
#include "transfer/test_util.h"

namespace pd::messenger {
namespace {

using transfer::testing::Done;
using transfer::testing::LoopbackOptions;

constexpr char kSecret[] = "inbox secret";

struct Inbox {
  std::shared_ptr<FrameCodec> codec = std::make_shared<FrameCodec>(kSecret);
  std::shared_ptr<TaskQueue> queue = std::make_shared<TaskQueue>();
  TransferMetrics metrics;
  int delivered = 0;  // on the queue's thread (the test's)
  std::unique_ptr<transfer::Domain> domain;
};

// Opens `inbox`'s domain with at most `max_queued` waiting frames; false (the test skipped or
// failed) when the provider is absent or the domain cannot open.
bool Open(Inbox& inbox, size_t max_queued) {
  ControlInbox c;
  c.codec = inbox.codec;
  c.queue = inbox.queue;
  c.on_frame = [&inbox](Frame) { ++inbox.delivered; };
  c.metrics = &inbox.metrics;
  c.side = "inbox test";
  c.max_queued = max_queued;
  auto domain = OpenMessengerDomain(LoopbackOptions(), 1u << 16, std::move(c));
  if (!domain.ok()) {
    if (transfer::testing::ProviderAbsent(domain.status())) return false;
    ADD_FAILURE() << domain.status().ToString();
    return false;
  }
  inbox.domain = std::move(domain).value();
  return true;
}

// Sends `bytes` from `sender` to `inbox` and waits until the send completed.
void Send(transfer::Domain& sender, const Inbox& inbox, std::string bytes) {
  auto peer = sender.AddPeer(inbox.domain->info().address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  Done done;
  ASSERT_TRUE(sender.SubmitSend(*peer, std::move(bytes), done.Callback()).ok());
  auto status = done.Wait();
  ASSERT_TRUE(status.has_value() && status->ok());
}

// Waits (bounded) until the inbox accounted for `n` frames: queued, rejected or dropped.
bool Accounted(Inbox& inbox, uint64_t n) {
  for (int i = 0; i < 2000; ++i) {
    const uint64_t seen = inbox.metrics.rejected() + inbox.metrics.queue_full() +
                          static_cast<uint64_t>(inbox.delivered);
    if (seen >= n) return true;
    inbox.queue->RunFor(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(ControlInboxTest, AtMostMaxQueuedFramesWaitAndTheRestAreDroppedAndCounted) {
  Inbox inbox;
  if (!Open(inbox, 2)) {
    if (!HasFailure()) GTEST_SKIP() << "libfabric provider unavailable";
    return;
  }
  auto sender = transfer::Domain::Create(LoopbackOptions());
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  FrameCodec codec(kSecret);
  // Nobody runs the queue while the five frames arrive: two wait, three are dropped.
  for (uint64_t id = 1; id <= 5; ++id) {
    Send(**sender, inbox, codec.Encode(Cancel{id}, inbox.codec->session()));
  }
  for (int i = 0; i < 2000 && inbox.metrics.queue_full() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the fabric worker's count
  }
  EXPECT_EQ(inbox.metrics.queue_full(), 3u);
  EXPECT_EQ(inbox.delivered, 0);
  inbox.queue->RunFor(std::chrono::milliseconds(0));
  EXPECT_EQ(inbox.delivered, 2);
  // With room again, the next frame is queued.
  Send(**sender, inbox, codec.Encode(Cancel{6}, inbox.codec->session()));
  ASSERT_TRUE(Accounted(inbox, 6));
  EXPECT_EQ(inbox.delivered, 3);
  EXPECT_EQ(inbox.metrics.queue_full(), 3u);
  sender->reset();
  inbox.domain.reset();
}

TEST(ControlInboxTest, UnauthenticatedFramesNeverReachTheQueue) {
  Inbox inbox;
  if (!Open(inbox, 1)) {
    if (!HasFailure()) GTEST_SKIP() << "libfabric provider unavailable";
    return;
  }
  auto sender = transfer::Domain::Create(LoopbackOptions());
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  FrameCodec wrong_secret("not the secret");
  for (uint64_t id = 1; id <= 3; ++id) {
    Send(**sender, inbox, wrong_secret.Encode(Cancel{id}, inbox.codec->session()));
  }
  ASSERT_TRUE(Accounted(inbox, 3));
  EXPECT_EQ(inbox.metrics.rejected(), 3u);
  EXPECT_EQ(inbox.metrics.queue_full(), 0u);  // the bound was never touched by them
  EXPECT_EQ(inbox.delivered, 0);
  // An authenticated frame still finds the (one-frame) queue empty.
  FrameCodec codec(kSecret);
  Send(**sender, inbox, codec.Encode(Cancel{4}, inbox.codec->session()));
  ASSERT_TRUE(Accounted(inbox, 4));
  EXPECT_EQ(inbox.delivered, 1);
  sender->reset();
  inbox.domain.reset();
}

}  // namespace
}  // namespace pd::messenger
