// What this machine can do, measured in the same run as the benchmarks that compare against it:
// the memory read bandwidth (a STREAM-like read over a buffer much larger than the last-level
// cache) and the peak FMA rate (independent fused multiply-add chains in registers).
#pragma once

#include <cstddef>

#include "common/status.h"

namespace pd::engine {

class ThreadPool;

struct ReadBandwidthOptions {
  size_t buffer_bytes = 0;  // 0: max(1 GiB, 4 x the last-level cache)
  int repeats = 5;          // passes over the buffer; the best is reported
};

// GB/s (1e9 bytes per second) that all of the pool's threads read together, each streaming its
// own contiguous part of the buffer. InvalidArgument on a buffer under 1 MiB; ResourceExhausted
// when it cannot be allocated.
Result<double> MeasureReadBandwidth(ThreadPool& pool, const ReadBandwidthOptions& options);

// GFLOP/s (an FMA counts 2) of all of the pool's threads together, with the widest f32 FMA the
// CPU has; each thread runs `iterations` rounds of 24 independent vector FMAs.
double MeasurePeakGflops(ThreadPool& pool, long iterations = 20'000'000);

// The last-level cache size in bytes from sysfs (0 when unknown).
size_t LastLevelCacheBytes();

}  // namespace pd::engine
