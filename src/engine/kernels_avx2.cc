// Fast kernels for avx2 (placeholder: the scalar table until the SIMD kernels land).
#include "engine/kernels.h"

namespace pd::engine::kernels {

const IsaKernels& Avx2Kernels() { return ScalarKernels(); }

}  // namespace pd::engine::kernels
