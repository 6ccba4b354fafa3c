// Two fabric domains in one process over real libfabric (tcp;ofi_rxm on loopback).
#include "transfer/domain.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "transfer/test_util.h"

namespace pd::transfer {
namespace {

using testing::Done;
using testing::LoopbackOptions;
using testing::Mapping;
using testing::SilentPeer;

class DomainPairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = Domain::Create(LoopbackOptions());
    if (!a.ok()) PD_SKIP_IF_ABSENT_ELSE_FAIL(a.status());
    a_ = std::move(a).value();
    auto b = Domain::Create(LoopbackOptions());
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    b_ = std::move(b).value();
  }
  std::unique_ptr<Domain> a_, b_;
};

TEST_F(DomainPairTest, ReportsProviderAttributes) {
  EXPECT_EQ(a_->info().provider, "tcp;ofi_rxm");
  EXPECT_GE(a_->info().cq_data_size, 4u);
  EXPECT_FALSE(a_->info().address.empty());
  EXPECT_NE(a_->info().address, b_->info().address);
}

TEST_F(DomainPairTest, WriteWithImmLandsExactlyAndCounterFires) {
  Mapping src(1 << 16), dst(1 << 16);
  src.FillRandom(1);
  dst.Fill('\x5a');
  auto src_mr = a_->RegisterMemory(src.data(), src.size());
  ASSERT_TRUE(src_mr.ok()) << src_mr.status().ToString();
  auto dst_mr = b_->RegisterMemory(dst.data(), dst.size());
  ASSERT_TRUE(dst_mr.ok()) << dst_mr.status().ToString();
  auto bytes = dst_mr->descriptor.ToBytes();
  auto desc = MemoryDescriptor::FromBytes(bytes);
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();
  auto remote = a_->AddRemote(*desc);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();

  int fired = 0;
  auto waiter = b_->imm_counters().Expect(77, 1, [&] { ++fired; });
  ASSERT_TRUE(waiter.ok());
  WriteRequest w;
  w.src = *src_mr;
  w.src_offset = 100;
  w.length = 5000;
  w.dst = *remote;
  w.dst_offset = 3000;
  w.imm = 77;
  Done done;
  ASSERT_TRUE(a_->SubmitWrite(w, done.Callback()).ok());
  auto status = done.Wait();
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(status->ok()) << status->ToString();
  ASSERT_TRUE((*waiter)->WaitFor(30.0));
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(std::memcmp(dst.data() + 3000, src.data() + 100, 5000), 0);
  for (size_t i = 0; i < dst.size(); ++i) {
    if (i >= 3000 && i < 8000) continue;
    ASSERT_EQ(dst.data()[i], '\x5a') << "guard byte " << i << " changed";
  }
  EXPECT_EQ(a_->num_pending(), 0u);
}

// Registers `dst` on b and returns a's view of it, through the serialised descriptor.
RemoteRegion ExportTo(Domain& owner, Domain& writer, const MemoryRegion& region) {
  auto desc = MemoryDescriptor::FromBytes(region.descriptor.ToBytes());
  PD_CHECK(desc.ok()) << desc.status().ToString();
  auto remote = writer.AddRemote(*desc);
  PD_CHECK(remote.ok()) << remote.status().ToString();
  (void)owner;
  return *remote;
}

// HND pages of H heads, T tokens, D elements of E bytes: a prefill rank holding all 4 heads writes
// heads [2, 4) of some pages into a decode rank that owns only those 2 heads, and into one that
// holds all 4 heads (destination offset = head 2). Every byte outside the slices stays untouched.
TEST_F(DomainPairTest, PagedWriteMovesHeadShardSlicesExactly) {
  constexpr uint64_t kH = 4, kT = 3, kD = 40, kE = 2;
  constexpr uint64_t kHeadBytes = kT * kD * kE;   // one head of one page
  constexpr uint64_t kSrcPage = kH * kHeadBytes;  // (H, T, D)
  constexpr uint64_t kNumSrcPages = 9, kNumDstPages = 5;
  struct Case {
    uint64_t dst_heads;   // heads per destination page
    uint64_t dst_offset;  // where head 2's slice goes inside a destination page
  };
  for (const Case& c : {Case{2, 0}, Case{4, 2 * kHeadBytes}}) {
    SCOPED_TRACE(c.dst_heads);
    const uint64_t dst_page = c.dst_heads * kHeadBytes;
    Mapping src(kNumSrcPages * kSrcPage), dst(kNumDstPages * dst_page + 64);
    src.FillRandom(7);
    dst.Fill('\x33');
    auto src_mr = a_->RegisterMemory(src.data(), src.size());
    auto dst_mr = b_->RegisterMemory(dst.data(), dst.size());
    ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
    PagedWriteRequest r;
    r.src = *src_mr;
    r.dst = ExportTo(*b_, *a_, *dst_mr);
    r.src_pages = {5, 1, 8};
    r.dst_pages = {0, 4, 2};
    r.bytes_per_page = 2 * kHeadBytes;
    r.src_stride = kSrcPage;
    r.src_offset = 2 * kHeadBytes;
    r.dst_stride = dst_page;
    r.dst_offset = c.dst_offset;
    r.imm = 900 + static_cast<uint32_t>(c.dst_heads);
    auto waiter = b_->imm_counters().Expect(*r.imm, 3);
    ASSERT_TRUE(waiter.ok());
    Done done;
    ASSERT_TRUE(a_->SubmitPagedWrite(r, done.Callback()).ok());
    auto status = done.Wait();
    ASSERT_TRUE(status && status->ok()) << (status ? status->ToString() : "no completion");
    ASSERT_TRUE((*waiter)->WaitFor(30.0));
    EXPECT_EQ((*waiter)->received(), 3u);

    std::vector<char> expect(dst.size(), '\x33');
    for (size_t k = 0; k < r.src_pages.size(); ++k) {
      std::memcpy(expect.data() + r.dst_offset + r.dst_pages[k] * r.dst_stride,
                  src.data() + r.src_offset + r.src_pages[k] * r.src_stride, r.bytes_per_page);
    }
    for (size_t i = 0; i < dst.size(); ++i) {
      ASSERT_EQ(dst.data()[i], expect[i]) << "byte " << i;
    }
    ASSERT_TRUE(a_->Deregister(*src_mr).ok());
    ASSERT_TRUE(b_->Deregister(*dst_mr).ok());
  }
}

TEST_F(DomainPairTest, ManyWritesCountOncePerImmAcrossInterleavedTransfers) {
  Mapping src(1 << 20), dst(1 << 20);
  src.FillRandom(3);
  auto src_mr = a_->RegisterMemory(src.data(), src.size());
  auto dst_mr = b_->RegisterMemory(dst.data(), dst.size());
  ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
  RemoteRegion remote = ExportTo(*b_, *a_, *dst_mr);
  // Three transfers interleave their pages; counter 2 is registered after its writes landed.
  std::atomic<int> fired0{0}, fired1{0}, fired2{0};
  ASSERT_TRUE(b_->imm_counters().Expect(10, 64, [&] { ++fired0; }).ok());
  ASSERT_TRUE(b_->imm_counters().Expect(11, 32, [&] { ++fired1; }).ok());
  std::vector<std::unique_ptr<Done>> dones;
  for (uint32_t imm : {10u, 11u, 12u, 10u}) {
    PagedWriteRequest r;
    r.src = *src_mr;
    r.dst = remote;
    for (uint32_t p = 0; p < 32; ++p) {
      r.src_pages.push_back(p);
      r.dst_pages.push_back(31 - p);
    }
    r.bytes_per_page = 4096;
    r.src_stride = r.dst_stride = 4096;
    r.dst_offset = (imm - 10) * 32 * 4096;
    r.imm = imm;
    dones.push_back(std::make_unique<Done>());
    ASSERT_TRUE(a_->SubmitPagedWrite(r, dones.back()->Callback()).ok());
  }
  for (auto& d : dones) {
    auto s = d->Wait();
    ASSERT_TRUE(s && s->ok());
  }
  // Remote completions may trail the local ones: wait for the counters, then register the late one.
  auto w12 = b_->imm_counters().Expect(12, 32, [&] { ++fired2; });
  ASSERT_TRUE(w12.ok());
  ASSERT_TRUE((*w12)->WaitFor(30.0));
  EXPECT_EQ(fired2.load(), 1);
  for (int i = 0; i < 3000 && (fired0 == 0 || fired1 == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(fired0.load(), 1);
  EXPECT_EQ(fired1.load(), 1);
  EXPECT_EQ(b_->imm_counters().num_active(), 0u);
  EXPECT_EQ(std::memcmp(dst.data() + 31 * 4096, src.data(), 4096), 0);
}

TEST_F(DomainPairTest, ControlMessagesRoundTrip) {
  // b echoes every message back to a with a prefix; a collects the replies.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> replies;
  DomainOptions ao = LoopbackOptions(), bo = LoopbackOptions();
  ao.on_message = [&](std::string_view m) {
    std::lock_guard<std::mutex> lock(mu);
    replies.emplace_back(m);
    cv.notify_all();
  };
  std::unique_ptr<Domain> b;
  PeerAddr b_to_a;
  bo.on_message = [&](std::string_view m) {
    ASSERT_TRUE(b->SubmitSend(b_to_a, "echo:" + std::string(m), nullptr).ok());
  };
  auto a = Domain::Create(ao);
  auto bres = Domain::Create(bo);
  ASSERT_TRUE(a.ok() && bres.ok());
  b = std::move(bres).value();
  b_to_a = *b->AddPeer((*a)->info().address);
  auto a_to_b = (*a)->AddPeer(b->info().address);
  ASSERT_TRUE(a_to_b.ok());
  std::vector<std::unique_ptr<Done>> dones;
  for (int i = 0; i < 100; ++i) {  // more than the send and receive pools hold
    dones.push_back(std::make_unique<Done>());
    ASSERT_TRUE(
        (*a)->SubmitSend(*a_to_b, "msg" + std::to_string(i), dones.back()->Callback()).ok());
  }
  for (auto& d : dones) {
    auto s = d->Wait();
    ASSERT_TRUE(s && s->ok()) << (s ? s->ToString() : "none");
  }
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return replies.size() == 100; }));
  std::sort(replies.begin(), replies.end());
  std::vector<std::string> expect;
  for (int i = 0; i < 100; ++i) expect.push_back("echo:msg" + std::to_string(i));
  std::sort(expect.begin(), expect.end());
  EXPECT_EQ(replies, expect);
  lock.unlock();
  b.reset();  // before the handler's captures go away
}

TEST_F(DomainPairTest, OversizedOrEmptyControlMessageIsRejected) {
  auto peer = a_->AddPeer(b_->info().address);
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(a_->SubmitSend(*peer, std::string(5000, 'x'), nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->SubmitSend(*peer, "", nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->AddPeer("short").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(DomainPairTest, BadDescriptorsAndRangesAreRejectedBeforePosting) {
  Mapping src(8192), dst(8192);
  dst.Fill('\x11');
  auto src_mr = a_->RegisterMemory(src.data(), src.size());
  auto dst_mr = b_->RegisterMemory(dst.data(), dst.size());
  ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
  // Corrupted or truncated descriptor bytes never parse.
  std::string bytes = dst_mr->descriptor.ToBytes();
  std::string flipped = bytes;
  flipped[20] ^= 1;  // inside the key
  EXPECT_EQ(MemoryDescriptor::FromBytes(flipped).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(MemoryDescriptor::FromBytes(bytes.substr(0, bytes.size() - 1)).ok());
  MemoryDescriptor no_key = dst_mr->descriptor;
  no_key.has_key = false;
  EXPECT_FALSE(a_->AddRemote(no_key).ok());
  EXPECT_FALSE(MemoryDescriptor::FromBytes(no_key.ToBytes()).ok());
  MemoryDescriptor bad_addr = dst_mr->descriptor;
  bad_addr.fabric_addr = "xyz";
  EXPECT_FALSE(a_->AddRemote(bad_addr).ok());

  RemoteRegion remote = ExportTo(*b_, *a_, *dst_mr);
  auto base = [&] {
    PagedWriteRequest r;
    r.src = *src_mr;
    r.dst = remote;
    r.src_pages = {0, 1};
    r.dst_pages = {1, 0};
    r.bytes_per_page = 4096;
    r.src_stride = r.dst_stride = 4096;
    return r;
  };
  std::vector<std::pair<const char*, PagedWriteRequest>> bad;
  bad.emplace_back("dst page out of range", base());
  bad.back().second.dst_pages = {2, 0};
  bad.emplace_back("src page out of range", base());
  bad.back().second.src_pages = {0, 7};
  bad.emplace_back("oversized length", base());
  bad.back().second.bytes_per_page = 4097;
  bad.emplace_back("offset pushes past the end", base());
  bad.back().second.dst_offset = 1;
  bad.emplace_back("overflowing stride", base());
  bad.back().second.dst_stride = UINT64_MAX / 2;
  bad.emplace_back("mismatched page lists", base());
  bad.back().second.dst_pages = {0};
  bad.emplace_back("zero bytes", base());
  bad.back().second.bytes_per_page = 0;
  bad.emplace_back("descriptor shorter than claimed pages", base());
  bad.back().second.dst.descriptor.length = 4096;
  bad.emplace_back("unregistered source", base());
  bad.back().second.src = MemoryRegion{};
  for (auto& [what, r] : bad) {
    Done done;
    auto id = a_->SubmitPagedWrite(r, done.Callback());
    EXPECT_FALSE(id.ok()) << what;
    EXPECT_EQ(done.calls(), 0) << what;
  }
  EXPECT_EQ(a_->num_pending(), 0u);
  for (size_t i = 0; i < dst.size(); ++i) ASSERT_EQ(dst.data()[i], '\x11');
}

TEST_F(DomainPairTest, WrongKeyFailsTheWriteWithTheProviderError) {
  Mapping src(4096), dst(4096);
  dst.Fill('\x22');
  auto src_mr = a_->RegisterMemory(src.data(), src.size());
  auto dst_mr = b_->RegisterMemory(dst.data(), dst.size());
  ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
  RemoteRegion remote = ExportTo(*b_, *a_, *dst_mr);
  remote.descriptor.rkey += 1000;  // well-formed, but no region has it
  WriteRequest w{*src_mr, 0, 4096, remote, 0, std::nullopt};
  Done done;
  ASSERT_TRUE(a_->SubmitWrite(w, done.Callback()).ok());
  auto s = done.Wait();
  ASSERT_TRUE(s.has_value());
  EXPECT_FALSE(s->ok());
  EXPECT_NE(s->message().find("fi_writemsg"), std::string::npos) << s->ToString();
  for (size_t i = 0; i < dst.size(); ++i) ASSERT_EQ(dst.data()[i], '\x22');
}

TEST_F(DomainPairTest, WritesToADeregisteredRegionFail) {
  Mapping src(4096), dst(4096);
  dst.Fill('\x44');
  auto src_mr = a_->RegisterMemory(src.data(), src.size());
  auto dst_mr = b_->RegisterMemory(dst.data(), dst.size());
  ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
  RemoteRegion remote = ExportTo(*b_, *a_, *dst_mr);
  ASSERT_TRUE(b_->Deregister(*dst_mr).ok());
  EXPECT_EQ(b_->Deregister(*dst_mr).code(), StatusCode::kNotFound);
  WriteRequest w{*src_mr, 0, 4096, remote, 0, 5u};
  Done done;
  ASSERT_TRUE(a_->SubmitWrite(w, done.Callback()).ok());
  auto s = done.Wait();
  ASSERT_TRUE(s.has_value());
  EXPECT_FALSE(s->ok());
  for (size_t i = 0; i < dst.size(); ++i) ASSERT_EQ(dst.data()[i], '\x44');
  EXPECT_EQ(b_->imm_counters().unclaimed(5), 0u);
  // A deregistered source is refused when the write is posted.
  ASSERT_TRUE(a_->Deregister(*src_mr).ok());
  Done done2;
  ASSERT_TRUE(a_->SubmitWrite(w, done2.Callback()).ok());
  auto s2 = done2.Wait();
  ASSERT_TRUE(s2.has_value());
  EXPECT_EQ(s2->code(), StatusCode::kFailedPrecondition) << s2->ToString();
}

TEST_F(DomainPairTest, CancelFailsAStalledTransferAtOnce) {
  SilentPeer silent;
  Mapping src(1 << 20);
  auto src_mr = a_->RegisterMemory(src.data(), src.size());
  ASSERT_TRUE(src_mr.ok());
  auto remote = a_->AddRemote(silent.Descriptor(a_->info().address.size()));
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  WriteRequest w{*src_mr, 0, 1 << 20, *remote, 0, 1u};
  Done done;
  auto id = a_->SubmitWrite(w, done.Callback());
  ASSERT_TRUE(id.ok());
  a_->Cancel(*id);
  auto s = done.Wait();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->code(), StatusCode::kCancelled) << s->ToString();
  EXPECT_EQ(done.calls(), 1);
  a_->Cancel(*id);  // a finished id is ignored
  EXPECT_EQ(a_->num_pending(), 0u);
}

TEST(DomainDeadlineTest, SilentPeerFailsPendingWritesWithinTheDeadline) {
  DomainOptions o = LoopbackOptions();
  o.op_timeout_s = 0.3;
  PD_CREATE_DOMAIN_OR_SKIP(a, o);
  SilentPeer silent;
  Mapping src(1 << 20);
  auto src_mr = a->RegisterMemory(src.data(), src.size());
  ASSERT_TRUE(src_mr.ok());
  auto remote = a->AddRemote(silent.Descriptor(a->info().address.size()));
  ASSERT_TRUE(remote.ok());
  std::vector<std::unique_ptr<Done>> dones;
  for (int i = 0; i < 4; ++i) {
    dones.push_back(std::make_unique<Done>());
    WriteRequest w{*src_mr, 0, 1 << 20, *remote, 0, std::nullopt};
    ASSERT_TRUE(a->SubmitWrite(w, dones.back()->Callback()).ok());
  }
  for (auto& d : dones) {
    auto s = d->Wait();
    ASSERT_TRUE(s.has_value()) << "a write to a silent peer hung";
    EXPECT_EQ(s->code(), StatusCode::kDeadlineExceeded) << s->ToString();
  }
}

// The mr_mode paths the provider asks for: shm wants FI_MR_VIRT_ADDR (remote addresses are virtual
// addresses), tcp;ofi_rxm wants nothing (offsets from 0). Both must move the same bytes.
TEST(DomainMrModeTest, VirtualAndOffsetAddressingBothLandExactly) {
  struct Case {
    const char* provider;
    const char* node;
  };
  int ran = 0;
  for (const Case& c : {Case{"shm", ""}, Case{"tcp;ofi_rxm", "127.0.0.1"}}) {
    SCOPED_TRACE(c.provider);
    DomainOptions o = LoopbackOptions();
    o.provider = c.provider;
    o.node = c.node;
    auto a = Domain::Create(o);
    if (!a.ok()) {  // not offered here: fine; any other error is not
      EXPECT_TRUE(testing::ProviderAbsent(a.status())) << a.status().ToString();
      continue;
    }
    auto b = Domain::Create(o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ++ran;
    Mapping src(3 * 4096), dst(3 * 4096);
    src.FillRandom(11);
    dst.Fill('\x77');
    auto src_mr = (*a)->RegisterMemory(src.data(), src.size());
    auto dst_mr = (*b)->RegisterMemory(dst.data(), dst.size());
    ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
    bool virt = ((*b)->info().mr_mode & FI_MR_VIRT_ADDR) != 0;
    EXPECT_EQ(dst_mr->descriptor.addr, virt ? reinterpret_cast<uint64_t>(dst.data()) : 0u);
    auto remote = (*a)->AddRemote(dst_mr->descriptor);
    ASSERT_TRUE(remote.ok()) << remote.status().ToString();
    PagedWriteRequest r;
    r.src = *src_mr;
    r.dst = *remote;
    r.src_pages = {2, 0};
    r.dst_pages = {0, 2};
    r.bytes_per_page = 1000;
    r.src_stride = r.dst_stride = 4096;
    r.dst_offset = 24;
    r.imm = 3;
    auto waiter = (*b)->imm_counters().Expect(3, 2);
    ASSERT_TRUE(waiter.ok());
    Done done;
    ASSERT_TRUE((*a)->SubmitPagedWrite(r, done.Callback()).ok());
    auto s = done.Wait();
    ASSERT_TRUE(s && s->ok()) << (s ? s->ToString() : "none");
    ASSERT_TRUE((*waiter)->WaitFor(30.0));
    std::vector<char> expect(dst.size(), '\x77');
    std::memcpy(expect.data() + 24, src.data() + 2 * 4096, 1000);
    std::memcpy(expect.data() + 24 + 2 * 4096, src.data(), 1000);
    EXPECT_EQ(std::memcmp(dst.data(), expect.data(), dst.size()), 0);
  }
  if (ran == 0) GTEST_SKIP() << "neither shm nor tcp;ofi_rxm is offered here";
}

TEST(DomainCreateTest, UnknownProviderIsAClearError) {
  DomainOptions o = LoopbackOptions();
  o.provider = "no-such-provider";
  auto d = Domain::Create(o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("fi_getinfo"), std::string::npos);
  EXPECT_TRUE(testing::ProviderAbsent(d.status())) << d.status().ToString();
}

}  // namespace
}  // namespace pd::transfer
