#include "model/tensor.h"

#include <cstring>
#include <string>

namespace pd::model {

float TensorView::At(int64_t i) const {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF8E4M3:  // the code's value; the block scale is the caller's
      return Fp8E4m3ToF32(static_cast<const uint8_t*>(data)[i]);
  }
  return 0.0f;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  out += "]";
  return out;
}

}  // namespace pd::model
