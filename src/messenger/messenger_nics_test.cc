// The messenger over several NICs, in one process: two loopback addresses (127.0.0.1 and
// 127.0.0.2) stand for two NICs on each side. KV writes stripe over both (per-NIC byte counters);
// a write whose completion reports an error after it landed (FaultKind::kFail: a completion lost
// with its NIC) on NIC 1 moves the transfer to a fresh imm and re-posts its writes on NIC 0, and
// the request still ends with the colocated engine's greedy tokens: the decode side counted
// exactly (a write counted twice would have made its count early, checked by --kv-checksum).
// When no NIC is left the request fails with a clear error and every page is free.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "messenger/messenger_test_util.h"
#include "messenger/nics.h"
#include "transfer/fault_injection.h"

namespace pd::messenger {
namespace {

using testing::AllPagesFree;
using testing::Async;
using testing::Generate;
using ::testing::HasSubstr;
using testing::MakeEngine;
using testing::Outcome;
using testing::PromptOf;
using testing::Shape;
using transfer::FaultInjector;
using transfer::FaultKind;
using transfer::FaultRule;

// Budget 8 chunks the 22 prefilled tokens into three steps: writes stream over steps and layers.
const Shape kShape{engine::KvLayout::kHND, 4, 8};
constexpr int kPromptLen = 23;
constexpr int kMaxTokens = 5;
const std::vector<std::string> kNics = {"127.0.0.1", "127.0.0.2"};

std::vector<int32_t> Colocated(const std::vector<int32_t>& prompt) {
  auto engine = Async(MakeEngine(kShape));
  Outcome o = Generate(*engine, prompt, kMaxTokens);
  EXPECT_TRUE(o.error.ok()) << o.error.ToString();
  return o.tokens;
}

struct Split {
  std::unique_ptr<testing::PrefillInstance> prefill;
  std::unique_ptr<DecodeMessenger> decode;
};

// A prefill and a decode instance on kNics each; `faults[i]` is injected into the prefill's NIC i.
Split Start(const std::vector<std::shared_ptr<FaultInjector>>& faults, bool checksum) {
  Split s;
  PrefillMessengerOptions po = testing::BasePrefillOptions();
  po.nics = kNics;
  po.kv_checksum = checksum;
  if (!faults.empty()) po.domain.faults = faults[0];
  po.nic_faults = faults;
  s.prefill = testing::LaunchPrefill(MakeEngine(kShape), po);
  if (s.prefill == nullptr) return s;
  auto e = MakeEngine(kShape);
  engine::ModelRunner& runner = e->runner();
  DecodeMessengerOptions dopt =
      testing::BaseDecodeOptions({{"prefill", s.prefill->messenger->fabric_address()}});
  dopt.nics = kNics;
  dopt.kv_checksum = checksum;
  dopt.transfer_timeout_ms = 20000;
  auto d = DecodeMessenger::Create(dopt, runner, Async(std::move(e)));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (d.ok()) s.decode = std::move(d).value();
  if (s.decode) {
    EXPECT_TRUE(s.decode->WaitForPeers(testing::kDeadlineS).ok());
  }
  return s;
}

FaultRule FailWrite(uint64_t nth, uint64_t count) {
  FaultRule rule;
  rule.site = transfer::FaultSite::kWrite;
  rule.kind = FaultKind::kFail;
  rule.nth = nth;
  rule.count = count;
  return rule;
}

TEST(MessengerNicsTest, WritesStripeOverEveryNic) {
  Split s = Start({}, /*checksum=*/false);
  if (s.prefill == nullptr) GTEST_SKIP() << "tcp;ofi_rxm is not available here";
  ASSERT_NE(s.decode, nullptr);
  EXPECT_EQ(s.prefill->messenger->num_nics(), 2);
  for (int salt = 0; salt < 3; ++salt) {
    const auto prompt = PromptOf(kPromptLen, salt);
    Outcome o = Generate(*s.decode, prompt, kMaxTokens);
    ASSERT_TRUE(o.error.ok()) << o.error.ToString();
    EXPECT_EQ(o.tokens, Colocated(prompt)) << "salt " << salt;
  }
  const TransferMetrics& m = s.prefill->messenger->metrics();
  EXPECT_GT(m.nic_bytes(0), 0u);
  EXPECT_GT(m.nic_bytes(1), 0u);
  EXPECT_EQ(m.nic_bytes(0) + m.nic_bytes(1), m.kv_bytes());  // no write posted twice
  EXPECT_EQ(m.rerouted(), 0u);
  const std::string text = m.PrometheusText("prefill");
  EXPECT_THAT(text,
              HasSubstr("pdserve:kv_transfer_nic_bytes_total{role=\"prefill\",nic=\"127.0.0.2\"}"));
  EXPECT_TRUE(AllPagesFree(*s.decode));
  EXPECT_TRUE(AllPagesFree(*s.prefill->engine));
}

// The first KV write on NIC 1 lands but reports an error: the transfer moves to a fresh imm and
// every KV write is re-posted on NIC 0 (the second write on NIC 0 is held back 500 ms, so the KV
// cannot have all landed before the Reroute is answered). --kv-checksum: the decode side checks
// the KV it counted against the prefill's CRCs, so a count reached early (a write counted twice)
// would fail.
TEST(MessengerNicsTest, LostCompletionOnOneNicReroutesWithoutLosingTheRequest) {
  auto nic0 = std::make_shared<FaultInjector>();
  auto nic1 = std::make_shared<FaultInjector>();
  FaultRule delay;
  delay.site = transfer::FaultSite::kWrite;
  delay.kind = FaultKind::kDelay;
  delay.nth = 2;
  delay.delay_ms = 500;
  nic0->Arm(delay);
  nic1->Arm(FailWrite(1, 1));
  Split s = Start({nic0, nic1}, /*checksum=*/true);
  if (s.prefill == nullptr) GTEST_SKIP() << "tcp;ofi_rxm is not available here";
  ASSERT_NE(s.decode, nullptr);
  const TransferMetrics& m = s.prefill->messenger->metrics();
  uint64_t nic1_bytes = 0;
  for (int salt = 0; salt < 3; ++salt) {
    const auto prompt = PromptOf(kPromptLen, 10 + salt);
    Outcome o = Generate(*s.decode, prompt, kMaxTokens);
    ASSERT_TRUE(o.error.ok()) << o.error.ToString();
    EXPECT_EQ(o.tokens, Colocated(prompt)) << "salt " << salt;
    if (salt == 0) nic1_bytes = m.nic_bytes(1);
  }
  EXPECT_EQ(nic1->num_applied(), 1u);
  EXPECT_EQ(m.rerouted(), 1u);
  // NIC 1 is out of rotation towards this decode instance (kNicDownS) since its failure: the
  // later requests' KV went on NIC 0 alone; the re-posted writes count on NIC 0 again.
  EXPECT_GE(s.decode->metrics().keys_revoked(), 1u);  // NIC 1's, for this prefill instance
  EXPECT_GT(nic1_bytes, 0u);
  EXPECT_EQ(m.nic_bytes(1), nic1_bytes);
  EXPECT_GT(m.nic_bytes(0) + m.nic_bytes(1), m.kv_bytes());
  EXPECT_EQ(s.decode->metrics().checksum_mismatch(), 0u);
  EXPECT_EQ(s.decode->metrics().retried(), 0u);  // rerouted, not retried
  EXPECT_TRUE(AllPagesFree(*s.decode));
  EXPECT_TRUE(AllPagesFree(*s.prefill->engine));
}

// Every write on both NICs fails: no NIC is left, the request fails with the write's error (one
// prefill instance: nowhere to retry) and every page is free on both sides.
TEST(MessengerNicsTest, NoNicLeftFailsTheRequestAndFreesItsPages) {
  auto nic0 = std::make_shared<FaultInjector>();
  auto nic1 = std::make_shared<FaultInjector>();
  nic0->Arm(FailWrite(1, 1000));
  nic1->Arm(FailWrite(1, 1000));
  Split s = Start({nic0, nic1}, /*checksum=*/false);
  if (s.prefill == nullptr) GTEST_SKIP() << "tcp;ofi_rxm is not available here";
  ASSERT_NE(s.decode, nullptr);
  Outcome o = Generate(*s.decode, PromptOf(kPromptLen, 20), kMaxTokens);
  ASSERT_FALSE(o.error.ok());
  EXPECT_THAT(o.error.ToString(), HasSubstr("injected"));
  EXPECT_TRUE(AllPagesFree(*s.decode));
  EXPECT_TRUE(AllPagesFree(*s.prefill->engine));
}

TEST(MessengerNicsTest, NicListIsChecked) {
  EXPECT_TRUE(ResolveNics("", "tcp;ofi_rxm")->empty());
  EXPECT_EQ(*ResolveNics("10.0.1.1,mlx5_0", "tcp;ofi_rxm"),
            (std::vector<std::string>{"10.0.1.1", "mlx5_0"}));
  EXPECT_THAT(ResolveNics("10.0.1.1,,x", "tcp").status().message(), HasSubstr("empty entry"));
  EXPECT_THAT(ResolveNics("a,a", "tcp").status().message(), HasSubstr("names 'a' twice"));
  transfer::DomainOptions base;
  EXPECT_EQ(NicDomainOptions(base, "10.0.2.1").node, "10.0.2.1");
  EXPECT_EQ(NicDomainOptions(base, "mlx5_1").domain_name, "mlx5_1");
  transfer::DomainInfo info;
  info.provider = "sockets";
  info.cq_data_size = 0;
  EXPECT_THAT(CheckKvCapabilities(info).message(), HasSubstr("FI_REMOTE_CQ_DATA"));
  info.cq_data_size = 8;
  EXPECT_TRUE(CheckKvCapabilities(info).ok());
}

}  // namespace
}  // namespace pd::messenger
