// What this machine can do, measured in the same run as the benchmarks that compare against it:
// the memory read bandwidth (a STREAM-like read over a buffer much larger than the last-level
// cache) and the peak FMA rate (independent fused multiply-add chains in registers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "engine/cpu_features.h"

namespace pd::engine {

class ThreadPool;

struct ReadBandwidthOptions {
  size_t buffer_bytes = 0;  // 0: max(1 GiB, 4 x the last-level cache)
  int repeats = 5;  // rounds over the buffer (each round reads it once per way); the best counts
};

// A buffer kept allocated (and faulted in) so the bandwidth can be measured again and again, e.g.
// next to each benchmark row on a host whose memory bandwidth others share.
// Thread safety: one thread at a time.
class ReadBandwidthProbe {
 public:
  // InvalidArgument on a buffer under 1 MiB; ResourceExhausted when it cannot be allocated.
  static Result<std::unique_ptr<ReadBandwidthProbe>> Create(ThreadPool& pool,
                                                            const ReadBandwidthOptions& options);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;

  // GB/s (1e9 bytes per second) that all of the pool's threads read together, each streaming its
  // own contiguous part of the buffer: the best of `repeats` rounds, each round one pass per way
  // of reading a part (AVX-512: one stream; 4 or 8 interleaved streams, without software
  // prefetch, with it into L1, and with it into L1 and far ahead into L2, as the decode matmul
  // streams several weight panels; a single stream alone measured ~10% under what decode reached).
  double Measure();
  size_t buffer_bytes() const { return bytes_; }

 private:
  ReadBandwidthProbe(ThreadPool& pool, uint8_t* buf, size_t bytes, size_t chunk, int repeats)
      : pool_(pool), buf_(buf), bytes_(bytes), chunk_(chunk), repeats_(repeats) {}
  ThreadPool& pool_;
  uint8_t* buf_;
  size_t bytes_, chunk_;
  int repeats_;
};

// Create + Measure once.
Result<double> MeasureReadBandwidth(ThreadPool& pool, const ReadBandwidthOptions& options);

// GFLOP/s (an FMA counts 2) of all of the pool's threads together, with the widest f32 FMA the
// CPU has; each thread runs `iterations` rounds of 24 independent vector FMAs.
double MeasurePeakGflops(ThreadPool& pool, long iterations = 20'000'000);

// GFLOP/s of all of the pool's threads together with the AVX-512 BF16 dot product (vdpbf16ps zmm:
// 16 lanes x 2 bf16 products, each product and its add counted = 64 flops per instruction), each
// thread running `iterations` rounds of 24 independent chains like the FMA probe. It is printed
// beside the FMA peak so the choice of f32 FMA for the kernels rests on a figure of every run.
// Unimplemented when `features` lacks avx512_bf16 (the default: this CPU's).
Result<double> MeasurePeakBf16DotGflops(ThreadPool& pool, long iterations = 20'000'000,
                                        const CpuFeatures& features = DetectCpuFeatures());

// The last-level cache size in bytes from sysfs (0 when unknown).
size_t LastLevelCacheBytes();

// What this host is and which fast kernels the engine runs on it (benchmark headers, so that a
// table from one host cannot be taken for another's).
struct KernelVariant {
  std::string cpu_model;  // /proc/cpuinfo "model name"
  std::string vendor;     // "intel" | "amd" | "other"
  std::string isa;        // the best ISA level: "avx512" | "avx2" | "scalar"
  std::string matmul;     // the weight layout's kernel: "panel32" (AVX-512) or "rowmajor"
  std::string bf16_dot;   // "vdpbf16ps" where the CPU has AVX512_BF16, else "none"
  // "bf16 tiles from N rows" where AMX is usable (DetectAmx), else "none (the reason)"
  std::string amx;
  std::string decode_stream;  // panel decode streaming: "single" | "multi" | "-" (no panel)
};
KernelVariant DescribeKernels();
// Forces how the panel matmul streams decode batches: "single", "multi", or "auto" (per CPU);
// kernel tables looked up afterwards use it.
Status SetDecodeStream(std::string_view name);

}  // namespace pd::engine
