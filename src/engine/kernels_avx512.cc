// Fast kernels for avx512 (placeholder: the scalar table until the SIMD kernels land).
#include "engine/kernels.h"

namespace pd::engine::kernels {

const IsaKernels& Avx512Kernels() { return ScalarKernels(); }

}  // namespace pd::engine::kernels
