#include "transfer/domain_group.h"

#include <gtest/gtest.h>

#include "transfer/test_util.h"

namespace pd::transfer {
namespace {

using testing::Done;
using testing::Mapping;

class DomainGroupTest : public ::testing::TestWithParam<SpreadPolicy> {
 protected:
  void SetUp() override {
    DomainGroupOptions o;
    o.domains = {testing::LoopbackOptions(), testing::LoopbackOptions()};
    o.policy = GetParam();
    auto a = DomainGroup::Create(o);
    if (!a.ok()) PD_SKIP_IF_ABSENT_ELSE_FAIL(a.status());
    a_ = std::move(a).value();
    auto b = DomainGroup::Create(o);
    ASSERT_TRUE(b.ok());
    b_ = std::move(b).value();
  }
  std::unique_ptr<DomainGroup> a_, b_;
};

TEST_P(DomainGroupTest, SpreadsPagesOverDomainsAndCountsThemTogether) {
  constexpr uint64_t kPage = 8192;
  Mapping src(64 * kPage), dst(64 * kPage);
  src.FillRandom(9);
  dst.Fill('\x01');
  auto src_r = a_->RegisterMemory(src.data(), src.size());
  auto dst_r = b_->RegisterMemory(dst.data(), dst.size());
  ASSERT_TRUE(src_r.ok() && dst_r.ok());
  auto desc = GroupDescriptor::FromBytes(dst_r->descriptor.ToBytes());
  ASSERT_TRUE(desc.ok());
  auto remote = a_->AddRemote(*desc);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  PagedWriteRequest shape;
  for (uint32_t p = 0; p < 64; ++p) {
    shape.src_pages.push_back(p);
    shape.dst_pages.push_back(63 - p);
  }
  shape.bytes_per_page = kPage;
  shape.src_stride = shape.dst_stride = kPage;
  shape.imm = 31;
  int fired = 0;
  auto waiter = b_->imm_counters().Expect(31, 64, [&] { ++fired; });
  ASSERT_TRUE(waiter.ok());
  Done done;
  ASSERT_TRUE(a_->SubmitPagedWrite(*src_r, *remote, shape, done.Callback()).ok());
  auto s = done.Wait();
  ASSERT_TRUE(s && s->ok()) << (s ? s->ToString() : "none");
  ASSERT_TRUE((*waiter)->WaitFor(30.0));
  EXPECT_EQ(fired, 1);
  EXPECT_GT(a_->bytes_submitted(0), 0u);
  EXPECT_GT(a_->bytes_submitted(1), 0u);
  EXPECT_EQ(a_->bytes_submitted(0) + a_->bytes_submitted(1), 64 * kPage);
  for (uint32_t p = 0; p < 64; ++p) {
    ASSERT_EQ(std::memcmp(dst.data() + (63 - p) * kPage, src.data() + p * kPage, kPage), 0) << p;
  }
  // An out-of-range page is rejected before any domain posts anything.
  shape.dst_pages[5] = 64;
  EXPECT_EQ(a_->SubmitPagedWrite(*src_r, *remote, shape, nullptr).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_TRUE(a_->Deregister(*src_r).ok());
  EXPECT_TRUE(b_->Deregister(*dst_r).ok());
}

INSTANTIATE_TEST_SUITE_P(Policies, DomainGroupTest,
                         ::testing::Values(SpreadPolicy::kRoundRobin, SpreadPolicy::kByBytes));

}  // namespace
}  // namespace pd::transfer
