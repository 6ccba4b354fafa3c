// The transfer engine between two OS processes over real libfabric (tcp;ofi_rxm): the test binary
// forks and re-executes itself as the peer (see peer_process.h). Every test runs on loopback and
// again between two network namespaces joined by a veth pair (as two hosts) when run as root.
#include <gtest/gtest.h>

#include "transfer/domain.h"
#include "transfer/peer_process.h"
#include "transfer/test_util.h"

namespace pd::transfer {
namespace {

using testing::Done;
using testing::Mapping;
using testing::PeerProcess;

const bool kIsPeer = testing::RunPeerIfRequested();

enum class Network { kLoopback, kVeth };

// The parent's side: a domain, the peer process and the peer's region.
class TwoProcessTest : public ::testing::TestWithParam<Network> {
 protected:
  void SetUp() override {
    DomainOptions o = testing::LoopbackOptions();
    o.op_timeout_s = 2.0;
    std::map<std::string, std::string> env;
    Result<std::unique_ptr<Domain>> d = Unavailable("not created");
    if (GetParam() == Network::kVeth) {
      std::string why;
      netns_ = testing::NetnsPair::Create(&why);
      if (!netns_) GTEST_SKIP() << "two-namespace run skipped: " << why;
      o.node = netns_->addr_a();
      ASSERT_TRUE(netns_->InNamespaceA([&] { d = Domain::Create(o); }));
      env["PD_TRANSFER_PEER_NETNS"] = netns_->path_b();
      env["PD_TRANSFER_PEER_NODE"] = netns_->addr_b();
    } else {
      d = Domain::Create(o);
    }
    if (!d.ok()) PD_SKIP_IF_ABSENT_ELSE_FAIL(d.status());
    domain_ = std::move(d).value();
    peer_ = PeerProcess::Spawn(env);
    ASSERT_NE(peer_, nullptr);
    auto frame = peer_->Receive();
    ASSERT_TRUE(frame.has_value()) << "the peer process did not start";
    ASSERT_EQ(frame->header, "desc") << frame->payload;
    auto desc = MemoryDescriptor::FromBytes(frame->payload);
    ASSERT_TRUE(desc.ok()) << desc.status().ToString();
    auto remote = domain_->AddRemote(*desc);
    ASSERT_TRUE(remote.ok()) << remote.status().ToString();
    remote_ = *remote;
    ASSERT_TRUE(peer_->Send("peer", domain_->info().address));
  }

  std::string DumpPeer() {
    EXPECT_TRUE(peer_->Send("dump"));
    auto frame = peer_->Receive();
    if (!frame || frame->header != "region") return {};
    return frame->payload;
  }

  // Creates another domain of ours on the same network as domain_.
  Result<std::unique_ptr<Domain>> SecondDomain(DomainOptions o) {
    Result<std::unique_ptr<Domain>> d = Unavailable("not created");
    if (netns_) {
      o.node = netns_->addr_a();
      if (!netns_->InNamespaceA([&] { d = Domain::Create(o); })) return Internal("setns failed");
    } else {
      d = Domain::Create(o);
    }
    return d;
  }

  std::unique_ptr<testing::NetnsPair> netns_;  // outlives the domain and the peer below
  std::unique_ptr<Domain> domain_;
  std::unique_ptr<PeerProcess> peer_;
  RemoteRegion remote_;
};

TEST_P(TwoProcessTest, PagedWritesOfRandomDataLandBitExactWithStridedSlices) {
  // Source: 64 HND pages of (H=8, T=16, D=64) bf16 = 16 KiB each; ship heads [3, 6) of 40 pages
  // into destination pages of (H=3, ...) laid out with a 512-byte gap after every page.
  constexpr uint64_t kHeadBytes = 16 * 64 * 2;
  constexpr uint64_t kSrcPage = 8 * kHeadBytes;
  constexpr uint64_t kDstStride = 3 * kHeadBytes + 512;
  Mapping src(64 * kSrcPage);
  src.FillRandom(42);
  auto mr = domain_->RegisterMemory(src.data(), src.size());
  ASSERT_TRUE(mr.ok());
  PagedWriteRequest r;
  r.src = *mr;
  r.dst = remote_;
  std::vector<uint32_t> dst_order(40);
  for (uint32_t i = 0; i < 40; ++i) dst_order[i] = i;
  std::shuffle(dst_order.begin(), dst_order.end(), std::mt19937(5));
  for (uint32_t i = 0; i < 40; ++i) {
    r.src_pages.push_back((i * 7) % 64);
    r.dst_pages.push_back(dst_order[i]);
  }
  r.bytes_per_page = 3 * kHeadBytes;
  r.src_stride = kSrcPage;
  r.src_offset = 3 * kHeadBytes;
  r.dst_stride = kDstStride;
  r.dst_offset = 100;
  r.imm = 0xabcd1234;
  ASSERT_TRUE(peer_->Send("expect " + std::to_string(*r.imm) + " 40"));
  Done done;
  ASSERT_TRUE(domain_->SubmitPagedWrite(r, done.Callback()).ok());
  auto s = done.Wait();
  ASSERT_TRUE(s && s->ok()) << (s ? s->ToString() : "no completion");
  auto fired = peer_->Receive();
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->header, "fired " + std::to_string(*r.imm) + " 40");

  std::string region = DumpPeer();
  ASSERT_EQ(region.size(), remote_.descriptor.length);
  std::string expect(region.size(), '\x5c');
  for (size_t k = 0; k < 40; ++k) {
    std::memcpy(expect.data() + r.dst_offset + r.dst_pages[k] * r.dst_stride,
                src.data() + r.src_offset + r.src_pages[k] * r.src_stride, r.bytes_per_page);
  }
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < region.size(); ++i) {
    if (region[i] != expect[i] && mismatches++ == 0) first = i;
  }
  EXPECT_EQ(mismatches, 0u) << "first mismatch at byte " << first;
  EXPECT_EQ(peer_->Exit(), 0);
}

TEST_P(TwoProcessTest, ControlMessagesRoundTrip) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> got;
  DomainOptions o = testing::LoopbackOptions();
  o.on_message = [&](std::string_view m) {
    std::lock_guard<std::mutex> lock(mu);
    got.emplace_back(m);
    cv.notify_all();
  };
  // A second domain of ours with a handler; the peer echoes to whoever it was told about.
  auto d = SecondDomain(o);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(peer_->Send("peer", (*d)->info().address));
  auto to_peer = (*d)->AddPeer(remote_.descriptor.fabric_addr);
  ASSERT_TRUE(to_peer.ok());
  Done sent;
  ASSERT_TRUE((*d)->SubmitSend(*to_peer, "prefill request 7", sent.Callback()).ok());
  auto s = sent.Wait();
  ASSERT_TRUE(s && s->ok());
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return !got.empty(); }));
  EXPECT_EQ(got[0], "echo:prefill request 7");
  lock.unlock();
  d->reset();
}

TEST_P(TwoProcessTest, CancellingAStalledTransferGivesCancelled) {
  Mapping src(8 << 20);
  auto mr = domain_->RegisterMemory(src.data(), src.size());
  ASSERT_TRUE(mr.ok());
  peer_->Stop();  // the peer cannot acknowledge anything now
  PagedWriteRequest r;
  r.src = *mr;
  r.dst = remote_;
  for (uint32_t i = 0; i < 8; ++i) r.src_pages.push_back(i), r.dst_pages.push_back(i);
  r.bytes_per_page = 1 << 20;
  r.src_stride = r.dst_stride = 1 << 20;
  Done done;
  auto id = domain_->SubmitPagedWrite(r, done.Callback());
  ASSERT_TRUE(id.ok());
  domain_->Cancel(*id);
  auto s = done.Wait();
  ASSERT_TRUE(s.has_value()) << "cancel did not complete the transfer";
  EXPECT_EQ(s->code(), StatusCode::kCancelled) << s->ToString();
  peer_->Continue();
}

TEST_P(TwoProcessTest, KilledPeerFailsPendingWritesWithinTheDeadline) {
  Mapping src(8 << 20);
  auto mr = domain_->RegisterMemory(src.data(), src.size());
  ASSERT_TRUE(mr.ok());
  // A first write proves the connection works, so the failure below is the peer's death.
  Done warm;
  WriteRequest w{*mr, 0, 4096, remote_, 0, std::nullopt};
  ASSERT_TRUE(domain_->SubmitWrite(w, warm.Callback()).ok());
  auto ws = warm.Wait();
  ASSERT_TRUE(ws && ws->ok());
  peer_->Stop();
  std::vector<std::unique_ptr<Done>> dones;
  for (int i = 0; i < 8; ++i) {
    dones.push_back(std::make_unique<Done>());
    WriteRequest big{*mr, 0, 8 << 20, remote_, 0, 1u};
    ASSERT_TRUE(domain_->SubmitWrite(big, dones.back()->Callback()).ok());
  }
  peer_->Kill();
  for (auto& d : dones) {
    auto s = d->Wait();  // op_timeout_s is 2 s; 30 s here only guards against a hang
    ASSERT_TRUE(s.has_value()) << "a write to a killed peer hung";
    EXPECT_FALSE(s->ok());
    EXPECT_TRUE(s->code() == StatusCode::kUnavailable || s->code() == StatusCode::kDeadlineExceeded)
        << s->ToString();
  }
  EXPECT_EQ(domain_->num_pending(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Networks, TwoProcessTest,
                         ::testing::Values(Network::kLoopback, Network::kVeth),
                         [](const ::testing::TestParamInfo<Network>& info) {
                           return info.param == Network::kLoopback ? "Loopback" : "VethNamespaces";
                         });

}  // namespace
}  // namespace pd::transfer
