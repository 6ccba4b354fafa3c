#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace pd {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected 0x1EDC6F41

// kTables[k][b]: the CRC update of byte b followed by k zero bytes (slicing-by-8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? kPoly : 0u);
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;  // little-endian hosts only (x86-64, aarch64 as built)
}

using Impl = uint32_t (*)(const void*, size_t, uint32_t);

Impl Choose() { return Crc32cHardwareAvailable() ? &Crc32cSse42 : &Crc32cTable; }

}  // namespace

uint32_t Crc32cTable(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; size >= 8; size -= 8, p += 8) {
    const uint64_t v = Load64(p) ^ c;
    c = kTables[7][v & 0xFF] ^ kTables[6][(v >> 8) & 0xFF] ^ kTables[5][(v >> 16) & 0xFF] ^
        kTables[4][(v >> 24) & 0xFF] ^ kTables[3][(v >> 32) & 0xFF] ^ kTables[2][(v >> 40) & 0xFF] ^
        kTables[1][(v >> 48) & 0xFF] ^ kTables[0][v >> 56];
  }
  for (; size > 0; --size, ++p) c = (c >> 8) ^ kTables[0][(c ^ *p) & 0xFF];
  return ~c;
}

#if defined(__x86_64__)

namespace {

// Moving a raw CRC register over n zero bytes is linear in the register: row k of the table
// holds the move of each value of its byte k, so four lookups move any register.
struct ZerosTable {
  std::array<std::array<uint32_t, 256>, 4> rows;
  explicit ZerosTable(size_t n) {
    uint32_t basis[32];
    for (int i = 0; i < 32; ++i) {
      uint32_t c = 1u << i;
      for (size_t k = 0; k < n; ++k) c = (c >> 8) ^ kTables[0][c & 0xFF];
      basis[i] = c;
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int j = 0; j < 8; ++j) v ^= (b >> j & 1u) ? basis[8 * k + j] : 0u;
        rows[k][b] = v;
      }
    }
  }
  uint32_t Move(uint32_t c) const {
    return rows[0][c & 0xFF] ^ rows[1][(c >> 8) & 0xFF] ^ rows[2][(c >> 16) & 0xFF] ^
           rows[3][c >> 24];
  }
};

constexpr size_t kLongBytes = 2048;  // per stream: 6 KiB blocks
constexpr size_t kShortBytes = 128;  // per stream: 384-byte blocks

const ZerosTable& LongZeros() {
  static const ZerosTable* t = new ZerosTable(kLongBytes);
  return *t;
}
const ZerosTable& ShortZeros() {
  static const ZerosTable* t = new ZerosTable(kShortBytes);
  return *t;
}

// Three blocks of `n` bytes at p as three independent crc32 chains (the instruction's latency
// is 3 cycles and its throughput 1 a cycle), joined by moving the first chain's register over
// the second block (then over the third) and adding the next chain's.
__attribute__((target("sse4.2"))) uint64_t Crc3Blocks(uint64_t c0, const uint8_t* p, size_t n,
                                                      const ZerosTable& zeros) {
  uint64_t c1 = 0, c2 = 0;
  for (const uint8_t* end = p + n; p < end; p += 8) {
    c0 = _mm_crc32_u64(c0, Load64(p));
    c1 = _mm_crc32_u64(c1, Load64(p + n));
    c2 = _mm_crc32_u64(c2, Load64(p + 2 * n));
  }
  c0 = zeros.Move(static_cast<uint32_t>(c0)) ^ c1;
  return zeros.Move(static_cast<uint32_t>(c0)) ^ c2;
}

}  // namespace

bool Crc32cHardwareAvailable() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(const void* data, size_t size,
                                                       uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  for (; size > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --size, ++p) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
  }
  if (size >= 3 * kShortBytes) {
    const ZerosTable& long_zeros = LongZeros();
    for (; size >= 3 * kLongBytes; size -= 3 * kLongBytes, p += 3 * kLongBytes) {
      c = Crc3Blocks(c, p, kLongBytes, long_zeros);
    }
    const ZerosTable& short_zeros = ShortZeros();
    for (; size >= 3 * kShortBytes; size -= 3 * kShortBytes, p += 3 * kShortBytes) {
      c = Crc3Blocks(c, p, kShortBytes, short_zeros);
    }
  }
  for (; size >= 8; size -= 8, p += 8) c = _mm_crc32_u64(c, Load64(p));
  for (; size > 0; --size, ++p) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
  return ~static_cast<uint32_t>(c);
}

#else

bool Crc32cHardwareAvailable() { return false; }
uint32_t Crc32cSse42(const void* data, size_t size, uint32_t crc) {
  return Crc32cTable(data, size, crc);
}

#endif

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  static const Impl impl = Choose();
  return impl(data, size, crc);
}

const char* Crc32cImplementation() { return Crc32cHardwareAvailable() ? "sse4.2" : "table"; }

}  // namespace pd
