#include "engine/cache_warm.h"

#include <gtest/gtest.h>

#include <vector>

namespace pd::engine {
namespace {

TEST(TouchRangesTest, ReadsEveryRangeWhole) {
  std::vector<uint8_t> a(1000, 1), b(64 * 1024 + 3, 2);
  const MemRange ranges[] = {{a.data(), a.size()}, {b.data(), b.size()}, {nullptr, 0}};
  EXPECT_EQ(TouchRanges(ranges, nullptr, 4096), a.size() + b.size());
}

TEST(TouchRangesTest, StopsBetweenChunksWhenAsked) {
  std::vector<uint8_t> a(10 * 4096, 7);
  const MemRange ranges[] = {{a.data(), a.size()}};
  int calls = 0;
  // Three chunks run, the fourth check stops it.
  EXPECT_EQ(TouchRanges(
                ranges, [&] { return ++calls > 3; }, 4096),
            3u * 4096);
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(TouchRanges(
                ranges, [] { return true; }, 4096),
            0u);
}

TEST(TouchRangesTest, AChunkSmallerThanALineIsALine) {
  std::vector<uint8_t> a(640, 7);
  const MemRange ranges[] = {{a.data(), a.size()}};
  int calls = 0;
  EXPECT_EQ(TouchRanges(
                ranges, [&] { return ++calls > 100; }, 1),
            a.size());
  EXPECT_EQ(calls, 10);  // one check per 64-byte chunk
}

}  // namespace
}  // namespace pd::engine
