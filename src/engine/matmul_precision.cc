#include "engine/matmul_precision.h"

#include <atomic>
#include <string>

#include "engine/cpu_features.h"
#include "engine/kernels.h"

namespace pd::engine {

std::string_view MatmulPrecisionName(MatmulPrecision p) {
  return p == MatmulPrecision::kBf16 ? "bf16" : "f32";
}

Result<MatmulPrecision> ParseMatmulPrecision(std::string_view name) {
  if (name == "f32") return MatmulPrecision::kF32;
  if (name == "bf16") return MatmulPrecision::kBf16;
  return InvalidArgument("unknown matmul precision '" + std::string(name) +
                         "' (expected f32 or bf16)");
}

bool MatmulBf16DotUsed(KernelKind kernels, MatmulPrecision precision) {
  if (precision != MatmulPrecision::kBf16) return false;
  if (kernels == KernelKind::kReference) return true;
  return DetectCpuFeatures().avx512_bf16 &&
         kernels::KernelsFor(BestIsaLevel()).matmul_panel_bf16_dot != nullptr;
}

namespace {
std::atomic<bool> amx_allowed{true};
}  // namespace

std::string_view MatmulPathName(MatmulPath path) {
  switch (path) {
    case MatmulPath::kBf16Dot:
      return "avx512-bf16-dot";
    case MatmulPath::kAmxBf16:
      return "amx-bf16";
    case MatmulPath::kF32:
      break;
  }
  return "f32";
}

MatmulPath ChosenMatmulPath(KernelKind kernels, MatmulPrecision precision) {
  if (!MatmulBf16DotUsed(kernels, precision)) return MatmulPath::kF32;
  if (kernels == KernelKind::kFast && AmxAllowed() && DetectAmx().usable)
    return MatmulPath::kAmxBf16;
  return MatmulPath::kBf16Dot;
}

void SetAmxAllowed(bool allowed) { amx_allowed.store(allowed, std::memory_order_relaxed); }
bool AmxAllowed() { return amx_allowed.load(std::memory_order_relaxed); }

}  // namespace pd::engine
