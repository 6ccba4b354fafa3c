// Private to src/engine: the MLA kernels split across a thread pool (mla_kernels.h has the
// kernels and their shapes).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kernels.h"
#include "engine/mla_kernels.h"

namespace pd::engine {
class ThreadPool;
}  // namespace pd::engine

namespace pd::engine::kernels {

// Buffers of ParallelMlaAttention, grown on demand and reused across steps.
struct MlaWorkspace {
  struct Item {
    int token = 0;
    int p_begin = 0, p_end = 0;
    int part = 0;  // index of its partial
  };
  std::vector<Item> items;
  std::vector<int> token_parts;  // (num_tokens + 1) first item of each token
  std::vector<float> ml;         // (items, 2, num_heads) m then l of each item
  std::vector<float> acc;        // (split items, num_heads, R) for tokens split into chunks
  std::vector<float> scratch;    // (threads, MlaChunkScratchFloats)
};

// Causal absorbed attention of args across the pool. A token of a multi-token run (prefill) is
// one work item over all its positions, accumulating straight into its output; a lone (decode)
// token's positions are split into chunks of whole kMlaBlock blocks, so that a batch of few
// sequences keeps every thread busy, and the chunks' partials are merged. Every chunk reads its
// latent rows once for all heads.
void ParallelMlaAttention(ThreadPool& pool, const MlaIsaKernels& isa, const MlaAttentionArgs& args,
                          MlaWorkspace* ws);

// Per head h < num_heads: out_h (rows, w[h].n) = x_h (rows, w[h].k) @ w[h]^T, where x_h = x +
// h*x_head_stride (row stride ldx) and out_h = out + h*out_head_stride (row stride ldo). All heads
// in one pool dispatch (work items: a head's panel groups, or 16-row blocks of row-major W).
struct HeadMatmulArgs {
  const float* x = nullptr;
  int64_t ldx = 0, x_head_stride = 0;
  const WeightMatrix* w = nullptr;  // (num_heads), all of one shape and layout
  int num_heads = 0;
  float* out = nullptr;
  int64_t ldo = 0, out_head_stride = 0;
  int64_t rows = 0;
};
void ParallelHeadMatmul(ThreadPool& pool, const IsaKernels& isa, const HeadMatmulArgs& args);

}  // namespace pd::engine::kernels
