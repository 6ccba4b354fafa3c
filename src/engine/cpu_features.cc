#include "engine/cpu_features.h"

#include <cpuid.h>

#include <string>

namespace pd::engine {
namespace {

// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c".
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ecx & bit_F16C) != 0;
}

}  // namespace

const CpuFeatures& DetectCpuFeatures() {
  static const CpuFeatures features = [] {
    __builtin_cpu_init();
    CpuFeatures f;
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
    f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
    return f;
  }();
  return features;
}

std::string_view IsaLevelName(IsaLevel level) {
  switch (level) {
    case IsaLevel::kScalar:
      return "scalar";
    case IsaLevel::kAvx2:
      return "avx2";
    case IsaLevel::kAvx512:
      return "avx512";
  }
  return "scalar";
}

Result<IsaLevel> ParseIsaLevel(std::string_view name) {
  if (name == "scalar") return IsaLevel::kScalar;
  if (name == "avx2") return IsaLevel::kAvx2;
  if (name == "avx512") return IsaLevel::kAvx512;
  return InvalidArgument("unknown ISA level '" + std::string(name) +
                         "' (expected scalar, avx2 or avx512)");
}

bool IsaSupported(IsaLevel level) {
  const CpuFeatures& f = DetectCpuFeatures();
  switch (level) {
    case IsaLevel::kScalar:
      return true;
    case IsaLevel::kAvx2:
      return f.avx2;
    case IsaLevel::kAvx512:
      return f.avx512;
  }
  return false;
}

IsaLevel BestIsaLevel() {
  if (IsaSupported(IsaLevel::kAvx512)) return IsaLevel::kAvx512;
  if (IsaSupported(IsaLevel::kAvx2)) return IsaLevel::kAvx2;
  return IsaLevel::kScalar;
}

}  // namespace pd::engine
