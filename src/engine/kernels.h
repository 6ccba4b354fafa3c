// Private to src/engine: the plain-data arguments of the forward-pass kernels, and the table of
// fast kernels one instruction set provides. The ISA files (kernels_avx2.cc, kernels_avx512.cc)
// include only this header and intrinsics, so no inline function of another header is compiled
// with their wider instruction sets.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pd::engine::kernels {

// A weight matrix W (n, k), row-major, f32 or bf16, laid out for the matmul kernels.
struct WeightMatrix {
  const void* data = nullptr;
  bool bf16 = false;
  int64_t n = 0;
  int64_t k = 0;
};

// One layer of a paged KV region. Page p of this layer starts at base + p*page_bytes; inside a
// page the element offset of (slot, head, kv) is
//   HND: ((head*2 + kv)*page_size + slot)*head_dim    NHD: ((slot*num_kv_heads + head)*2 +
//   kv)*head_dim
struct PagedKv {
  uint8_t* base = nullptr;
  int64_t page_bytes = 0;
  int page_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  bool hnd = true;
  bool bf16 = false;
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

// Scratch floats one attention work item needs (fast kernels): for each query head sharing the
// KV head, a block of scores, an accumulator padded to whole vectors, a running max and sum.
inline size_t AttentionItemScratchFloats(int group, int head_dim) {
  return static_cast<size_t>(group) * (kAttnBlock + head_dim + 32) + 64;
}

// The fast kernels of one instruction set. Each computes a slice so callers can split work
// across threads.
struct IsaKernels {
  const char* name;
  // out[m, n] = sum_k x[m, k] * W[n, k] for m < num_rows and n in [n_begin, n_end).
  // x (num_rows, k) row stride ldx; out (num_rows, w.n) row stride ldo.
  void (*matmul)(const float* x, int64_t num_rows, int64_t ldx, const WeightMatrix& w,
                 int64_t n_begin, int64_t n_end, float* out, int64_t ldo);
  // Attention of one token for the query heads of one KV head (one work item).
  void (*attention_item)(const AttentionArgs& args, int token, int kv_head, float* scratch);
};

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

// out = x @ W^T over all of W's rows, split across the pool's threads by output columns.
void ParallelMatmul(ThreadPool& pool, const IsaKernels& isa, const float* x, int64_t num_rows,
                    int64_t ldx, const WeightMatrix& w, float* out, int64_t ldo);
// Causal paged attention of args, work items (token, kv_head) split across the pool's threads.
// scratch: num_threads * scratch_stride floats, scratch_stride >= AttentionItemScratchFloats.
void ParallelAttention(ThreadPool& pool, const IsaKernels& isa, const AttentionArgs& args,
                       float* scratch, size_t scratch_stride);

}  // namespace pd::engine::kernels
