// Two fabric domains in one process over real libfabric (tcp;ofi_rxm on loopback).
#include "transfer/domain.h"

#include <gtest/gtest.h>

#include "transfer/test_util.h"

namespace pd::transfer {
namespace {

using testing::Done;
using testing::LoopbackOptions;
using testing::Mapping;

class DomainPairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = Domain::Create(LoopbackOptions());
    if (!a.ok()) GTEST_SKIP() << "libfabric provider unavailable: " << a.status().ToString();
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

}  // namespace
}  // namespace pd::transfer
