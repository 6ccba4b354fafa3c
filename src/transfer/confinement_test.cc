// What a peer can do with a registered region: write into a target (with its key), nothing else.
// A raw libfabric endpoint that asks for read capability stands in for a hostile peer.
#include <gtest/gtest.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <set>
#include <vector>

#include "common/clock.h"
#include "transfer/domain.h"
#include "transfer/fabric_util.h"
#include "transfer/test_util.h"

namespace pd::transfer {
namespace {

using testing::Mapping;
using testing::Mappings;

// A bare tcp;ofi_rxm endpoint with FI_READ and FI_WRITE, polling its own CQ.
class RawEndpoint {
 public:
  static Result<std::unique_ptr<RawEndpoint>> Open() {
    auto e = std::unique_ptr<RawEndpoint>(new RawEndpoint());
    FiInfoPtr hints(fi_allocinfo());
    hints->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE;
    hints->ep_attr->type = FI_EP_RDM;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
    hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
    fi_info* info = nullptr;
    int rc = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, FI_SOURCE, hints.get(), &info);
    if (rc != 0) return FabricError("fi_getinfo", rc);
    e->info_.reset(info);
    fid_fabric* fabric;
    if ((rc = fi_fabric(info->fabric_attr, &fabric, nullptr)) != 0) return FabricError("fi", rc);
    e->fabric_.reset(fabric);
    fid_domain* domain;
    if ((rc = fi_domain(fabric, info, &domain, nullptr)) != 0) return FabricError("fi_domain", rc);
    e->domain_.reset(domain);
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    fid_cq* cq;
    if ((rc = fi_cq_open(domain, &cq_attr, &cq, nullptr)) != 0) return FabricError("cq", rc);
    e->cq_.reset(cq);
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_MAP;
    fid_av* av;
    if ((rc = fi_av_open(domain, &av_attr, &av, nullptr)) != 0) return FabricError("av", rc);
    e->av_.reset(av);
    fid_ep* ep;
    if ((rc = fi_endpoint(domain, info, &ep, nullptr)) != 0) return FabricError("ep", rc);
    e->ep_.reset(ep);
    if ((rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0) return FabricError("b", rc);
    if ((rc = fi_ep_bind(ep, &av->fid, 0)) != 0) return FabricError("bind av", rc);
    if ((rc = fi_enable(ep)) != 0) return FabricError("fi_enable", rc);
    e->buffer_.assign(4096, 0);
    fid_mr* mr;
    rc = fi_mr_reg(domain, e->buffer_.data(), e->buffer_.size(), FI_READ | FI_WRITE, 0, 0, 0, &mr,
                   nullptr);
    if (rc != 0) return FabricError("fi_mr_reg", rc);
    e->mr_.reset(mr);
    return e;
  }
  ~RawEndpoint() {
    ep_.reset();
    cq_.reset();
    mr_.reset();
  }

  std::vector<char>& buffer() { return buffer_; }

  // Reads (or writes) `len` bytes at the target region's offset 0 and waits for the completion.
  Status Access(bool read, const MemoryDescriptor& target, size_t len) {
    fi_addr_t addr = FI_ADDR_UNSPEC;
    if (fi_av_insert(av_.get(), target.fabric_addr.data(), 1, &addr, 0, nullptr) != 1) {
      return Internal("fi_av_insert failed");
    }
    fi_context2 ctx{};
    void* desc = fi_mr_desc(mr_.get());
    ssize_t rc;
    const double end = SystemClock::Get().NowSeconds() + 20.0;
    do {
      rc = read
               ? fi_read(ep_.get(), buffer_.data(), len, desc, addr, target.addr, target.rkey, &ctx)
               : fi_write(ep_.get(), buffer_.data(), len, desc, addr, target.addr, target.rkey,
                          &ctx);
      if (rc == -FI_EAGAIN) (void)fi_cq_read(cq_.get(), nullptr, 0);
    } while (rc == -FI_EAGAIN && SystemClock::Get().NowSeconds() < end);
    if (rc != 0) return FabricError(read ? "fi_read" : "fi_write", rc);
    while (SystemClock::Get().NowSeconds() < end) {
      fi_cq_data_entry entry;
      ssize_t n = fi_cq_read(cq_.get(), &entry, 1);
      if (n == 1) return OkStatus();
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        fi_cq_readerr(cq_.get(), &err, 0);
        return Status(FabricErrorCode(err.err), std::string("completion: ") + fi_strerror(err.err));
      }
    }
    return DeadlineExceeded("no completion");
  }

 private:
  RawEndpoint() = default;
  FiInfoPtr info_;
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
  FidPtr<fid_cq> cq_;
  FidPtr<fid_av> av_;
  FidPtr<fid_ep> ep_;
  FidPtr<fid_mr> mr_;
  std::vector<char> buffer_;
};

// A region registered as a remote-write target takes writes with its key but refuses reads.
TEST(ConfinementTest, ARemoteReadOfARegisteredKvRegionFails) {
  Mappings mem;
  PD_CREATE_DOMAIN_OR_SKIP(target, testing::LoopbackOptions());
  auto raw = RawEndpoint::Open();
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  Mapping& kv = mem.New(1 << 16);
  kv.Fill('\x42');
  auto mr = target->RegisterMemory(kv.data(), kv.size(), RegionAccess::kRemoteWrite);
  ASSERT_TRUE(mr.ok()) << mr.status().ToString();

  // The raw endpoint reaches the region: a write with the key lands.
  std::fill((*raw)->buffer().begin(), (*raw)->buffer().end(), '\x07');
  Status wrote = (*raw)->Access(/*read=*/false, mr->descriptor, 64);
  ASSERT_TRUE(wrote.ok()) << wrote.ToString();
  EXPECT_EQ(kv.data()[0], '\x07');
  EXPECT_EQ(kv.data()[64], '\x42');

  // A read of the same bytes with the same key fails, and nothing of the region comes back.
  std::fill((*raw)->buffer().begin(), (*raw)->buffer().end(), '\0');
  Status read = (*raw)->Access(/*read=*/true, mr->descriptor, 4096);
  EXPECT_FALSE(read.ok()) << "a remote read of a write-only region succeeded";
  EXPECT_EQ((*raw)->buffer()[100], '\0');
  target.reset();
}

// Keys the application chooses are random: not 1, 2, 3 and not consecutive.
TEST(ConfinementTest, KeysAreRandomWhereTheApplicationChoosesThem) {
  Mappings mem;
  PD_CREATE_DOMAIN_OR_SKIP(d, testing::LoopbackOptions());
  if (d->info().mr_mode & FI_MR_PROV_KEY) {
    GTEST_SKIP() << d->info().provider << " chooses its keys itself (FI_MR_PROV_KEY)";
  }
  std::vector<uint64_t> keys;
  for (int i = 0; i < 6; ++i) {
    Mapping& m = mem.New(4096);
    auto mr = d->RegisterMemory(m.data(), m.size(), RegionAccess::kRemoteWrite);
    ASSERT_TRUE(mr.ok()) << mr.status().ToString();
    keys.push_back(mr->descriptor.rkey);
  }
  EXPECT_EQ(std::set<uint64_t>(keys.begin(), keys.end()).size(), keys.size());
  int consecutive = 0, small = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] < (uint64_t{1} << 32)) ++small;
    if (i > 0 && keys[i] - keys[i - 1] <= 8) ++consecutive;
  }
  EXPECT_EQ(consecutive, 0) << "keys look sequential";
  EXPECT_LE(small, 1) << "keys use few of their 64 bits";
  d.reset();
}

// A region registered for remote writes only cannot be the source of one of ours.
TEST(ConfinementTest, ATargetOnlyRegionIsRefusedAsASource) {
  Mappings mem;
  PD_CREATE_DOMAIN_OR_SKIP(a, testing::LoopbackOptions());
  PD_CREATE_DOMAIN_OR_SKIP(b, testing::LoopbackOptions());
  Mapping& src = mem.New(4096);
  Mapping& dst = mem.New(4096);
  auto src_mr = a->RegisterMemory(src.data(), src.size(), RegionAccess::kRemoteWrite);
  auto dst_mr = b->RegisterMemory(dst.data(), dst.size(), RegionAccess::kRemoteWrite);
  ASSERT_TRUE(src_mr.ok() && dst_mr.ok());
  auto remote = a->AddRemote(dst_mr->descriptor);
  ASSERT_TRUE(remote.ok());
  testing::Done done;
  ASSERT_TRUE(a->SubmitWrite({*src_mr, 0, 64, *remote, 0, std::nullopt}, done.Callback()).ok());
  auto s = done.Wait();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->code(), StatusCode::kFailedPrecondition) << s->ToString();
  EXPECT_NE(s->message().find("remote-write target only"), std::string::npos) << s->ToString();
}

}  // namespace
}  // namespace pd::transfer
