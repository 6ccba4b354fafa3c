// Which instruction sets this CPU offers, detected once at run time, and which fast-kernel level
// pdserve uses (the best the CPU has, or a lower one forced for tests and comparisons).
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace pd::engine {

enum class CpuVendor { kOther, kIntel, kAmd };

struct CpuFeatures {
  CpuVendor vendor = CpuVendor::kOther;  // CPUID leaf 0's vendor string
  bool avx2 = false;                     // with fma and f16c
  bool avx512 = false;                   // f, bw, vl, dq
  bool avx512_bf16 = false;
  bool amx_bf16 = false;  // AMX-TILE and AMX-BF16 (CPUID); usable once DetectAmx() says so
};

const CpuFeatures& DetectCpuFeatures();
std::string_view CpuVendorName(CpuVendor vendor);  // "intel" | "amd" | "other"
// Whether this process may run AMX bf16 tile instructions: the CPU has AMX-TILE and AMX-BF16, and
// Linux granted the tile data state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)), which
// is asked for once per process on the first call (thread-safe; the permission then holds for
// every thread of the process). `reason` says why not when not usable; a refused request is also
// logged once as a warning (the matmuls then keep AVX-512).
struct AmxSupport {
  bool usable = false;
  std::string reason;
};
const AmxSupport& DetectAmx();

// /proc/cpuinfo's first "model name" (e.g. "AMD EPYC 9R14 96-Core Processor"), or "unknown".
std::string CpuModelName();

enum class IsaLevel { kScalar, kAvx2, kAvx512 };
std::string_view IsaLevelName(IsaLevel level);  // "scalar" | "avx2" | "avx512"
Result<IsaLevel> ParseIsaLevel(std::string_view name);
// The best level the CPU supports.
IsaLevel BestIsaLevel();
bool IsaSupported(IsaLevel level);

}  // namespace pd::engine
