#include "engine/cpu_features.h"

#include <cpuid.h>

#include <string>

namespace pd::engine {
namespace {

enum CpuidReg { kEax, kEbx, kEcx, kEdx };

// One CPUID feature bit, for the features clang before 16 has no __builtin_cpu_supports name for
// (f16c, avx512bf16). Each is read only once AVX2 or AVX-512 is known usable, so the check of OS
// support that the builtin adds has been made already.
bool CpuidBit(unsigned leaf, unsigned subleaf, CpuidReg reg, int bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (__get_cpuid_count(leaf, subleaf, &r[kEax], &r[kEbx], &r[kEcx], &r[kEdx]) == 0) return false;
  return ((r[reg] >> bit) & 1) != 0;
}

}  // namespace

const CpuFeatures& DetectCpuFeatures() {
  static const CpuFeatures features = [] {
    __builtin_cpu_init();
    CpuFeatures f;
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             CpuidBit(1, 0, kEcx, 29);  // F16C
    f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.avx512_bf16 = f.avx512 && CpuidBit(7, 1, kEax, 5);  // AVX512_BF16
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
