#include "engine/cache_warm.h"

#include <algorithm>
#include <cstring>

#include "common/thread_annotations.h"

namespace pd::engine {
namespace {

constexpr size_t kLine = 64;

// Loads one word of every line in [p, p + bytes); the xor keeps the loads from being dropped and
// lets them run in parallel. The loads race, by design, with the fabric writing KV pages that are
// still arriving: their values are never used, only the cache lines they bring in, so
// ThreadSanitizer is told not to instrument them.
PD_NO_SANITIZE_THREAD uint64_t TouchLines(const uint8_t* p, size_t bytes) {
  uint64_t acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
  size_t i = 0;
  for (; i + 4 * kLine <= bytes; i += 4 * kLine) {
    uint64_t w[4];
    std::memcpy(&w[0], p + i, 8);
    std::memcpy(&w[1], p + i + kLine, 8);
    std::memcpy(&w[2], p + i + 2 * kLine, 8);
    std::memcpy(&w[3], p + i + 3 * kLine, 8);
    acc0 ^= w[0];
    acc1 ^= w[1];
    acc2 ^= w[2];
    acc3 ^= w[3];
  }
  for (; i < bytes; i += kLine) acc0 ^= p[i];  // a byte: a call to memcpy would be instrumented
  return acc0 ^ acc1 ^ acc2 ^ acc3;
}

}  // namespace

size_t TouchRanges(std::span<const MemRange> ranges, const std::function<bool()>& stop,
                   size_t chunk_bytes) {
  chunk_bytes = std::max(chunk_bytes, kLine);
  uint64_t acc = 0;
  size_t done = 0;
  for (const MemRange& r : ranges) {
    for (size_t off = 0; off < r.bytes; off += chunk_bytes) {
      if (stop && stop()) {
        asm volatile("" : : "r"(acc));
        return done;
      }
      const size_t n = std::min(chunk_bytes, r.bytes - off);
      acc ^= TouchLines(r.data + off, n);
      done += n;
    }
  }
  asm volatile("" : : "r"(acc));  // the loads' results are used
  return done;
}

}  // namespace pd::engine
