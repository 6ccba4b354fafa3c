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

// The kernel that runs a runner's matmuls over bf16 weights.
//   kF32:      x kept f32 (MatmulPrecision::kF32, or kBf16 where the CPU lacks AVX512_BF16).
//   kBf16Dot:  AVX-512 BF16 dot products (vdpbf16ps) at every row count; the reference kernels'
//              emulation of it (ref::MatmulBf16Dot) reports this path too.
//   kAmxBf16:  AMX tiles (TDPBF16PS) for matmuls of kernels::kAmxMinRows rows or more (prefill),
//              vdpbf16ps below (decode): where the CPU has AMX-BF16, Linux grants the tile state
//              and AMX is allowed. A row's result then depends on which of the two its matmul ran
//              (the tile sums differ in the last bits), so a sequence's logits may differ in the
//              last bits between a step it shares with a long prefill and one it runs alone; with
//              AMX off, kBf16 stays independent of the batch.
enum class MatmulPath { kF32, kBf16Dot, kAmxBf16 };
std::string_view MatmulPathName(MatmulPath path);  // "f32" | "avx512-bf16-dot" | "amx-bf16"
MatmulPath ChosenMatmulPath(KernelKind kernels, MatmulPrecision precision);
// Whether kBf16 may use AMX where the CPU and Linux allow it (true unless set): runners created
// afterwards follow it. For comparisons (bench-engine --amx) and tests.
void SetAmxAllowed(bool allowed);
bool AmxAllowed();

}  // namespace pd::engine
