// Shard plans issued as real fabric writes: two domains in one process over tcp;ofi_rxm, every
// prefill rank's region inside one registration and every decode rank's inside another (as the
// instance's single messenger registers its ranks), checked byte by byte and by the imm counter.
#include "messenger/shard_writes.h"

#include <gtest/gtest.h>

#include "messenger/shard_plan_test_util.h"
#include "transfer/test_util.h"

namespace pd::messenger {
namespace {

using engine::KvLayout;
using transfer::testing::Done;
using transfer::testing::LoopbackOptions;
using transfer::testing::Mapping;

constexpr int kLayers = 2, kSrcPages = 4, kDstPages = 5;
const std::vector<int> kSrcPageIds = {2, 0, 3}, kDstPageIds = {4, 1, 2};

struct Case {
  ShardSpec prefill, decode;
  KvLayout layout;
};

class ShardWritesTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShardWritesTest, PlanIssuedAsPagedWritesLandsExactly) {
  const Case c = GetParam();
  const PageFormat f{40, 3, c.layout, 2};
  Result<ShardPlan> plan = ComputeShardPlan(c.prefill, c.decode, f, 11);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const uint64_t src_rank_bytes = plan->src_page_bytes * kLayers * kSrcPages;
  const uint64_t dst_rank_bytes = plan->dst_page_bytes * kLayers * kDstPages;
  // Before the domains, so they close before this memory is unmapped.
  Mapping src(src_rank_bytes * c.prefill.tp_size), dst(dst_rank_bytes * c.decode.tp_size);
  PD_CREATE_DOMAIN_OR_SKIP(a, LoopbackOptions());
  PD_CREATE_DOMAIN_OR_SKIP(b, LoopbackOptions());
  dst.Fill('\x5a');
  for (int s = 0; s < c.prefill.tp_size; ++s) {
    engine::KvCacheSpec spec = testing::RankSpec(c.prefill, s, f, kLayers);
    for (int l = 0; l < kLayers; ++l)
      for (int p = 0; p < kSrcPages; ++p) {
        char* block = src.data() + s * src_rank_bytes + (l * kSrcPages + p) * plan->src_page_bytes;
        testing::ForEachPageByte(
            spec, RankHeads(c.prefill, s).begin,
            [&](size_t off, int t, int h, int kv, int d, int byte) {
              block[off] = static_cast<char>(testing::Expected(l, p, t, h, kv, d, byte));
            });
      }
  }
  auto src_mr = a->RegisterMemory(src.data(), src.size());
  ASSERT_TRUE(src_mr.ok()) << src_mr.status().ToString();
  auto dst_mr = b->RegisterMemory(dst.data(), dst.size());
  ASSERT_TRUE(dst_mr.ok()) << dst_mr.status().ToString();
  auto remote = a->AddRemote(dst_mr->descriptor);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();

  const WriteCounts want = ExpectedWrites(*plan, kSrcPageIds.size(), kLayers);
  auto waiter = b->imm_counters().Expect(42, want.total_writes);
  ASSERT_TRUE(waiter.ok());
  std::vector<std::unique_ptr<Done>> dones;
  for (const ShardSlice& slice : plan->slices)
    for (const PageRun& run : slice.runs)
      for (int l = 0; l < kLayers; ++l) {
        transfer::PagedWriteRequest req;
        req.src = *src_mr;
        req.dst = *remote;
        req.src_pages.assign(kSrcPageIds.begin(), kSrcPageIds.end());
        req.dst_pages.assign(kDstPageIds.begin(), kDstPageIds.end());
        req.imm = 42;
        SetRunGeometry(*plan, run,
                       RunGeometry{l, kSrcPages, kDstPages, slice.src_rank * src_rank_bytes,
                                   slice.dst_rank * dst_rank_bytes},
                       &req);
        dones.push_back(std::make_unique<Done>());
        ASSERT_TRUE(a->SubmitPagedWrite(std::move(req), dones.back()->Callback()).ok());
      }
  for (auto& d : dones) {
    std::optional<Status> s = d->Wait();
    ASSERT_TRUE(s.has_value());
    ASSERT_TRUE(s->ok()) << s->ToString();
  }
  ASSERT_TRUE((*waiter)->WaitFor(30.0));
  EXPECT_EQ((*waiter)->received(), want.total_writes);

  std::vector<int> src_of_dst(kDstPages, -1);
  for (size_t k = 0; k < kDstPageIds.size(); ++k) src_of_dst[kDstPageIds[k]] = kSrcPageIds[k];
  int bad = 0;
  for (int d = 0; d < c.decode.tp_size; ++d) {
    engine::KvCacheSpec spec = testing::RankSpec(c.decode, d, f, kLayers);
    for (int l = 0; l < kLayers; ++l)
      for (int p = 0; p < kDstPages; ++p) {
        const char* block =
            dst.data() + d * dst_rank_bytes + (l * kDstPages + p) * plan->dst_page_bytes;
        testing::ForEachPageByte(
            spec, RankHeads(c.decode, d).begin,
            [&](size_t off, int t, int h, int kv, int dd, int byte) {
              uint8_t want_byte = src_of_dst[p] < 0
                                      ? 0x5a
                                      : testing::Expected(l, src_of_dst[p], t, h, kv, dd, byte);
              if (static_cast<uint8_t>(block[off]) != want_byte && ++bad <= 3) {
                ADD_FAILURE() << "decode rank " << d << " layer " << l << " page " << p << " token "
                              << t << " head " << h << " kv " << kv << " dim " << dd;
              }
            });
      }
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Pairings, ShardWritesTest,
    ::testing::Values(Case{{2, 4}, {1, 4}, KvLayout::kHND}, Case{{2, 4}, {1, 4}, KvLayout::kNHD},
                      Case{{1, 4}, {2, 4}, KvLayout::kHND}, Case{{1, 4}, {2, 4}, KvLayout::kNHD},
                      Case{{2, 4}, {2, 4}, KvLayout::kNHD}, Case{{4, 2}, {2, 2}, KvLayout::kNHD},
                      Case{{2, 1, true}, {4, 1, true}, KvLayout::kHND}));

}  // namespace
}  // namespace pd::messenger
