#include "engine/tp_shard_slices.h"

#include <cstring>

#include "common/check.h"

namespace pd::engine {
namespace {

using kernels::kFp8Block;

// The FP8 slice dequantised: out (rows, cols) = W[r0 + r, c0 + c] as f32.
LinearWeight DequantisedSlice(const kernels::WeightMatrix& w, int64_t r0, int64_t rows, int64_t c0,
                              int64_t cols) {
  PD_CHECK(w.fp8);
  const uint8_t* codes = static_cast<const uint8_t*>(w.data);  // (N, K)
  const int64_t kb = kernels::Fp8KBlocks(w.k);                 // scales (ceil(N/128), kb)
  LinearWeight out;
  out.w.n = rows;
  out.w.k = cols;
  out.owned.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t sr = r0 + r;
    const float* scale_row = w.scales + (sr / kFp8Block) * kb;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t sc = c0 + c;
      out.owned[r * cols + c] =
          model::Fp8E4m3ToF32(codes[sr * w.k + sc]) * scale_row[sc / kFp8Block];
    }
  }
  out.w.data = out.owned.data();
  return out;
}

// Rows [begin, begin+n): a view (FP8: codes and scale rows, begin on a block boundary).
LinearWeight RowView(const kernels::WeightMatrix& w, int64_t begin, int64_t n) {
  LinearWeight out;
  out.w = w;
  out.w.n = n;
  const size_t elem = w.fp8 ? 1 : (w.bf16 ? 2 : 4);
  out.w.data = static_cast<const uint8_t*>(w.data) + begin * w.k * elem;
  if (w.fp8) out.w.scales = w.scales + (begin / kFp8Block) * kernels::Fp8KBlocks(w.k);
  return out;
}

// Columns [begin, begin+n) copied (FP8: with the scale columns of their blocks, begin on a block
// boundary).
LinearWeight ColCopy(const kernels::WeightMatrix& w, int64_t begin, int64_t n) {
  LinearWeight out;
  out.w = w;
  out.w.k = n;
  const int64_t rows = w.n;
  const size_t elem = w.fp8 ? 1 : (w.bf16 ? 2 : 4);
  uint8_t* dst;
  if (w.fp8) {
    out.owned_fp8.resize(static_cast<size_t>(rows * n));
    dst = out.owned_fp8.data();
    const int64_t kb = kernels::Fp8KBlocks(w.k), nkb = kernels::Fp8KBlocks(n);
    const int64_t row_blocks = (rows + kFp8Block - 1) / kFp8Block, kb0 = begin / kFp8Block;
    out.owned_scales.resize(static_cast<size_t>(row_blocks * nkb));
    for (int64_t rb = 0; rb < row_blocks; ++rb)
      for (int64_t j = 0; j < nkb; ++j)
        out.owned_scales[rb * nkb + j] = w.scales[rb * kb + kb0 + j];
    out.w.scales = out.owned_scales.data();
  } else if (w.bf16) {
    out.owned_bf16.resize(static_cast<size_t>(rows * n));
    dst = reinterpret_cast<uint8_t*>(out.owned_bf16.data());
  } else {
    out.owned.resize(static_cast<size_t>(rows * n));
    dst = reinterpret_cast<uint8_t*>(out.owned.data());
  }
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * n * elem, src + (r * w.k + begin) * elem, n * elem);
  out.w.data = dst;
  return out;
}

}  // namespace

bool SliceKeepsDtype(const kernels::WeightMatrix& w, int64_t begin) {
  return !w.fp8 || begin % kFp8Block == 0;
}

LinearWeight SliceWeight(const kernels::WeightMatrix& w, SliceAxis axis, int64_t begin, int64_t n,
                         bool to_f32) {
  PD_CHECK(w.layout == kernels::WeightLayout::kRowMajor);
  const bool rows = axis == SliceAxis::kRows;
  PD_CHECK(begin >= 0 && n >= 0 && begin + n <= (rows ? w.n : w.k));
  if (to_f32)
    return rows ? DequantisedSlice(w, begin, n, 0, w.k) : DequantisedSlice(w, 0, w.n, begin, n);
  PD_CHECK(SliceKeepsDtype(w, begin)) << "an FP8 slice at " << begin << " inside a scale block";
  return rows ? RowView(w, begin, n) : ColCopy(w, begin, n);
}

WidthSplit SplitWidth(int64_t width, int tp, int rank, bool fp8) {
  WidthSplit even{rank * (width / tp), width / tp};
  const int64_t blocks = (width + kFp8Block - 1) / kFp8Block;
  bool aligned = true;
  for (int r = 0; r < tp; ++r) aligned = aligned && (r * (width / tp)) % kFp8Block == 0;
  if (!fp8 || aligned || blocks < tp) return even;
  const int64_t begin = std::min(width, blocks * rank / tp * kFp8Block);
  const int64_t end = std::min(width, blocks * (rank + 1) / tp * kFp8Block);
  return {begin, end - begin};
}

}  // namespace pd::engine
