// A prefill instance that restarts comes back at a new fabric address under the same name: the
// decode messenger's resolver (DecodeMessengerOptions::resolve_address, in `serve` a look at the
// instance's /pd/info) notices, fails over what was in flight on the old process, greets the new
// one, and requests go through it again with the colocated engine's greedy tokens.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/mutex.h"
#include "messenger/decode_side.h"
#include "messenger/messenger_test_util.h"
#include "transfer/fault_injection.h"
#include "transfer/test_util.h"

namespace pd::messenger {
namespace {

using testing::AllPagesFree;
using testing::Async;
using testing::Generate;
using testing::GreedyParams;
using testing::Hash;
using testing::kDeadlineS;
using testing::kSecret;
using testing::MakeEngine;
using testing::Outcome;
using testing::PendingRequest;
using testing::PromptOf;
using testing::Shape;
using testing::StartPrefill;
using testing::WaitUntil;

// What a bootstrap URL would answer: the address of the instance running under the name now.
class AddressBook {
 public:
  void Set(std::string address) {
    MutexLock lock(&mu_);
    address_ = std::move(address);
  }
  Result<std::string> Get() {
    MutexLock lock(&mu_);
    if (address_.empty()) return Unavailable("p0: nothing answers");
    return address_;
  }

 private:
  Mutex mu_;
  std::string address_ GUARDED_BY(mu_);
};

// A decode messenger with one prefill peer "p0" found through `book`, waiting up to `wait_s` for
// a prefill instance when none can take a request (prefill_wait_s).
std::unique_ptr<DecodeMessenger> MakeDecode(const Shape& s, AddressBook& book, double wait_s) {
  auto e = MakeEngine(s);
  engine::ModelRunner& runner = e->runner();
  DecodeMessengerOptions o;
  o.cluster_secret = kSecret;
  o.model_hash = Hash();
  o.domain = transfer::testing::LoopbackOptions();
  Result<std::string> address = book.Get();
  EXPECT_TRUE(address.ok());
  o.peers = {{"p0", address.ok() ? *address : ""}};
  o.hello_retry_s = 0.05;
  o.resolve_address = [&book](const PrefillPeer&) { return book.Get(); };
  o.resolve_interval_s = 0.05;
  o.prefill_wait_s = wait_s;
  auto created = DecodeMessenger::Create(o, runner, Async(std::move(e)));
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  return created.ok() ? std::move(created).value() : nullptr;
}

TEST(MessengerRestartTest, ARestartedPrefillInstanceIsGreetedAtItsNewAddressAndUsed) {
  const Shape s;
  auto first = StartPrefill(s);
  if (first == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  AddressBook book;
  book.Set(first->messenger->fabric_address());

  auto e = MakeEngine(s);
  engine::ModelRunner& runner = e->runner();
  DecodeMessengerOptions o;
  o.cluster_secret = kSecret;
  o.model_hash = Hash();
  o.domain = transfer::testing::LoopbackOptions();
  o.peers = {{"p0", first->messenger->fabric_address()}};
  o.hello_retry_s = 0.05;
  o.resolve_address = [&book](const PrefillPeer& p) -> Result<std::string> {
    EXPECT_EQ(p.name, "p0");
    return book.Get();
  };
  o.resolve_interval_s = 0.05;
  auto created = DecodeMessenger::Create(o, runner, Async(std::move(e)));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<DecodeMessenger> decode = std::move(created).value();
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  auto colocated = Async(MakeEngine(s));
  const Outcome want = Generate(*colocated, PromptOf(9, 1), 4);
  EXPECT_EQ(Generate(*decode, PromptOf(9, 1), 4).tokens, want.tokens);

  // The instance dies; while nothing answers under its name the lookups fail and change nothing.
  book.Set("");
  first.reset();
  auto second = StartPrefill(s);
  ASSERT_NE(second, nullptr);
  book.Set(second->messenger->fabric_address());

  // Requests fail over or fail while the decode side learns the new address; then they succeed
  // through the new instance. Another prompt: the first one's pages are in the decode instance's
  // prefix cache now, so it would need no prefill instance at all.
  const Outcome want_next = Generate(*colocated, PromptOf(9, 2), 4);
  Outcome got;
  ASSERT_TRUE(WaitUntil([&] {
    got = Generate(*decode, PromptOf(9, 2), 4);
    return got.finish == engine::FinishReason::kLength;
  })) << got.error.ToString();
  EXPECT_EQ(got.tokens, want_next.tokens);
  EXPECT_TRUE(WaitUntil([&] { return second->messenger->metrics().succeeded() >= 1; }));
  EXPECT_EQ(decode->peers()[0].state, PeerStatus::State::kAccepted);
  EXPECT_TRUE(AllPagesFree(*decode));
  EXPECT_TRUE(AllPagesFree(*second->engine));
}

// The only prefill instance dies; a request sent meanwhile finds nothing to retry on and waits
// (prefill_wait_s) with its pages held; the instance restarts at a new address, and the request
// goes there and gets the colocated engine's tokens, failing nothing.
TEST(MessengerRestartTest, WithAWaitARequestOutlivesItsOnlyPrefillInstanceRestarting) {
  const Shape s;
  auto first = StartPrefill(s);
  if (first == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  AddressBook book;
  book.Set(first->messenger->fabric_address());
  std::unique_ptr<DecodeMessenger> decode = MakeDecode(s, book, kDeadlineS);
  ASSERT_NE(decode, nullptr);
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  auto colocated = Async(MakeEngine(s));
  EXPECT_EQ(Generate(*decode, PromptOf(9, 1), 4).tokens,
            Generate(*colocated, PromptOf(9, 1), 4).tokens);

  book.Set("");
  first.reset();
  PendingRequest request(*decode, PromptOf(9, 2), GreedyParams(4));
  ASSERT_TRUE(request.submitted());
  ASSERT_TRUE(WaitUntil([&] { return decode->metrics().waited() == 1; }));
  EXPECT_FALSE(AllPagesFree(*decode, 0.0));  // the waiting request keeps its pages
  auto second = StartPrefill(s);
  ASSERT_NE(second, nullptr);
  book.Set(second->messenger->fabric_address());

  const Outcome got = request.Wait();
  EXPECT_EQ(got.finish, engine::FinishReason::kLength) << got.error.ToString();
  EXPECT_EQ(got.tokens, Generate(*colocated, PromptOf(9, 2), 4).tokens);
  EXPECT_EQ(decode->metrics().failed(), 0u);
  EXPECT_EQ(second->messenger->metrics().succeeded(), 1u);
  EXPECT_TRUE(AllPagesFree(*decode));
  EXPECT_TRUE(AllPagesFree(*second->engine));
}

// No instance comes back: the waiting request fails once the wait is over, saying so, and frees
// its pages. Without a wait it fails at once.
TEST(MessengerRestartTest, AWaitingRequestFailsWhenNoInstanceComesBackInTime) {
  const Shape s;
  for (const double wait_s : {0.0, 0.3}) {
    SCOPED_TRACE(wait_s);
    auto first = StartPrefill(s);
    if (first == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
    AddressBook book;
    book.Set(first->messenger->fabric_address());
    std::unique_ptr<DecodeMessenger> decode = MakeDecode(s, book, wait_s);
    ASSERT_NE(decode, nullptr);
    ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
    book.Set("");
    first.reset();

    const Outcome got = Generate(*decode, PromptOf(9, 2), 4);
    EXPECT_EQ(got.finish, engine::FinishReason::kError);
    EXPECT_EQ(got.error.code(), StatusCode::kUnavailable) << got.error.ToString();
    if (wait_s > 0) {
      EXPECT_EQ(decode->metrics().waited(), 1u);
      EXPECT_NE(got.error.message().find("no prefill instance became available within 0.3 s"),
                std::string::npos)
          << got.error.ToString();
    } else {
      EXPECT_EQ(decode->metrics().waited(), 0u);
    }
    EXPECT_TRUE(AllPagesFree(*decode));
  }
}

// The only prefill instance is up but drops the request (it finds the decode side silent: no
// heartbeats, a 50 ms silence limit, a KV write held 500 ms): nothing will come back that the
// request has not tried, so it fails at once, naming the instance's error, instead of waiting
// prefill_wait_s for nothing; its pages are free on both sides.
TEST(MessengerRestartTest, ARequestFailedByTheOnlyServingInstanceDoesNotWait) {
  const Shape s;
  PrefillMessengerOptions po = testing::BasePrefillOptions();
  po.peer_silence_s = 0.05;
  po.domain.faults = std::make_shared<transfer::FaultInjector>();
  transfer::FaultRule hold;
  hold.site = transfer::FaultSite::kWrite;
  hold.kind = transfer::FaultKind::kDelay;
  hold.nth = 1;
  hold.delay_ms = 500;
  po.domain.faults->Arm(hold);
  auto prefill = testing::LaunchPrefill(MakeEngine(s), po);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto e = MakeEngine(s);
  engine::ModelRunner& runner = e->runner();
  DecodeMessengerOptions o =
      testing::BaseDecodeOptions({{"p0", prefill->messenger->fabric_address()}});
  o.heartbeat_s = 0;
  o.prefill_wait_s = 60;
  auto decode = DecodeMessenger::Create(o, runner, Async(std::move(e)));
  ASSERT_TRUE(decode.ok()) << decode.status().ToString();
  ASSERT_TRUE((*decode)->WaitForPeers(kDeadlineS).ok());

  const Outcome got = Generate(**decode, PromptOf(9, 2), 4);
  EXPECT_EQ(got.finish, engine::FinishReason::kError);
  EXPECT_EQ(got.error.code(), StatusCode::kUnavailable) << got.error.ToString();
  EXPECT_NE(got.error.message().find("has sent nothing"), std::string::npos)
      << got.error.ToString();
  EXPECT_EQ((*decode)->metrics().waited(), 0u);
  EXPECT_GE(prefill->messenger->metrics().dropped_silent(), 1u);
  EXPECT_TRUE(AllPagesFree(**decode));
  EXPECT_TRUE(AllPagesFree(*prefill->engine));
}

}  // namespace
}  // namespace pd::messenger
