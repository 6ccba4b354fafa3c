// GCC 12's AVX-512 reduce intrinsics start from _mm*_undefined_*, which -Wuninitialized reports
// falsely once inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "engine/machine_probe.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "engine/cpu_features.h"
#include "engine/kernels.h"
#include "engine/thread_pool.h"

namespace pd::engine {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sums n bytes (a multiple of 256) with 512-bit loads, four independent accumulators.
__attribute__((target("avx512f"))) uint64_t ReadAvx512(const uint8_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 256) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 192));
  }
  return _mm512_reduce_add_epi64(
      _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
}

// The same over S streams at once: n split into S equal parts (each a multiple of 256 bytes, the
// tail read after), 256 bytes of each per round, each stream prefetched `ahead` bytes in front into
// L1 and `far` bytes in front into L2 (0: none). Several streams keep more lines in flight than
// one hardware-prefetched stream, as a matmul over several weight panels does.
template <int S>
__attribute__((target("avx512f"))) uint64_t ReadAvx512Streams(const uint8_t* p, size_t n,
                                                              size_t ahead, size_t far) {
  const size_t part = n / S / 256 * 256;
  __m512i acc[S];
  for (int s = 0; s < S; ++s) acc[s] = _mm512_setzero_si512();
  for (size_t i = 0; i < part; i += 256) {
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s) {
      const uint8_t* q = p + s * part + i;
      if (ahead != 0) {
        _mm_prefetch(reinterpret_cast<const char*>(q + ahead), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(q + ahead + 128), _MM_HINT_T0);
      }
      if (far != 0) {
#pragma GCC unroll 4
        for (int l = 0; l < 4; ++l)
          _mm_prefetch(reinterpret_cast<const char*>(q + far + l * 64), _MM_HINT_T1);
      }
      const __m512i a = _mm512_add_epi64(_mm512_load_si512(q), _mm512_load_si512(q + 64));
      const __m512i b = _mm512_add_epi64(_mm512_load_si512(q + 128), _mm512_load_si512(q + 192));
      acc[s] = _mm512_add_epi64(acc[s], _mm512_add_epi64(a, b));
    }
  }
  __m512i sum = acc[0];
  for (int s = 1; s < S; ++s) sum = _mm512_add_epi64(sum, acc[s]);
  return _mm512_reduce_add_epi64(sum) + ReadAvx512(p + S * part, n - S * part);
}

__attribute__((target("avx2"))) uint64_t ReadAvx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t ReadScalar(const uint8_t* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    s += v;
  }
  return s;
}

// 24 independent chains: enough to cover the FMA latency on two ports.
__attribute__((target("avx512f"))) float FmaAvx512(long iterations) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 a = _mm512_set1_ps(0.9999f), b = _mm512_set1_ps(1e-4f);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 24; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) float FmaAvx2(long iterations) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 a = _mm256_set1_ps(0.9999f), b = _mm256_set1_ps(1e-4f);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  alignas(32) float lanes[8];
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_store_ps(lanes, s);
  float r = 0;
  for (float v : lanes) r += v;
  return r;
}

// 24 independent vdpbf16ps chains, as FmaAvx512: acc += pairs of bf16 products of a and b.
__attribute__((target("avx512f,avx512bf16"))) float DotBf16Avx512(long iterations) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  // bf16 bit patterns: 0x3f80 = 1.0, 0x38d1 ~= 1e-4.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x38d1);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 24; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

// Flops per iteration of the FMA loop of the widest ISA.
double FlopsPerIteration() {
  const CpuFeatures& f = DetectCpuFeatures();
  if (f.avx512) return 24.0 * 16 * 2;
  if (f.avx2) return 12.0 * 8 * 2;
  return 8.0 * 2;
}

float FmaLoop(long iterations) {
  const CpuFeatures& f = DetectCpuFeatures();
  if (f.avx512) return FmaAvx512(iterations);
  if (f.avx2) return FmaAvx2(iterations);
  float acc[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  for (long it = 0; it < iterations; ++it)
    for (float& a : acc) a = a * 0.9999f + 1e-4f;
  return acc[0] + acc[7];
}

}  // namespace

size_t LastLevelCacheBytes() {
  size_t best = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string text;
    if (!(in >> text) || text.empty()) continue;
    size_t value = std::strtoull(text.c_str(), nullptr, 10);
    const char unit = text.back();
    if (unit == 'K') value <<= 10;
    if (unit == 'M') value <<= 20;
    best = std::max(best, value);
  }
  return best;
}

Result<std::unique_ptr<ReadBandwidthProbe>> ReadBandwidthProbe::Create(
    ThreadPool& pool, const ReadBandwidthOptions& options) {
  size_t bytes = options.buffer_bytes;
  if (bytes == 0) bytes = std::max<size_t>(size_t{1} << 30, 4 * LastLevelCacheBytes());
  if (bytes < (size_t{1} << 20))
    return InvalidArgument("read-bandwidth buffer of " + std::to_string(bytes) +
                           " bytes is under 1 MiB");
  const int threads = pool.num_threads();
  const size_t chunk = bytes / threads / 4096 * 4096;  // whole pages per thread
  bytes = chunk * threads;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED)
    return ResourceExhausted("mmap of " + std::to_string(bytes) +
                             " bytes for the read probe: " + std::strerror(errno));
  madvise(mem, bytes, MADV_HUGEPAGE);
  uint8_t* buf = static_cast<uint8_t*>(mem);
  // Each thread touches (faults in) the part it will read.
  pool.ParallelFor(threads, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) std::memset(buf + t * chunk, static_cast<int>(t + 1), chunk);
  });
  return std::unique_ptr<ReadBandwidthProbe>(
      new ReadBandwidthProbe(pool, buf, bytes, chunk, std::max(1, options.repeats)));
}

ReadBandwidthProbe::~ReadBandwidthProbe() { munmap(buf_, bytes_); }

// The ways of reading a thread's part that Measure tries: (streams, prefetch distance in bytes).
struct ReadWay {
  int streams;
  size_t ahead, far;
};
constexpr ReadWay kReadWays[] = {{1, 0, 0},    {4, 0, 0},       {4, 1536, 0},
                                 {8, 1536, 0}, {4, 1536, 6144}, {8, 1536, 6144}};

uint64_t ReadPart(const CpuFeatures& f, const ReadWay& way, const uint8_t* p, size_t n) {
  if (!f.avx512) return f.avx2 ? ReadAvx2(p, n) : ReadScalar(p, n);
  switch (way.streams) {
    case 4:
      return ReadAvx512Streams<4>(p, n, way.ahead, way.far);
    case 8:
      return ReadAvx512Streams<8>(p, n, way.ahead, way.far);
    default:
      return ReadAvx512(p, n);
  }
}

double ReadBandwidthProbe::Measure() {
  const CpuFeatures& f = DetectCpuFeatures();
  std::atomic<uint64_t> sink{0};
  double best = 0;
  const int ways = f.avx512 ? static_cast<int>(std::size(kReadWays)) : 1;
  for (int r = 0; r < repeats_; ++r)
    for (int w = 0; w < ways; ++w) {
      const double t0 = Now();
      pool_.ParallelFor(pool_.num_threads(), [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t)
          sink.fetch_add(ReadPart(f, kReadWays[w], buf_ + t * chunk_, chunk_),
                         std::memory_order_relaxed);
      });
      const double gbs = static_cast<double>(bytes_) / (Now() - t0) / 1e9;
      best = std::max(best, gbs);
    }
  return best;
}

Result<double> MeasureReadBandwidth(ThreadPool& pool, const ReadBandwidthOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<ReadBandwidthProbe> probe,
                   ReadBandwidthProbe::Create(pool, options));
  return probe->Measure();
}

// Runs loop(iterations) on every pool thread at once (after a short warm-up) and returns the
// GFLOP/s it reached, at flops_per_iteration per thread and iteration.
double TimeArithmeticLoop(ThreadPool& pool, long iterations, float (*loop)(long),
                          double flops_per_iteration) {
  const int threads = pool.num_threads();
  std::atomic<float> sink{0};
  pool.ParallelFor(threads, [&](int64_t, int64_t) { sink.store(loop(iterations / 100)); });
  const double t0 = Now();
  pool.ParallelFor(threads, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) sink.store(loop(iterations));
  });
  const double seconds = Now() - t0;
  return flops_per_iteration * static_cast<double>(iterations) * threads / seconds / 1e9;
}

double MeasurePeakGflops(ThreadPool& pool, long iterations) {
  return TimeArithmeticLoop(pool, iterations, FmaLoop, FlopsPerIteration());
}

Result<double> MeasurePeakBf16DotGflops(ThreadPool& pool, long iterations,
                                        const CpuFeatures& features) {
  if (!features.avx512_bf16) return Unimplemented("this CPU has no avx512_bf16 (vdpbf16ps)");
  constexpr double kFlopsPerIteration = 24.0 * 16 * 4;  // 16 lanes x (2 products + 2 adds)
  return TimeArithmeticLoop(pool, iterations, DotBf16Avx512, kFlopsPerIteration);
}

KernelVariant DescribeKernels() {
  const CpuFeatures& f = DetectCpuFeatures();
  const IsaLevel level = BestIsaLevel();
  const bool panel = kernels::KernelsFor(level).matmul_panel != nullptr;
  KernelVariant v;
  v.cpu_model = CpuModelName();
  v.vendor = std::string(CpuVendorName(f.vendor));
  v.isa = std::string(IsaLevelName(level));
  v.matmul = panel ? "panel32" : "rowmajor";
  v.bf16_dot = f.avx512_bf16 ? "vdpbf16ps" : "none";
  const AmxSupport& amx = DetectAmx();
  v.amx = amx.usable ? "bf16 tiles from " + std::to_string(kernels::kAmxMinRows) + " rows"
                     : "none (" + amx.reason + ")";
  v.decode_stream = panel ? kernels::PanelStreamName(kernels::ChosenPanelStream()) : "-";
  return v;
}

Status SetDecodeStream(std::string_view name) {
  if (name == "auto") {
    kernels::ClearForcedPanelStream();
  } else if (name == "single") {
    kernels::ForcePanelStream(kernels::PanelStream::kSingle);
  } else if (name == "multi") {
    kernels::ForcePanelStream(kernels::PanelStream::kMulti);
  } else {
    return InvalidArgument("unknown decode stream '" + std::string(name) +
                           "' (expected auto, single or multi)");
  }
  return OkStatus();
}

}  // namespace pd::engine
