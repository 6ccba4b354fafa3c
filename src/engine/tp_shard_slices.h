// Private to src/engine: the slices of row-major weight matrices a tensor-parallel rank holds
// (tp_shard.cc, mla_weights.cc), for f32, bf16 and FP8 block-scaled weights.
//
// An FP8 matrix W (N, K) carries one scale per 128x128 block. A slice that starts on a block
// boundary keeps the checkpoint's blocks: its codes and its scales are a view (rows) or a copy
// (columns), and its last block may be partial like an edge block. A slice that starts inside a
// block cannot: there the rank holds the slice dequantised to f32 (code * scale, rounded once),
// which the f32 kernels run. Real checkpoints never need that (DeepSeek-V3 at TP 2/4/8, Qwen3-FP8
// at TP 2/4: head slices are multiples of 128, and MLP widths are split on block boundaries by
// SplitWidth); small and odd test shapes do.
#pragma once

#include <cstdint>

#include "engine/model_runner_weights.h"

namespace pd::engine {

enum class SliceAxis { kRows, kCols };

// Whether a slice of w starting at `begin` along either axis can keep w's dtype: always for f32
// and bf16; for FP8 when begin is a multiple of the 128-wide scale block.
bool SliceKeepsDtype(const kernels::WeightMatrix& w, int64_t begin);

// Rows [begin, begin+n) of W (N, K) as a view, or columns [begin, begin+n) copied into a (N, n)
// matrix the result owns; W row-major, which must outlive a view. FP8: begin on a block boundary
// (SliceKeepsDtype), the scales sliced alike. `to_f32`: the slice of an FP8 W dequantised into an
// owned f32 matrix (any begin).
LinearWeight SliceWeight(const kernels::WeightMatrix& w, SliceAxis axis, int64_t begin, int64_t n,
                         bool to_f32 = false);

// A rank's part [begin, begin+n) of an MLP width: the even split (width % tp_size == 0), except
// for FP8 weights whose even boundaries fall inside a 128-wide scale block, which are split on
// block boundaries instead (whole blocks dealt as evenly as they go: 768 over 4 ranks is 128, 256,
// 128, 256), as long as every rank gets one.
struct WidthSplit {
  int64_t begin = 0, n = 0;
};
WidthSplit SplitWidth(int64_t width, int tp_size, int rank, bool fp8);

}  // namespace pd::engine
