#include "engine/kv_heads.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace pd::engine {
namespace {

using ::testing::HasSubstr;

TEST(KvHeadsTest, EveryHeadIsHeldByTheSameNumberOfConsecutiveRanks) {
  for (int h : {1, 2, 3, 4, 6, 8}) {
    for (int t : {1, 2, 3, 4, 6, 8, 12, 16}) {
      if (!ValidateKvHeadSplit(h, t).ok()) continue;
      std::vector<int> holders(h, 0);
      int prev_begin = 0;
      for (int r = 0; r < t; ++r) {
        const KvHeadRange kv = RankKvHeads(h, t, r);
        EXPECT_EQ(kv.size(), t <= h ? h / t : 1) << "H " << h << " t " << t << " r " << r;
        EXPECT_GE(kv.begin, prev_begin);  // ranks hold heads in order
        prev_begin = kv.begin;
        for (int k = kv.begin; k < kv.end; ++k) ++holders[k];
      }
      for (int k = 0; k < h; ++k) EXPECT_EQ(holders[k], t <= h ? 1 : t / h) << "head " << k;
    }
  }
  EXPECT_EQ(RankKvHeads(8, 4, 3), (KvHeadRange{6, 8}));
  EXPECT_EQ(RankKvHeads(2, 8, 3), (KvHeadRange{0, 1}));
  EXPECT_EQ(RankKvHeads(2, 8, 4), (KvHeadRange{1, 2}));
}

TEST(KvHeadsTest, RefusesSplitsThatAreNotEven) {
  EXPECT_THAT(ValidateKvHeadSplit(6, 4).message(),
              HasSubstr("tensor-parallel size 4 does not divide the 6 KV heads"));
  EXPECT_THAT(ValidateKvHeadSplit(4, 6).message(),
              HasSubstr("tensor-parallel size 6 exceeds the 4 KV heads and is not a multiple"));
  EXPECT_EQ(ValidateKvHeadSplit(4, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateKvHeadSplit(0, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_DEATH(RankKvHeads(8, 2, 2), "rank 2 of tp 2");
  EXPECT_DEATH(RankKvHeads(6, 4, 0), "cannot split 6 KV heads");
}

}  // namespace
}  // namespace pd::engine
