#include "engine/matmul_precision.h"

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

}  // namespace pd::engine
