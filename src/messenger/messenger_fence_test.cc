// Page reuse only when no write can land, and teardown in the right order: a fence that times
// out while its prefill instance is alive revokes that instance's keys before the pages go back,
// and no messenger frees registered memory while its fabric domain is open.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "messenger/messenger_test_util.h"
#include "transfer/domain.h"

namespace pd::messenger {
namespace {

using testing::AllPagesFree;
using testing::FakePeer;
using testing::Generate;
using ::testing::HasSubstr;
using testing::kDeadlineS;
using testing::PendingRequest;
using testing::PromptOf;
using testing::Shape;
using testing::StartDecode;
using testing::StartPrefill;
using testing::WaitUntil;

// A prefill instance that answers every Hello (it stays alive) and records PrefillRequests
// without ever writing or answering them.
FakePeer::Handler SilentButAlive() {
  return [](FakePeer& self, const Frame& f) {
    if (auto* hello = std::get_if<Hello>(&f.message)) {
      HelloReply r;
      r.accepted = true;
      r.instance_name = "alive";
      r.format = hello->format;
      r.scheme = hello->scheme;
      r.fabric_address = self.address();
      self.Send(hello->fabric_address, r);
    } else if (std::holds_alternative<PrefillRequest>(f.message)) {
      self.Record(f);
    }
  };
}

// Writes `bytes` from `src` to page `page` of the region a PrefillRequest named; the status.
Status WriteWith(FakePeer& fake, const transfer::MemoryRegion& src, const PrefillRequest& req,
                 uint64_t bytes) {
  auto desc = transfer::MemoryDescriptor::FromBytes(req.rank_regions[0]);
  if (!desc.ok()) return desc.status();
  auto remote = fake.domain().AddRemote(*desc);
  if (!remote.ok()) return remote.status();
  transfer::testing::Done done;
  auto id = fake.domain().SubmitWrite({src, 0, bytes, *remote, 0, std::nullopt}, done.Callback());
  if (!id.ok()) return id.status();
  auto s = done.Wait();
  return s.has_value() ? *s : DeadlineExceeded("the write never completed");
}

TEST(MessengerFenceTest, AnUnconfirmedFenceRevokesTheLivePeersKeysBeforeItsPagesGoBack) {
  Shape s;
  transfer::testing::Mappings mem;  // the fake's source memory outlives its domain
  auto fake = FakePeer::Create(SilentButAlive());
  if (fake == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  transfer::testing::Mapping& src = mem.New(4096);
  auto src_mr =
      fake->domain().RegisterMemory(src.data(), src.size(), transfer::RegionAccess::kLocalSource);
  ASSERT_TRUE(src_mr.ok()) << src_mr.status().ToString();
  // Long enough that the checks below run inside the grace even on a loaded host.
  constexpr double kGraceS = 3.0;
  auto decode = StartDecode(s, {{"alive", fake->address()}}, /*timeout_ms=*/200, testing::kSecret,
                            {}, nullptr, kGraceS);
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  const int total = decode->stats().num_total_pages;

  const double start = NowSeconds();
  PendingRequest pending(*decode, PromptOf(13, 1), testing::GreedyParams(4));
  ASSERT_TRUE(pending.submitted());
  std::optional<Frame> frame = fake->Next();
  ASSERT_TRUE(frame.has_value());
  const PrefillRequest req = std::get<PrefillRequest>(frame->message);
  // The attempt misses its 200 ms deadline; the lone instance cannot take a retry.
  testing::Outcome got = pending.Wait();
  EXPECT_EQ(got.finish, engine::FinishReason::kError);
  EXPECT_THAT(got.error.message(), HasSubstr("did not complete the KV transfer within 200 ms"));
  // Its 4 pages (13 prompt tokens, pages of 4) stay quarantined: the instance never confirmed.
  EXPECT_EQ(decode->stats().num_free_pages, total - 4);
  EXPECT_EQ(decode->metrics().quarantined_pages(), 4);
  EXPECT_EQ(decode->metrics().keys_revoked(), 0u);
  // Its keys still work meanwhile (the write lands in quarantined pages, harming nobody).
  Status early = WriteWith(*fake, *src_mr, req, 64);
  EXPECT_TRUE(early.ok()) << early.ToString();

  // Past the deadline and the grace the instance, still alive, is marked down and its keys
  // revoked; only then are the pages free.
  ASSERT_TRUE(AllPagesFree(*decode));
  EXPECT_GE(NowSeconds() - start, 0.2 + kGraceS);
  EXPECT_EQ(decode->metrics().keys_revoked(), 1u);
  EXPECT_EQ(decode->metrics().quarantined_pages(), 0);
  EXPECT_EQ(decode->metrics().fenced(), 0);
  // A late write with the keys of that attempt is rejected by the provider.
  Status late = WriteWith(*fake, *src_mr, req, 64);
  EXPECT_FALSE(late.ok()) << "a write with revoked keys landed";
  // The instance is greeted again and accepted, with fresh keys in its next request.
  EXPECT_TRUE(WaitUntil([&] { return decode->peers()[0].state == PeerStatus::State::kAccepted; },
                        kDeadlineS));
  PendingRequest again(*decode, PromptOf(9, 2), testing::GreedyParams(2));
  std::optional<Frame> next = fake->Next();
  ASSERT_TRUE(next.has_value());
  const PrefillRequest req2 = std::get<PrefillRequest>(next->message);
  EXPECT_NE(transfer::MemoryDescriptor::FromBytes(req2.rank_regions[0])->rkey,
            transfer::MemoryDescriptor::FromBytes(req.rank_regions[0])->rkey);
  decode->Abort(again.id());
  again.Wait();
  decode.reset();
  fake.reset();
}

// Every messenger, torn down as the servers do, closes its fabric domain before the memory it
// registered (its metadata buffers, the engine's KV regions) is freed; after Stop the prefill
// engine may even go first.
TEST(MessengerTeardownTest, NoRegisteredMemoryIsFreedWhileItsDomainIsOpen) {
  Shape s;
  const uint64_t before = transfer::NumRegionsFreedWhileRegistered();
  {
    auto prefill = StartPrefill(s);
    if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
    auto decode = StartDecode(s, {{"p0", prefill->messenger->fabric_address()}});
    ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
    testing::Outcome got = Generate(*decode, PromptOf(11, 3), 3);
    EXPECT_EQ(got.finish, engine::FinishReason::kLength) << got.error.ToString();
    decode.reset();
    prefill.reset();
  }
  EXPECT_EQ(transfer::NumRegionsFreedWhileRegistered(), before);
  {
    auto prefill = StartPrefill(s);
    ASSERT_NE(prefill, nullptr);
    prefill->messenger->Stop();
    prefill->engine->Shutdown();
    prefill->engine.reset();  // frees the KV region the messenger had registered
    prefill->messenger.reset();
  }
  EXPECT_EQ(transfer::NumRegionsFreedWhileRegistered(), before);
}

}  // namespace
}  // namespace pd::messenger
