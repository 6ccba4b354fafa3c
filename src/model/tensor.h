// A borrowed view of a tensor: dtype, shape and a pointer into memory someone else owns (usually a
// memory-mapped safetensors file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/dtype.h"

namespace pd::model {

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  // F8_E4M3 matrices (n, k) only: their block scales, f32 (ceil(n/128), ceil(k/128)) row-major,
  // from `<name>_scale_inv`; the value of element (i, j) is At(i*k + j) * scale_inv[block].
  const float* scale_inv = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t size_bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
  // Element i as float, whatever the dtype.
  float At(int64_t i) const;
};

std::string ShapeToString(const std::vector<int64_t>& shape);  // "[2048, 512]"

}  // namespace pd::model
