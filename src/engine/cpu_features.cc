#include "engine/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "common/log.h"

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

CpuVendor DetectVendor() {
  unsigned r[4] = {0, 0, 0, 0};
  if (__get_cpuid(0, &r[kEax], &r[kEbx], &r[kEcx], &r[kEdx]) == 0) return CpuVendor::kOther;
  char name[13];
  std::memcpy(name, &r[kEbx], 4);  // the vendor string is EBX, EDX, ECX
  std::memcpy(name + 4, &r[kEdx], 4);
  std::memcpy(name + 8, &r[kEcx], 4);
  name[12] = '\0';
  if (std::strcmp(name, "GenuineIntel") == 0) return CpuVendor::kIntel;
  if (std::strcmp(name, "AuthenticAMD") == 0) return CpuVendor::kAmd;
  return CpuVendor::kOther;
}

}  // namespace

const CpuFeatures& DetectCpuFeatures() {
  static const CpuFeatures features = [] {
    __builtin_cpu_init();
    CpuFeatures f;
    f.vendor = DetectVendor();
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             CpuidBit(1, 0, kEcx, 29);  // F16C
    f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.avx512_bf16 = f.avx512 && CpuidBit(7, 1, kEax, 5);                // AVX512_BF16
    f.amx_bf16 = CpuidBit(7, 0, kEdx, 24) && CpuidBit(7, 0, kEdx, 22);  // AMX-TILE, AMX-BF16
    return f;
  }();
  return features;
}

namespace {

// Linux's arch_prctl codes for dynamically enabled XSAVE state (asm/prctl.h) and the tile data
// component's number (XFEATURE_XTILEDATA), spelled out for headers that predate them.
constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

AmxSupport RequestAmx() {
  AmxSupport s;
  const CpuFeatures& f = DetectCpuFeatures();
  if (!f.amx_bf16) {
    s.reason = "this CPU has no AMX-TILE/AMX-BF16";
    return s;
  }
  if (!f.avx512_bf16) {  // the kernel converts x with AVX512_BF16 and falls back to its dot path
    s.reason = "this CPU has AMX but no AVX512_BF16";
    return s;
  }
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    s.reason = std::string("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): ") + std::strerror(errno);
  } else {
    unsigned long long granted = 0;
    if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0) {
      s.reason = std::string("arch_prctl(ARCH_GET_XCOMP_PERM): ") + std::strerror(errno);
    } else if (((granted >> kXfeatureXtiledata) & 1) == 0) {
      s.reason = "arch_prctl granted no tile data state";
    } else {
      s.usable = true;
      return s;
    }
  }
  PD_LOG_WARN("AMX not used ({}); bf16 matmuls keep AVX-512", s.reason);
  return s;
}

}  // namespace

const AmxSupport& DetectAmx() {
  static const AmxSupport support = RequestAmx();
  return support;
}

std::string_view CpuVendorName(CpuVendor vendor) {
  switch (vendor) {
    case CpuVendor::kIntel:
      return "intel";
    case CpuVendor::kAmd:
      return "amd";
    case CpuVendor::kOther:
      break;
  }
  return "other";
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t begin = line.find_first_not_of(" \t", colon + 1);
    if (begin != std::string::npos) return line.substr(begin);
  }
  return "unknown";
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
