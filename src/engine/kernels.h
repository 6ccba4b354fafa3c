// Private to src/engine: the plain-data arguments of the forward-pass kernels, and the table of
// fast kernels one instruction set provides. The ISA files (kernels_avx2.cc, kernels_avx512.cc)
// include only this header and intrinsics, so no inline function of another header is compiled
// with their wider instruction sets.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pd::engine::kernels {

// How a weight matrix's elements are ordered in memory.
//   kRowMajor: W (n, k) row after row.
//   kPanel32:  groups of 32 rows, group g at element offset g*k*32 (rows past n are zero). Inside a
//              group, for each k, 32 elements: f32: rows 32g+0..31 in order; bf16: pairs, the
//              32-bit word j (j < 16) holding row 32g+j in its low half and row 32g+16+j in its
//              high half, so one 64-byte load gives both rows' f32 values with a shift and a mask.
//              Each group is one sequential stream of k*64 (bf16) or k*128 (f32) bytes.
enum class WeightLayout { kRowMajor, kPanel32 };
constexpr int64_t kPanelRows = 32;

// A weight matrix W (n, k), f32, bf16 or fp8, laid out for the matmul kernels.
struct WeightMatrix {
  const void* data = nullptr;
  bool bf16 = false;
  int64_t n = 0;
  int64_t k = 0;
  WeightLayout layout = WeightLayout::kRowMajor;
  // fp8: data holds e4m3fn codes (bf16 false) and W[n, k] = code * scale of its 128-wide k block:
  //   kRowMajor: codes (n, k); scales (ceil(n/128), ceil(k/128)), one per 128x128 block, as FP8
  //              checkpoints store `_scale_inv`.
  //   kPanel32:  codes: groups of 32 rows, group g at byte g*k*32, inside it for each k the 32
  //              rows' codes in order (rows past n zero); scales (groups, ceil(k/128), 32): each
  //              row's scale per k block (so stacked matrices keep their own blocks).
  // The kernels convert codes in registers and, per row and k block, multiply the block's partial
  // sum by its scale and add it to the total.
  bool fp8 = false;
  const float* scales = nullptr;
};
constexpr int64_t kFp8Block = 128;  // k (and checkpoint n) per scale block
inline int64_t Fp8KBlocks(int64_t k) { return (k + kFp8Block - 1) / kFp8Block; }

// Bytes of fp8 W (n, k) in the kPanel32 layout: codes, then the scales (64-byte aligned).
inline size_t Panel32Fp8CodeBytes(int64_t n, int64_t k) {
  return (static_cast<size_t>((n + kPanelRows - 1) / kPanelRows) * kPanelRows * k + 63) / 64 * 64;
}
inline size_t Panel32Fp8Bytes(int64_t n, int64_t k) {
  return Panel32Fp8CodeBytes(n, k) +
         static_cast<size_t>((n + kPanelRows - 1) / kPanelRows) * Fp8KBlocks(k) * kPanelRows * 4;
}
// Bytes of a matrix shaped (n, like.k) of like's dtype in the kPanel32 layout.
inline size_t Panel32BytesLike(int64_t n, const WeightMatrix& like) {
  return like.fp8 ? Panel32Fp8Bytes(n, like.k)
                  : ((static_cast<size_t>((n + kPanelRows - 1) / kPanelRows) * kPanelRows * like.k *
                      (like.bf16 ? 2 : 4)));
}
// Bytes one row-major matrix's weights (and scales) take.
inline size_t RowMajorBytes(const WeightMatrix& w) {
  if (!w.fp8) return static_cast<size_t>(w.n * w.k) * (w.bf16 ? 2 : 4);
  return static_cast<size_t>(w.n * w.k) +
         static_cast<size_t>((w.n + kFp8Block - 1) / kFp8Block * Fp8KBlocks(w.k)) * 4;
}

// Bytes of W (n, k) in the kPanel32 layout (whole groups).
inline size_t Panel32Bytes(int64_t n, int64_t k, bool bf16) {
  return static_cast<size_t>((n + kPanelRows - 1) / kPanelRows) * kPanelRows * k * (bf16 ? 2 : 4);
}

// One layer of a paged KV region. Page p of this layer starts at base + p*page_bytes; inside a
// page the element offset of (slot, head, kv) is
//   HND: ((head*2 + kv)*page_size + slot)*head_dim    NHD: ((slot*num_kv_heads + head)*2 +
//   kv)*head_dim
// Elements are f32, bf16, or (fp8, bf16 false) e4m3fn codes whose value is code * k_scale (K) or
// code * v_scale (V), converted in registers by the kernels.
struct PagedKv {
  uint8_t* base = nullptr;
  int64_t page_bytes = 0;
  int page_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  bool hnd = true;
  bool bf16 = false;
  bool fp8 = false;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  int64_t elem_bytes() const { return fp8 ? 1 : (bf16 ? 2 : 4); }
};

// The tokens of one sequence in this step: rows [token_begin, token_begin+num_tokens) of q/out,
// at positions start_pos.. of the sequence.
struct AttnSeq {
  int token_begin = 0;
  int num_tokens = 0;
  int start_pos = 0;
  const int32_t* page_table = nullptr;
};

// Causal GQA attention of every token over positions 0..its own, K/V read from the pages.
struct AttentionArgs {
  PagedKv kv;
  int num_heads = 0;         // query heads; num_heads % kv.num_kv_heads == 0
  const float* q = nullptr;  // (num_tokens, num_heads, head_dim), row stride ldq
  int64_t ldq = 0;
  float* out = nullptr;  // (num_tokens, num_heads, head_dim), row stride ldo
  int64_t ldo = 0;
  const AttnSeq* seqs = nullptr;  // (num_seqs)
  int num_seqs = 0;
  const int32_t* token_seq = nullptr;  // (num_tokens): index into seqs of each token
  int num_tokens = 0;
  float scale = 1.0f;  // 1/sqrt(head_dim)
};

// Positions processed per block by the online-softmax attention kernels.
constexpr int kAttnBlock = 32;

// Tokens of one sequence that one attention_rows work item takes at most: each K/V block is read
// (and converted from bf16) once for all of them.
constexpr int kAttnRows = 16;

// Scratch floats one attention work item needs (fast kernels), attention_item's or
// attention_rows', whichever is larger: for each query head sharing the KV head (and each of up to
// kAttnRows tokens), a block of scores, an accumulator and a copy of q padded to whole vectors, a
// running max and sum; 16x16 partial dot products per head; for attention_rows, one block of K
// and V rows as f32.
inline size_t AttentionItemScratchFloats(int group, int head_dim) {
  const size_t g = static_cast<size_t>(group), dv = static_cast<size_t>(head_dim + 16);
  const size_t item = g * (kAttnBlock + 2 * dv + 2 + 256) + 64;
  const size_t rows =
      kAttnRows * g * (kAttnBlock + 2 * dv + 2) + g * 256 + 2 * kAttnBlock * dv + 64;
  return item > rows ? item : rows;
}

// The fast kernels of one instruction set. Each computes a slice so callers can split work
// across threads.
struct IsaKernels {
  const char* name;
  // out[m, n] = sum_k x[m, k] * W[n, k] for m < num_rows and n in [n_begin, n_end).
  // x (num_rows, k) row stride ldx; out (num_rows, w.n) row stride ldo.
  void (*matmul)(const float* x, int64_t num_rows, int64_t ldx, const WeightMatrix& w,
                 int64_t n_begin, int64_t n_end, float* out, int64_t ldo);
  // The same for W in the kPanel32 layout, n_begin a multiple of kPanelRows; nullptr when this
  // instruction set has no panel kernel (the runner then keeps row-major weights). Every output
  // element is one f32 FMA chain over k = 0, 1, ... whatever num_rows is, so a row's result does
  // not depend on the rows computed with it.
  void (*matmul_panel)(const float* x, int64_t num_rows, int64_t ldx, const WeightMatrix& w,
                       int64_t n_begin, int64_t n_end, float* out, int64_t ldo);
  // Attention of one token for the query heads of one KV head (one work item).
  void (*attention_item)(const AttentionArgs& args, int token, int kv_head, float* scratch);
  // One row each, within ~2 ulp of ref::SiluMul / ref::RmsNorm (which they replace row by row):
  // out (dim) = gate * sigmoid(gate) * up (out may alias gate);
  // out (dim) = x / sqrt(mean(x^2) + eps) * w, sum of squares in f64 (out may alias x).
  void (*silu_mul_row)(const float* gate, const float* up, int64_t dim, float* out);
  void (*rms_norm_row)(const float* x, const float* w, int64_t dim, float eps, float* out);
  // attention_item for tokens [token, token + num_tokens) at once: consecutive tokens of one
  // sequence, 1 <= num_tokens <= kAttnRows. Each token's output has the same bits as
  // attention_item's (same operations in the same order). nullptr: this ISA has none.
  void (*attention_rows)(const AttentionArgs& args, int token, int num_tokens, int kv_head,
                         float* scratch) = nullptr;
  // matmul_panel with x rounded to bf16 (nearest even) and bf16 dot products: bit for bit
  // ref::MatmulBf16Dot for bf16 weights with even k (others take matmul_panel), and like it
  // independent of num_rows. nullptr: none; only call when the CPU has AVX512_BF16.
  void (*matmul_panel_bf16_dot)(const float* x, int64_t num_rows, int64_t ldx,
                                const WeightMatrix& w, int64_t n_begin, int64_t n_end, float* out,
                                int64_t ldo) = nullptr;
};

using MatmulFn = void (*)(const float* x, int64_t num_rows, int64_t ldx, const WeightMatrix& w,
                          int64_t n_begin, int64_t n_end, float* out, int64_t ldo);
// How the AVX-512 panel matmul reads the weights of a decode batch (up to 4 rows); both give the
// same bits (each output is the same chain over k), only the speed differs by CPU.
//   kSingle: one group at a time, no software prefetch: a thread's share is one sequential read
//            that the hardware prefetcher follows (the fastest way on AMD Zen 4).
//   kMulti:  four groups at a time (two at 3-4 rows of dot products), each prefetched into L1
//            ahead (the fastest way on Intel Xeon, where one plain stream reads ~0.85 of it).
enum class PanelStream { kSingle, kMulti };
const char* PanelStreamName(PanelStream stream);  // "single" | "multi"
// The way for this CPU (kSingle on AMD, kMulti elsewhere), unless ForcePanelStream set one.
PanelStream ChosenPanelStream();
// Makes ChosenPanelStream return `stream` from now on (benchmarks comparing the two, tests): the
// kernel tables KernelsFor returns after it read this way. ClearForcedPanelStream undoes it.
void ForcePanelStream(PanelStream stream);
void ClearForcedPanelStream();
// The AVX-512 kPanel32 matmul (kernels_avx512_gemm.cc), and its bf16-dot variant (AVX512_BF16).
MatmulFn Avx512PanelMatmul(PanelStream stream);
MatmulFn Avx512PanelDotMatmul(PanelStream stream);
// The AMX bf16 matmul (kernels_amx.cc) from kAmxMinRows rows of x: matmul_panel_bf16_dot's
// contract except that it multiplies 16x16 tiles with TDPBF16PS, whose sums differ from the
// vdpbf16ps chain in the last bits (within ~1e-5 of the sum's magnitude of ref::MatmulBf16Dot);
// still independent of the rows computed with it. Fewer rows, f32 weights or odd k:
// Avx512PanelDotMatmul(stream). Only call once DetectAmx() (cpu_features.h) says usable.
// 16: one whole row tile; there the tiles measured 2.4-3x the dot kernel (2048 x 2048 bf16, one
// thread), above it more.
constexpr int64_t kAmxMinRows = 16;
MatmulFn AmxPanelDotMatmul(PanelStream stream);

// The fp8 matmuls: the AVX-512 kPanel32 one (kernels_avx512_fp8.cc; the AVX-512 panel matmuls
// hand fp8 weights to it) and the scalar ones (any layout) that tables without their own use.
void Avx512Fp8PanelMatmul(const float* x, int64_t num_rows, int64_t ldx, const WeightMatrix& w,
                          int64_t n_begin, int64_t n_end, float* out, int64_t ldo);
void ScalarFp8Matmul(const float* x, int64_t num_rows, int64_t ldx, const WeightMatrix& w,
                     int64_t n_begin, int64_t n_end, float* out, int64_t ldo);

// The reference row kernels, for tables without their own.
void ScalarSiluMulRow(const float* gate, const float* up, int64_t dim, float* out);
void ScalarRmsNormRow(const float* x, const float* w, int64_t dim, float eps, float* out);

const IsaKernels& ScalarKernels();
const IsaKernels& Avx2Kernels();    // only call when the CPU has AVX2+FMA+F16C
const IsaKernels& Avx512Kernels();  // only call when the CPU has AVX-512 F/BW/VL/DQ

}  // namespace pd::engine::kernels

namespace pd::engine {
class ThreadPool;
enum class IsaLevel;
}  // namespace pd::engine

namespace pd::engine::kernels {

// The table for a level (which the CPU must support).
const IsaKernels& KernelsFor(IsaLevel level);

// Packs the row-major matrices srcs (each (n_i, k), all f32, all bf16 or all fp8), stacked in
// order as one matrix (sum n_i, k), into dst (Panel32BytesLike of it) in the kPanel32 layout;
// groups are split across the pool's threads. Returns the stacked matrix's WeightMatrix over dst.
WeightMatrix PackPanel32(ThreadPool& pool, const WeightMatrix* srcs, int num_srcs, void* dst);

// out = x @ W^T over all of W's rows, split across the pool's threads by output columns (whole
// panel groups for kPanel32, which isa must have a kernel for).
void ParallelMatmul(ThreadPool& pool, const IsaKernels& isa, const float* x, int64_t num_rows,
                    int64_t ldx, const WeightMatrix& w, float* out, int64_t ldo);
// Causal paged attention of args, work items (token, kv_head) split across the pool's threads.
// scratch: num_threads * scratch_stride floats, scratch_stride >= AttentionItemScratchFloats.
void ParallelAttention(ThreadPool& pool, const IsaKernels& isa, const AttentionArgs& args,
                       float* scratch, size_t scratch_stride);

}  // namespace pd::engine::kernels
