// The per-layer KV checksums (kv_checksum.h) over real shard plans: KV copied run by run from the
// source ranks into the destination ranks (what the writes do) checksums the same on both sides
// for every TP pairing and layout; one flipped byte changes exactly its layer; a layer summed
// chunk by chunk equals the layer summed at once; the record round-trips and says what differs.
#include "messenger/kv_checksum.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace pd::messenger {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 3;

struct Side {
  std::vector<std::vector<uint8_t>> ranks;  // (layers, num_pages, page_bytes) each
  uint64_t num_pages = 0;
  std::vector<RankKv> View() const {
    std::vector<RankKv> v;
    for (const auto& r : ranks) v.push_back({r.data(), num_pages});
    return v;
  }
};

Side MakeSide(int tp, uint64_t num_pages, uint64_t page_bytes, uint32_t seed) {
  Side s;
  s.num_pages = num_pages;
  std::mt19937 rng(seed);
  for (int r = 0; r < tp; ++r) {
    std::vector<uint8_t> bytes(kLayers * num_pages * page_bytes);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    s.ranks.push_back(std::move(bytes));
  }
  return s;
}

// What the transfer's writes do: every run of every slice, for every layer and page pair.
void CopyByPlan(const ShardPlan& plan, const Side& src, const std::vector<int32_t>& src_pages,
                Side* dst, const std::vector<int32_t>& dst_pages) {
  for (int l = 0; l < kLayers; ++l) {
    for (size_t k = 0; k < src_pages.size(); ++k) {
      for (const ShardSlice& slice : plan.slices) {
        const uint8_t* from = src.ranks[slice.src_rank].data() +
                              (l * src.num_pages + src_pages[k]) * plan.src_page_bytes;
        uint8_t* to = dst->ranks[slice.dst_rank].data() +
                      (l * dst->num_pages + dst_pages[k]) * plan.dst_page_bytes;
        for (const PageRun& run : slice.runs) {
          std::memcpy(to + run.dst_offset, from + run.src_offset, run.bytes);
        }
      }
    }
  }
}

struct PlanCase {
  int prefill_tp;
  int decode_tp;
  engine::KvLayout layout;
};

class KvChecksumPlanTest : public ::testing::TestWithParam<PlanCase> {};

TEST_P(KvChecksumPlanTest, SourceAndDestinationAgreeAndAFlipIsCaughtInItsLayer) {
  const PlanCase c = GetParam();
  PageFormat f;
  f.head_dim = 6;
  f.page_size = 3;
  f.layout = c.layout;
  f.elem_bytes = 4;
  auto plan = ComputeShardPlan({c.prefill_tp, 4, false}, {c.decode_tp, 4, false}, f, 17);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::vector<int32_t> src_pages = {4, 0, 7, 2, 5};
  const std::vector<int32_t> dst_pages = {1, 9, 3, 0, 6};
  const Side src = MakeSide(c.prefill_tp, 8, plan->src_page_bytes, 1);
  Side dst = MakeSide(c.decode_tp, 10, plan->dst_page_bytes, 2);
  CopyByPlan(*plan, src, src_pages, &dst, dst_pages);

  const auto sent = LayerChecksums(*plan, KvSide::kSource, src.View(), kLayers, src_pages);
  EXPECT_EQ(LayerChecksums(*plan, KvSide::kDestination, dst.View(), kLayers, dst_pages), sent);
  // Chunk by chunk, as the prefill side posts: the same.
  for (int l = 0; l < kLayers; ++l) {
    uint32_t crc = ExtendLayerChecksum(0, *plan, KvSide::kSource, src.View(), l, src_pages, 0, 2);
    crc = ExtendLayerChecksum(crc, *plan, KvSide::kSource, src.View(), l, src_pages, 2, 5);
    EXPECT_EQ(crc, sent[l]) << "layer " << l;
  }
  // Bytes outside the pages the transfer wrote do not count.
  dst.ranks[0][(1 * dst.num_pages + 8) * plan->dst_page_bytes] ^= 1;
  EXPECT_EQ(LayerChecksums(*plan, KvSide::kDestination, dst.View(), kLayers, dst_pages), sent);
  // One flipped byte in layer 1 of destination page 3 (the transfer's third page).
  dst.ranks.back()[(1 * dst.num_pages + 3) * plan->dst_page_bytes + 5] ^= 0x40;
  const auto landed = LayerChecksums(*plan, KvSide::kDestination, dst.View(), kLayers, dst_pages);
  EXPECT_EQ(landed[0], sent[0]);
  EXPECT_NE(landed[1], sent[1]);
  EXPECT_EQ(landed[2], sent[2]);
}

INSTANTIATE_TEST_SUITE_P(Pairings, KvChecksumPlanTest,
                         ::testing::Values(PlanCase{1, 1, engine::KvLayout::kHND},
                                           PlanCase{2, 1, engine::KvLayout::kHND},
                                           PlanCase{1, 2, engine::KvLayout::kNHD},
                                           PlanCase{2, 4, engine::KvLayout::kNHD},
                                           PlanCase{4, 2, engine::KvLayout::kHND}),
                         [](const ::testing::TestParamInfo<PlanCase>& info) {
                           return "tp" + std::to_string(info.param.prefill_tp) + "_to_tp" +
                                  std::to_string(info.param.decode_tp) + "_" +
                                  std::string(engine::KvLayoutName(info.param.layout));
                         });

TEST(KvChecksumRecordTest, RoundTripsAndSaysWhatDiffers) {
  const std::vector<uint32_t> crcs = {0x11111111, 0x22222222, 0x33333333};
  std::vector<uint8_t> record(ChecksumBytes(3));
  EXPECT_EQ(record.size(), 20u);
  EncodeChecksums(42, crcs, record.data());
  EXPECT_TRUE(VerifyChecksums(record.data(), 42, crcs).ok());
  Status other_imm = VerifyChecksums(record.data(), 43, crcs);
  EXPECT_EQ(other_imm.code(), StatusCode::kDataLoss);
  EXPECT_THAT(other_imm.message(), HasSubstr("not written by this transfer (imm 42, expected 43)"));
  Status layers = VerifyChecksums(record.data(), 42, {1, 2});
  EXPECT_THAT(layers.message(), HasSubstr("has 3 layers, expected 2"));
  Status bad = VerifyChecksums(record.data(), 42, {0x11111111, 0x22222223, 0x33333333});
  EXPECT_EQ(bad.code(), StatusCode::kDataLoss);
  EXPECT_THAT(bad.message(),
              HasSubstr("mismatch in 1 of 3 layers: layer 1 (sent 22222222, landed 22222223)"));
  // A zeroed record (what the decode side leaves before the write lands) never passes.
  std::vector<uint8_t> zeros(ChecksumBytes(3), 0);
  EXPECT_FALSE(VerifyChecksums(zeros.data(), 42, {0, 0, 0}).ok());
}

}  // namespace
}  // namespace pd::messenger
