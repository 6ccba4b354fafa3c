// Fault injection (fault_injection.h): rule parsing and matching, and each fault's effect on a
// real paged write between two loopback domains — which bytes land, how many immediates are
// counted, and that the source memory is never changed.
#include "transfer/fault_injection.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "transfer/domain.h"
#include "transfer/test_util.h"

namespace pd::transfer {
namespace {

using testing::Done;
using testing::LoopbackOptions;
using testing::Mapping;

FaultRule Rule(FaultSite site, FaultKind kind, uint64_t nth, uint32_t delay_ms = 50) {
  FaultRule rule;
  rule.site = site;
  rule.kind = kind;
  rule.nth = nth;
  rule.delay_ms = delay_ms;
  return rule;
}

TEST(FaultRulesTest, ParseAndPrint) {
  auto rules = ParseFaultRules("write:corrupt:5,imm:delay:2:800,imm:dup:1,write:reorder:3");
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  ASSERT_EQ(rules->size(), 4u);
  EXPECT_EQ((*rules)[0].site, FaultSite::kWrite);
  EXPECT_EQ((*rules)[0].kind, FaultKind::kCorrupt);
  EXPECT_EQ((*rules)[0].nth, 5u);
  EXPECT_EQ((*rules)[1].site, FaultSite::kImmediate);
  EXPECT_EQ((*rules)[1].delay_ms, 800u);
  EXPECT_EQ(FaultRuleToString((*rules)[1]), "imm:delay:2:800");
  EXPECT_EQ(FaultRuleToString((*rules)[2]), "imm:dup:1");
  EXPECT_TRUE(ParseFaultRules("")->empty());
  for (const char* bad : {"write:drop", "disk:drop:1", "write:melt:1", "write:drop:0",
                          "write:drop:x", "imm:delay:1:-5", "write:drop:1,"}) {
    SCOPED_TRACE(bad);
    auto r = ParseFaultRules(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_NE(ParseFaultRules("write:melt:1").status().message().find("kind 'melt'"),
            std::string::npos);
}

TEST(FaultRulesTest, TheNthMatchingOperationsAreFaultedOnce) {
  FaultInjector f;
  FaultRule rule = Rule(FaultSite::kWrite, FaultKind::kDrop, 3);
  rule.count = 2;
  rule.imm = 9;
  f.Arm(rule);
  f.Arm(Rule(FaultSite::kImmediate, FaultKind::kDuplicate, 1));
  std::vector<int> faulted;
  for (int i = 1; i <= 8; ++i) {
    EXPECT_FALSE(f.Decide(FaultSite::kWrite, 10).has_value());  // another imm: not counted
    if (f.Decide(FaultSite::kWrite, 9)) faulted.push_back(i);
  }
  EXPECT_EQ(faulted, (std::vector<int>{3, 4}));
  EXPECT_TRUE(f.Decide(FaultSite::kImmediate, 1).has_value());
  EXPECT_FALSE(f.Decide(FaultSite::kImmediate, 1).has_value());
  EXPECT_EQ(f.num_applied(), 3u);
  f.Disarm();
  EXPECT_FALSE(f.Decide(FaultSite::kWrite, std::nullopt).has_value());
}

// Polls `pred` until it holds or 10 s pass (state another thread updates).
bool Eventually(const std::function<bool()>& pred) {
  const double end = SystemClock::Get().NowSeconds() + 10.0;
  while (!pred()) {
    if (SystemClock::Get().NowSeconds() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

constexpr uint32_t kPages = 8;
constexpr uint64_t kPageBytes = 256;
constexpr uint32_t kImm = 77;

// Domain a writes pages 0..7 of its region into pages 0..7 of b's with imm 77; each has its own
// injector.
class FaultedWriteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DomainOptions o = LoopbackOptions();
    o.faults = a_faults_;
    auto a = Domain::Create(o);
    if (!a.ok()) PD_SKIP_IF_ABSENT_ELSE_FAIL(a.status());
    a_ = std::move(a).value();
    o.faults = b_faults_;
    auto b = Domain::Create(o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    b_ = std::move(b).value();
    src_.FillRandom(3);
    original_.assign(src_.data(), src_.data() + src_.size());
    dst_.Fill(0);
    auto src_mr = a_->RegisterMemory(src_.data(), src_.size());
    ASSERT_TRUE(src_mr.ok());
    src_mr_ = *src_mr;
    auto dst_mr = b_->RegisterMemory(dst_.data(), dst_.size());
    ASSERT_TRUE(dst_mr.ok());
    auto remote = a_->AddRemote(dst_mr->descriptor);
    ASSERT_TRUE(remote.ok());
    remote_ = *remote;
  }

  // Submits the paged write; its completion goes to done_.
  TransferId Write() {
    PagedWriteRequest r;
    r.src = src_mr_;
    r.dst = remote_;
    for (uint32_t k = 0; k < kPages; ++k) {
      r.src_pages.push_back(k);
      r.dst_pages.push_back(k);
    }
    r.bytes_per_page = r.src_stride = r.dst_stride = kPageBytes;
    r.imm = kImm;
    auto id = a_->SubmitPagedWrite(r, done_.Callback());
    PD_CHECK(id.ok()) << id.status().ToString();
    return *id;
  }

  // Whether page k landed as sent.
  bool Landed(uint32_t k) const {
    return std::memcmp(dst_.data() + k * kPageBytes, original_.data() + k * kPageBytes,
                       kPageBytes) == 0;
  }
  std::vector<uint32_t> MissingPages() const {
    std::vector<uint32_t> missing;
    for (uint32_t k = 0; k < kPages; ++k) {
      if (!Landed(k)) missing.push_back(k);
    }
    return missing;
  }
  bool SourceUnchanged() const {
    return std::memcmp(src_.data(), original_.data(), src_.size()) == 0;
  }
  // Waits for `n` arrivals of kImm (counted with a counter expecting `n`).
  bool Arrivals(uint64_t n) {
    auto waiter = b_->imm_counters().Expect(kImm, n);
    return waiter.ok() && (*waiter)->WaitFor(10.0);
  }

  std::shared_ptr<FaultInjector> a_faults_ = std::make_shared<FaultInjector>();
  std::shared_ptr<FaultInjector> b_faults_ = std::make_shared<FaultInjector>();
  std::unique_ptr<Domain> a_, b_;
  Mapping src_{kPages * kPageBytes}, dst_{kPages * kPageBytes};
  std::vector<char> original_;
  MemoryRegion src_mr_;
  RemoteRegion remote_;
  Done done_;
};

TEST_F(FaultedWriteTest, ADroppedWriteCompletesButNeverLands) {
  a_faults_->Arm(Rule(FaultSite::kWrite, FaultKind::kDrop, 3));
  Write();
  ASSERT_TRUE(done_.Wait()->ok());
  EXPECT_TRUE(Arrivals(7));
  EXPECT_EQ(MissingPages(), (std::vector<uint32_t>{2}));
  EXPECT_EQ(a_faults_->num_applied(), 1u);
}

TEST_F(FaultedWriteTest, ADuplicatedWriteLandsTwice) {
  a_faults_->Arm(Rule(FaultSite::kWrite, FaultKind::kDuplicate, 2));
  Write();
  ASSERT_TRUE(done_.Wait()->ok());
  EXPECT_TRUE(Arrivals(9));
  EXPECT_TRUE(MissingPages().empty());
  // The copy's completion is swallowed; once it is back the region can go.
  EXPECT_TRUE(Eventually([&] { return a_->Deregister(src_mr_).ok(); }));
}

TEST_F(FaultedWriteTest, ACorruptedWriteLandsOneByteWrongAndTheSourceStaysIntact) {
  a_faults_->Arm(Rule(FaultSite::kWrite, FaultKind::kCorrupt, 4));
  Write();
  ASSERT_TRUE(done_.Wait()->ok());
  EXPECT_TRUE(Arrivals(8));
  EXPECT_EQ(MissingPages(), (std::vector<uint32_t>{3}));
  const size_t at = 3 * kPageBytes + kPageBytes / 2;
  EXPECT_EQ(static_cast<uint8_t>(dst_.data()[at] ^ original_[at]), 0xFF);
  dst_.data()[at] = original_[at];
  EXPECT_TRUE(MissingPages().empty()) << "more than one byte differs";
  EXPECT_TRUE(SourceUnchanged());
}

TEST_F(FaultedWriteTest, DelayedAndReorderedWritesAllLand) {
  a_faults_->Arm(Rule(FaultSite::kWrite, FaultKind::kDelay, 1, 100));
  a_faults_->Arm(Rule(FaultSite::kWrite, FaultKind::kReorder, 5));
  Write();
  ASSERT_TRUE(done_.Wait()->ok());
  EXPECT_TRUE(Arrivals(8));
  EXPECT_TRUE(MissingPages().empty());
  EXPECT_EQ(a_faults_->num_applied(), 2u);
}

TEST_F(FaultedWriteTest, AHeldWriteOfACancelledTransferIsNeverPosted) {
  a_faults_->Arm(Rule(FaultSite::kWrite, FaultKind::kDelay, 1, 300));
  a_->Cancel(Write());
  auto status = done_.Wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), StatusCode::kCancelled);
  // The held write is dropped at the worker's next pass, never posted; then the region is free.
  EXPECT_TRUE(Eventually([&] { return a_->Deregister(src_mr_).ok(); }));
  EXPECT_FALSE(Landed(0));
}

TEST_F(FaultedWriteTest, ImmediatesDroppedDuplicatedOrCorruptedAtTheTarget) {
  b_faults_->Arm(Rule(FaultSite::kImmediate, FaultKind::kDrop, 2));
  b_faults_->Arm(Rule(FaultSite::kImmediate, FaultKind::kDuplicate, 4));
  b_faults_->Arm(Rule(FaultSite::kImmediate, FaultKind::kCorrupt, 6));
  Write();
  ASSERT_TRUE(done_.Wait()->ok());
  // 8 landed: one not counted, one counted twice, one counted under another value.
  EXPECT_TRUE(Arrivals(7));
  EXPECT_TRUE(Eventually([&] { return b_->imm_counters().unclaimed(kImm ^ 0x40000000u) == 1; }));
  EXPECT_TRUE(MissingPages().empty());
  EXPECT_EQ(b_faults_->num_applied(), 3u);
}

TEST_F(FaultedWriteTest, ImmediatesDelayedOrReorderedAreAllCounted) {
  b_faults_->Arm(Rule(FaultSite::kImmediate, FaultKind::kDelay, 1, 100));
  b_faults_->Arm(Rule(FaultSite::kImmediate, FaultKind::kReorder, 8, 100));  // none follows
  Write();
  ASSERT_TRUE(done_.Wait()->ok());
  EXPECT_TRUE(Arrivals(8));
  EXPECT_EQ(b_faults_->num_applied(), 2u);
}

}  // namespace
}  // namespace pd::transfer
