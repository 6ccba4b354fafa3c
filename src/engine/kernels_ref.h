// Reference kernels of the forward pass: plain loops, shapes in comments, single-threaded. The
// fast kernels are tested against these.
#pragma once

#include <cstdint>

#include "engine/kernels.h"

namespace pd::engine::ref {

// x (rows, dim) stride ldx, w (dim) -> out (rows, dim) stride ldo:
// out = x / sqrt(mean(x^2) + eps) * w. out may alias x.
void RmsNorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* w, float eps,
             float* out, int64_t ldo);

// HF's RoPE angles for positions (rows): for i < d/2, angle = pos * theta^(-2i/d) (in double),
// cos/sin (rows, head_dim/2).
void RopeTable(const int32_t* positions, int64_t rows, int head_dim, double theta, float* cos_out,
               float* sin_out);
// In place on x (rows, num_heads, head_dim) with row stride ldx, rotate_half convention:
//   x[i]     <- x[i] * cos - x[i + d/2] * sin
//   x[i+d/2] <- x[i + d/2] * cos + x[i] * sin
void ApplyRope(float* x, int64_t rows, int num_heads, int head_dim, int64_t ldx,
               const float* cos_table, const float* sin_table);

// x (m, k) stride ldx @ W (n, k)^T -> out (m, n) stride ldo, W row-major in f32, bf16 or fp8
// (fp8: per output, each k block b's partial sum of x * code (one FMA chain) times scale[n/128, b],
// added to the total with an FMA in block order).
void Matmul(const float* x, int64_t m, int64_t ldx, const kernels::WeightMatrix& w, float* out,
            int64_t ldo);
// The same over output columns [n_begin, n_end) only.
void MatmulSlice(const float* x, int64_t m, int64_t ldx, const kernels::WeightMatrix& w,
                 int64_t n_begin, int64_t n_end, float* out, int64_t ldo);

// Matmul with x rounded to bf16 (nearest even, denormals to zero) and each output one chain of
// bf16 dot products over the pairs (k, k + 1) in order, as vdpbf16ps computes it: the k + 1
// product added, then the k product, each sum rounded to f32, denormal inputs, products and sums
// taken as zero. W row-major; f32 weights or odd k: Matmul (as the fast kernel falls back).
void MatmulBf16Dot(const float* x, int64_t m, int64_t ldx, const kernels::WeightMatrix& w,
                   float* out, int64_t ldo);

// Causal paged GQA attention for all tokens of args (softmax in f32 with max subtraction).
// scratch: at least (max position in the batch + 1) floats.
void PagedAttention(const kernels::AttentionArgs& args, float* scratch);
// One token, the query heads of one KV head; scratch as above.
void PagedAttentionItem(const kernels::AttentionArgs& args, int token, int kv_head, float* scratch);

// gate (rows, dim) stride ldg, up (rows, dim) stride ldu -> out (rows, dim) stride ldo:
// out = gate * sigmoid(gate) * up. out may alias gate.
void SiluMul(const float* gate, int64_t ldg, const float* up, int64_t ldu, int64_t rows,
             int64_t dim, float* out, int64_t ldo);

// Writes k, v (num_tokens, num_kv_heads, head_dim) (row strides ldk, ldv) of the seq's tokens into
// their page slots: position p goes to page page_table[p / page_size], slot p % page_size (bf16:
// rounded to nearest even; fp8: QuantizeKvFp8 with 1 / k_scale or 1 / v_scale).
void AppendKv(const kernels::PagedKv& kv, const kernels::AttnSeq& seq, const float* k, int64_t ldk,
              const float* v, int64_t ldv);

// Element (slot, head, kv) of a page as float, for tests and the reference attention.
const uint8_t* KvElemPtr(const kernels::PagedKv& kv, int32_t page, int slot, int head, int which);
// Element i of the K (which 0) or V (which 1) row at p as float (fp8: code * k_scale / v_scale).
float LoadKv(const kernels::PagedKv& kv, const uint8_t* p, int i, int which);

// The e4m3fn code a KV cache stores for x with per-tensor scale `scale`, as vLLM quantises it:
// e4m3(x / scale) rounded to nearest even, saturating to +-448 (no infinities in e4m3fn);
// +-0 and subnormals keep their sign; NaN gives the NaN code 0x7f, which reads back as NaN (so a
// NaN in K or V propagates as it would in an f32 cache).
uint8_t QuantizeKvFp8(float x, float scale);
// f32 -> e4m3fn code by bit manipulation, the same codes as model::F32ToFp8E4m3 (round to nearest
// even, saturating to +-448, NaN to 0x7f), cheap enough for every KV element written.
uint8_t F32ToE4m3Fast(float f);

}  // namespace pd::engine::ref
