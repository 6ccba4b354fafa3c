// Reading a working set back into the caches while a core would otherwise idle.
//
// On the shared hosts pdserve is measured on, data a core has not touched for ~20 ms or more reads
// about twice as slowly for the next two passes over it, whatever the core did meanwhile (idle,
// register-only arithmetic, streaming other data): other tenants evict it from the shared
// last-level cache, and the non-inclusive cache takes two passes to hold it again. A decode
// instance that idles through a prefill elsewhere would run its first decode steps at half speed.
// TouchRanges reads given memory once, a chunk at a time, checking a stop predicate between
// chunks so that real work arriving never waits for more than one chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

namespace pd::engine {

struct MemRange {
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

// Reads every 64-byte line of each range once, in order. Before each chunk of chunk_bytes it
// calls stop() and returns early if it is true. Returns the bytes read.
size_t TouchRanges(std::span<const MemRange> ranges, const std::function<bool()>& stop,
                   size_t chunk_bytes = 64 << 10);

}  // namespace pd::engine
