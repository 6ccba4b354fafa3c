// Private to src/engine: how a tensor-parallel instance splits the model over its ranks, and each
// rank's weights.
//
// Rank r of TP t (model: nh query heads, H KV heads, I MLP columns, V vocab rows):
//   query heads     [r*nh/t, (r+1)*nh/t)                           (nh % t == 0)
//   KV heads        RankKvHeads (kv_heads.h), the rule the messenger plans transfers by:
//                   t <= H: [r*H/t, (r+1)*H/t); t > H: head r/(t/H), t/H replicas each
//   MLP columns     [r*I/t, (r+1)*I/t) of gate/up rows and down columns (I % t == 0)
//   lm_head rows    [r*V/t, (r+1)*V/t) (any V): every rank computes its slice of the logits
//   MoE experts     every routed and shared expert column-split like the dense MLP: columns
//                   [r*I/t, (r+1)*I/t) of its width I (moe_intermediate_size % t == 0); the
//                   router replicated, so every rank routes every token alike.
// Why column split and not expert parallelism: batch-1 decode is bound by the bytes the busiest
// rank reads, and MoE decode streams its experts as efficiently as a dense MLP of the same bytes
// (bench-engine's NAME-dense rows). Column split gives every rank exactly 1/t of each chosen
// expert. With experts dealt to ranks, the busiest rank holds the most of the top_k chosen: for
// 8 of 64 uniformly chosen experts, 1.25x the even share at TP 2 and 1.72x at TP 4 (expected
// maximum, simulated); on qwen3-moe-1g (per step: experts 113 MB, attention 56 MB, lm_head 67 MB)
// that is a 12% / 35% longer decode step. The cost of the column split: each expert's matmuls are
// I/t columns wide (whole 32-row panels; 96 for qwen3-moe-1g at TP 4).
// MLA (deepseek_v3): query heads split as above (q or q_b rows, W_UK^T/W_UV per head, o_proj
// columns); q_a, kv_a and the norms whole on every rank, which computes the latent itself and
// writes its own identical copy into its own region.
// q/k/v/gate/up are row-split (their rows are views into the checkpoint); o_proj and down_proj are
// column-split (copied at load), so each rank's o/down output is a partial sum over its heads /
// columns, added over ranks by TpAllReduce (tp_all_reduce.h). Embedding and norms are computed by
// every rank on the replicated residual stream (cheap, and keeps the ranks bit-identical).
// FP8 block-scaled weights (one scale per 128x128 block) are sliced with their scales
// (tp_shard_slices.h): a slice starting on a block boundary stays FP8 (rows a view, columns a
// copy); one starting inside a block is held dequantised to f32 by that rank (q|k|v, gate|up and
// MLA's q|kv_a together, as packing fuses them). MLP and expert widths whose even split falls
// inside blocks are split on block boundaries instead (SplitWidth: Qwen3-30B-A3B's 768 over 4
// ranks is 128/256/128/256), so every rank's config carries its own MLP widths.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "engine/model_runner_weights.h"
#include "model/config.h"

namespace pd::engine {

struct TpShard {
  int rank = 0;
  int tp_size = 1;
  int head_begin = 0, num_heads = 0;        // query heads
  int kv_head_begin = 0, num_kv_heads = 0;  // KV heads held (one when replicated)
  int64_t inter_begin = 0, inter = 0;       // MLP columns (the even split; FP8: SplitWidth)
  int64_t vocab_begin = 0, vocab = 0;       // lm_head rows
};

// InvalidArgument naming the numbers when tp_size cannot split this model.
Status ValidateTensorParallel(const model::ModelConfig& c, int tp_size);
// The shard of rank `rank`; call ValidateTensorParallel first.
TpShard ComputeTpShard(const model::ModelConfig& c, int tp_size, int rank);

// The rank's weights over the full (unpacked, row-major) ones, which must outlive the result:
// config holds the rank's head / KV head / MLP sizes (vocab_size stays the model's). FP8 weights
// as the header comment says.
Result<std::unique_ptr<RunnerWeights>> ShardRunnerWeights(const RunnerWeights& full,
                                                          const TpShard& shard);

}  // namespace pd::engine
