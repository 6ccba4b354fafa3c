// Which kernels a model runner uses and how its matmuls multiply.
#pragma once

#include <string_view>

#include "common/status.h"

namespace pd::engine {

enum class KernelKind { kReference, kFast };

// How the matmuls over bf16 weights multiply.
//   kF32:  x stays f32, each product exact (the default).
//   kBf16: x rounded to bf16 and multiplied with AVX-512 BF16 dot products (vdpbf16ps): up to
//          twice the FMA rate where the CPU runs them at full speed (bench-engine prints the
//          ratio), logits within ~1e-2 relative of kF32. Needs AVX512_BF16 for the fast kernels
//          (without it they keep kF32; MatmulBf16DotUsed says which); the reference kernels
//          emulate it (ref::MatmulBf16Dot). Matrices with f32 weights or odd k keep kF32.
enum class MatmulPrecision { kF32, kBf16 };
std::string_view MatmulPrecisionName(MatmulPrecision p);  // "f32" | "bf16"
Result<MatmulPrecision> ParseMatmulPrecision(std::string_view name);
// Whether a runner created with these kernels and precision multiplies in bf16.
bool MatmulBf16DotUsed(KernelKind kernels, MatmulPrecision precision);

}  // namespace pd::engine
