#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace pd {
namespace {

// Bitwise CRC32C, one bit at a time: the reference both implementations are checked against.
uint32_t Reference(const uint8_t* p, size_t n, uint32_t crc) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
  }
  return ~c;
}

TEST(Crc32cTest, KnownValues) {
  const std::string check = "123456789";
  EXPECT_EQ(Crc32cTable(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(Crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
  // RFC 3720 B.4: 32 bytes of zeros, of 0xFF.
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(Crc32cTable(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(Crc32cTable(ones.data(), ones.size()), 0x62A8AB43u);
  if (Crc32cHardwareAvailable()) {
    EXPECT_EQ(Crc32cSse42(check.data(), check.size()), 0xE3069283u);
    EXPECT_EQ(Crc32cSse42(zeros.data(), zeros.size()), 0x8A9136AAu);
  }
}

// Random buffers at odd offsets and lengths (alignment heads and tails, the interleaved blocks),
// in one piece and chained in random pieces: the table and the SSE4.2 paths equal the bitwise
// reference.
TEST(Crc32cTest, BothImplementationsMatchTheReference) {
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(20000 + 16);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  // 384 and 6144 bytes: where the SSE4.2 path starts three interleaved chains of 128 and 2048.
  for (size_t len : {0u, 1u, 3u, 7u, 8u, 9u, 31u, 32u, 33u, 255u, 383u, 384u, 1000u, 4096u, 6143u,
                     6144u, 6152u, 13000u, 20000u}) {
    for (size_t off : {0u, 1u, 5u, 8u}) {
      SCOPED_TRACE("len " + std::to_string(len) + " offset " + std::to_string(off));
      const uint8_t* p = buf.data() + off;
      const uint32_t want = Reference(p, len, 0);
      EXPECT_EQ(Crc32cTable(p, len), want);
      EXPECT_EQ(Crc32c(p, len), want);
      if (Crc32cHardwareAvailable()) {
        EXPECT_EQ(Crc32cSse42(p, len), want);
      }
      size_t split = len == 0 ? 0 : rng() % len;
      EXPECT_EQ(Crc32cTable(p + split, len - split, Crc32cTable(p, split)), want);
      if (Crc32cHardwareAvailable()) {
        EXPECT_EQ(Crc32cSse42(p + split, len - split, Crc32cSse42(p, split)), want);
      }
    }
  }
}

TEST(Crc32cTest, OneFlippedBitChangesTheCrc) {
  std::vector<uint8_t> buf(1024, 0x5A);
  const uint32_t before = Crc32c(buf.data(), buf.size());
  buf[517] ^= 0x10;
  EXPECT_NE(Crc32c(buf.data(), buf.size()), before);
}

TEST(Crc32cTest, ImplementationNamesTheDispatch) {
  EXPECT_STREQ(Crc32cImplementation(), Crc32cHardwareAvailable() ? "sse4.2" : "table");
}

}  // namespace
}  // namespace pd
