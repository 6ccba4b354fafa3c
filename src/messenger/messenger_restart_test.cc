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
#include "transfer/test_util.h"

namespace pd::messenger {
namespace {

using testing::AllPagesFree;
using testing::Async;
using testing::Generate;
using testing::Hash;
using testing::kDeadlineS;
using testing::kSecret;
using testing::MakeEngine;
using testing::Outcome;
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

}  // namespace
}  // namespace pd::messenger
