// Faults injected at the transfer layer (transfer/fault_injection.h) into a real split: two prefill
// instances ("faulty" first, so the decode instance tries it first; "clean" for the retry) and a
// decode instance, in one process over loopback. For the Nth KV write posted by the faulty prefill
// instance, and for the Nth immediate counted by the decode instance: drop, duplicate, corrupt,
// delay and reorder. Each request must end with the colocated engine's greedy tokens (on the first
// attempt or after a retry), or fail with a clear error when there is nowhere to retry; never hang
// (the transfer timeout is short); never answer from wrong KV (--kv-checksum on where the fault
// changes bytes or counts); and leave every page free on all three instances.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "messenger/messenger_test_util.h"
#include "transfer/fault_injection.h"

namespace pd::messenger {
namespace {

using testing::AllPagesFree;
using testing::Async;
using testing::Generate;
using ::testing::HasSubstr;
using testing::kDeadlineS;
using testing::LaunchPrefill;
using testing::MakeEngine;
using testing::Outcome;
using testing::PrefillInstance;
using testing::PromptOf;
using testing::Shape;
using testing::WaitUntil;
using transfer::FaultInjector;
using transfer::FaultKind;
using transfer::FaultRule;
using transfer::FaultSite;

constexpr uint32_t kTimeoutMs = 800;  // per attempt; a lost write or immediate costs this much
constexpr double kPagesFreeS = 10.0;
// Budget 8 chunks the 22 prefilled tokens into three steps: writes stream over steps and layers.
const Shape kShape{engine::KvLayout::kHND, 4, 8};
constexpr int kPromptLen = 23;  // 22 prefilled tokens: 6 pages x 3 layers = 18 KV writes
constexpr int kMaxTokens = 5;

FaultRule Rule(FaultSite site, FaultKind kind, uint64_t nth) {
  FaultRule rule;
  rule.site = site;
  rule.kind = kind;
  rule.nth = nth;
  return rule;
}

// What the test requires of the attempts.
enum class Attempts { kFirst, kRetried, kEither };

struct FaultCase {
  FaultSite site;
  FaultKind kind;
  uint64_t nth;
  uint32_t delay_ms;
  bool checksum;
  Attempts attempts;
};

std::string CaseName(const FaultCase& c) {
  std::string name = std::string(transfer::FaultSiteName(c.site)) + "_" +
                     std::string(transfer::FaultKindName(c.kind)) + "_" + std::to_string(c.nth);
  if (c.kind == FaultKind::kDelay) name += "_" + std::to_string(c.delay_ms) + "ms";
  return name + (c.checksum ? "_checksum" : "");
}

// The colocated engine's greedy tokens for `prompt` (computed once per prompt).
const std::vector<int32_t>& Colocated(const std::vector<int32_t>& prompt) {
  static auto* cache = new std::map<std::vector<int32_t>, std::vector<int32_t>>();
  auto it = cache->find(prompt);
  if (it == cache->end()) {
    auto engine = Async(MakeEngine(kShape));
    Outcome o = Generate(*engine, prompt, kMaxTokens);
    PD_CHECK(o.finish == engine::FinishReason::kLength) << o.error.ToString();
    it = cache->emplace(prompt, o.tokens).first;
    engine->Shutdown();
  }
  return it->second;
}

// Two prefill instances and a decode instance, each domain with its own injector.
struct Split {
  std::shared_ptr<FaultInjector> prefill_faults = std::make_shared<FaultInjector>();
  std::shared_ptr<FaultInjector> decode_faults = std::make_shared<FaultInjector>();
  std::unique_ptr<PrefillInstance> faulty, clean;
  std::unique_ptr<DecodeMessenger> decode;

  // False only where the fabric provider is absent (LaunchPrefill fails the test on any other
  // error).
  bool Start(bool checksum, bool with_clean) {
    faulty = Prefill(checksum, prefill_faults);
    if (faulty == nullptr) return false;
    std::vector<PrefillPeer> peers = {{"faulty", faulty->messenger->fabric_address()}};
    if (with_clean) {
      clean = Prefill(checksum, nullptr);
      peers.push_back({"clean", clean->messenger->fabric_address()});
    }
    DecodeMessengerOptions o = testing::BaseDecodeOptions(peers);
    o.domain.faults = decode_faults;
    o.transfer_timeout_ms = kTimeoutMs;
    o.fence_grace_s = 1.0;
    o.kv_checksum = checksum;
    auto e = MakeEngine(kShape);
    engine::ModelRunner& runner = e->runner();
    auto d = DecodeMessenger::Create(o, runner, Async(std::move(e)));
    PD_CHECK(d.ok()) << d.status().ToString();
    decode = std::move(d).value();
    EXPECT_TRUE(WaitUntil([&] {
      for (const PeerStatus& p : decode->peers()) {
        if (p.state != PeerStatus::State::kAccepted) return false;
      }
      return true;
    })) << "not every prefill instance accepted the decode instance";
    return true;
  }

  static std::unique_ptr<PrefillInstance> Prefill(bool checksum,
                                                  std::shared_ptr<FaultInjector> faults) {
    PrefillMessengerOptions o = testing::BasePrefillOptions();
    o.domain.faults = std::move(faults);
    o.kv_checksum = checksum;
    return LaunchPrefill(MakeEngine(kShape), o);
  }

  void ExpectAllPagesFree() {
    EXPECT_TRUE(AllPagesFree(*decode, kPagesFreeS)) << "decode instance";
    EXPECT_TRUE(AllPagesFree(*faulty->engine, kPagesFreeS)) << "faulty prefill instance";
    if (clean) {
      EXPECT_TRUE(AllPagesFree(*clean->engine, kPagesFreeS)) << "clean prefill instance";
    }
  }
};

class MessengerFaultTest : public ::testing::TestWithParam<FaultCase> {};

TEST_P(MessengerFaultTest, AnsweredCorrectlyOrRetriedAndEveryPageFree) {
  const FaultCase c = GetParam();
  Split split;
  if (!split.Start(c.checksum, /*with_clean=*/true)) GTEST_SKIP() << "libfabric unavailable";
  const auto prompt = PromptOf(kPromptLen, 5);
  FaultRule rule = Rule(c.site, c.kind, c.nth);
  rule.delay_ms = c.delay_ms;
  FaultInjector& faults =
      c.site == FaultSite::kWrite ? *split.prefill_faults : *split.decode_faults;
  faults.Arm(rule);

  Outcome got = Generate(*split.decode, prompt, kMaxTokens, nullptr, kDeadlineS);
  ASSERT_EQ(got.finish, engine::FinishReason::kLength) << got.error.ToString();
  EXPECT_EQ(got.tokens, Colocated(prompt)) << "tokens computed from wrong KV";
  EXPECT_EQ(faults.num_applied(), 1u) << "the fault was not injected";
  const TransferMetrics& m = split.decode->metrics();
  if (c.attempts == Attempts::kFirst) {
    EXPECT_EQ(m.retried(), 0u);
  } else if (c.attempts == Attempts::kRetried) {
    EXPECT_EQ(m.retried(), 1u);
  }
  EXPECT_EQ(m.failed(), 0u);
  if (c.checksum && c.kind == FaultKind::kCorrupt && c.site == FaultSite::kWrite) {
    EXPECT_EQ(m.checksum_mismatch(), 1u);
  }
  if (m.retried() == 0) {
    EXPECT_EQ(m.checksum_mismatch(), 0u);
  }
  split.ExpectAllPagesFree();
}

constexpr FaultSite kW = FaultSite::kWrite;
constexpr FaultSite kI = FaultSite::kImmediate;
constexpr uint32_t kShort = 100;  // well inside kTimeoutMs
constexpr uint32_t kLong = 3 * kTimeoutMs;

INSTANTIATE_TEST_SUITE_P(
    Faults, MessengerFaultTest,
    ::testing::Values(
        // A lost write or immediate: the counter never fires, the attempt times out, the clean
        // instance answers.
        FaultCase{kW, FaultKind::kDrop, 3, 0, false, Attempts::kRetried},
        FaultCase{kW, FaultKind::kDrop, 3, 0, true, Attempts::kRetried},
        FaultCase{kI, FaultKind::kDrop, 3, 0, false, Attempts::kRetried},
        FaultCase{kI, FaultKind::kDrop, 1, 0, true, Attempts::kRetried},
        // A corrupted immediate is counted under another value: as lost.
        FaultCase{kI, FaultKind::kCorrupt, 2, 0, false, Attempts::kRetried},
        // Corrupted bytes land and are counted: only the checksum can tell.
        FaultCase{kW, FaultKind::kCorrupt, 1, 0, true, Attempts::kRetried},
        FaultCase{kW, FaultKind::kCorrupt, 7, 0, true, Attempts::kRetried},
        FaultCase{kW, FaultKind::kCorrupt, 18, 0, true, Attempts::kRetried},
        // A duplicate is counted twice, so the counter can fire one write early: the checksum
        // sees a write still missing (retried) or, if it landed meanwhile, passes.
        FaultCase{kW, FaultKind::kDuplicate, 2, 0, true, Attempts::kEither},
        FaultCase{kI, FaultKind::kDuplicate, 2, 0, true, Attempts::kEither},
        // Late but inside the timeout: the first attempt succeeds; past it: retried.
        FaultCase{kW, FaultKind::kDelay, 4, kShort, false, Attempts::kFirst},
        FaultCase{kW, FaultKind::kDelay, 4, kLong, true, Attempts::kRetried},
        FaultCase{kI, FaultKind::kDelay, 4, kShort, true, Attempts::kFirst},
        FaultCase{kI, FaultKind::kDelay, 4, kLong, false, Attempts::kRetried},
        // The counter does not care about order.
        FaultCase{kW, FaultKind::kReorder, 2, kShort, false, Attempts::kFirst},
        FaultCase{kW, FaultKind::kReorder, 2, kShort, true, Attempts::kFirst},
        FaultCase{kI, FaultKind::kReorder, 2, kShort, true, Attempts::kFirst}),
    [](const ::testing::TestParamInfo<FaultCase>& info) { return CaseName(info.param); });

// With one prefill instance there is nowhere to retry: the request fails with the reason.
TEST(MessengerFaultLoneTest, ACorruptedWriteFailsTheRequestWithTheChecksumMismatch) {
  Split split;
  if (!split.Start(/*checksum=*/true, /*with_clean=*/false))
    GTEST_SKIP() << "libfabric unavailable";
  split.prefill_faults->Arm(Rule(FaultSite::kWrite, FaultKind::kCorrupt, 5));
  Outcome got = Generate(*split.decode, PromptOf(kPromptLen, 6), kMaxTokens);
  EXPECT_EQ(got.finish, engine::FinishReason::kError);
  EXPECT_EQ(got.error.code(), StatusCode::kDataLoss) << got.error.ToString();
  EXPECT_THAT(got.error.message(), HasSubstr("KV checksum mismatch in 1 of 3 layers"));
  EXPECT_THAT(got.error.message(), HasSubstr("faulty"));
  EXPECT_TRUE(got.tokens.empty());
  EXPECT_EQ(split.decode->metrics().checksum_mismatch(), 1u);
  split.ExpectAllPagesFree();
}

TEST(MessengerFaultLoneTest, ADroppedWriteFailsTheRequestAtTheTransferTimeout) {
  Split split;
  if (!split.Start(/*checksum=*/false, /*with_clean=*/false))
    GTEST_SKIP() << "libfabric unavailable";
  split.prefill_faults->Arm(Rule(FaultSite::kWrite, FaultKind::kDrop, 9));
  const double start = NowSeconds();
  Outcome got = Generate(*split.decode, PromptOf(kPromptLen, 7), kMaxTokens);
  EXPECT_LT(NowSeconds() - start, kDeadlineS);
  EXPECT_EQ(got.finish, engine::FinishReason::kError);
  EXPECT_EQ(got.error.code(), StatusCode::kDeadlineExceeded) << got.error.ToString();
  EXPECT_THAT(got.error.message(), HasSubstr("did not complete the KV transfer"));
  EXPECT_TRUE(got.tokens.empty());
  split.ExpectAllPagesFree();
  // The instance is fine afterwards: the next request goes through.
  const auto prompt = PromptOf(kPromptLen, 8);
  Outcome next = Generate(*split.decode, prompt, kMaxTokens);
  EXPECT_EQ(next.tokens, Colocated(prompt)) << next.error.ToString();
}

// Several requests at once with a fault in one of them: the others are unaffected.
TEST(MessengerFaultLoneTest, AFaultInOneTransferLeavesTheOthersAlone) {
  Split split;
  if (!split.Start(/*checksum=*/true, /*with_clean=*/true)) GTEST_SKIP() << "libfabric unavailable";
  split.prefill_faults->Arm(Rule(FaultSite::kWrite, FaultKind::kCorrupt, 11));
  std::vector<std::thread> threads;
  std::vector<Outcome> got(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back(
        [&, i] { got[i] = Generate(*split.decode, PromptOf(kPromptLen + i, 20 + i), kMaxTokens); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(got[i].tokens, Colocated(PromptOf(kPromptLen + i, 20 + i))) << "request " << i;
  }
  EXPECT_EQ(split.decode->metrics().checksum_mismatch(), 1u);
  EXPECT_EQ(split.decode->metrics().retried(), 1u);
  split.ExpectAllPagesFree();
}

// --kv-checksum on both sides changes nothing else: tokens as colocated, no mismatch, over layouts,
// page sizes and chunking.
TEST(MessengerChecksumTest, CleanTransfersPassOverShapes) {
  for (const Shape& s : {Shape{engine::KvLayout::kHND, 4, 64}, Shape{engine::KvLayout::kNHD, 16, 5},
                         Shape{engine::KvLayout::kHND, 1, 3}}) {
    SCOPED_TRACE(std::string(engine::KvLayoutName(s.layout)) + " page " +
                 std::to_string(s.page_size));
    PrefillMessengerOptions po = testing::BasePrefillOptions();
    po.kv_checksum = true;
    auto prefill = LaunchPrefill(MakeEngine(s), po);
    if (prefill == nullptr) GTEST_SKIP() << "libfabric unavailable";
    DecodeMessengerOptions o =
        testing::BaseDecodeOptions({{"p0", prefill->messenger->fabric_address()}});
    o.kv_checksum = true;
    auto e = MakeEngine(s);
    engine::ModelRunner& runner = e->runner();
    auto decode = DecodeMessenger::Create(o, runner, Async(std::move(e)));
    ASSERT_TRUE(decode.ok());
    ASSERT_TRUE((*decode)->WaitForPeers(kDeadlineS).ok());
    auto colocated = Async(MakeEngine(s));
    for (int len : {2, 5, 17, 30}) {
      const auto prompt = PromptOf(len, len);
      Outcome got = Generate(**decode, prompt, 4);
      EXPECT_EQ(got.tokens, Generate(*colocated, prompt, 4).tokens) << got.error.ToString();
    }
    EXPECT_EQ((*decode)->metrics().checksum_mismatch(), 0u);
    EXPECT_EQ((*decode)->metrics().retried(), 0u);
    EXPECT_TRUE(AllPagesFree(**decode));
    EXPECT_TRUE(AllPagesFree(*prefill->engine));
  }
}

TEST(MessengerChecksumTest, BothSidesMustAgree) {
  PrefillMessengerOptions po = testing::BasePrefillOptions();
  po.kv_checksum = false;
  auto prefill = LaunchPrefill(MakeEngine(kShape), po);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric unavailable";
  DecodeMessengerOptions o =
      testing::BaseDecodeOptions({{"p0", prefill->messenger->fabric_address()}});
  o.kv_checksum = true;
  auto e = MakeEngine(kShape);
  engine::ModelRunner& runner = e->runner();
  auto decode = DecodeMessenger::Create(o, runner, Async(std::move(e)));
  ASSERT_TRUE(decode.ok());
  Status s = (*decode)->WaitForPeers(kDeadlineS);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("kv_checksum: ours off, theirs on"));
}

}  // namespace
}  // namespace pd::messenger
