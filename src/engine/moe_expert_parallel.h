// Private to src/engine: the sparse MoE MLP of a data-parallel instance (dp_engine.h), expert-
// parallel over its ranks. Rank r of N holds every attention weight but only the routed experts
// e with e % N == r (ExpertOwner), and the shared expert. Per MoE layer every rank, its own T_r
// tokens' normed inputs h (T_r, hidden) in hand:
//   1. publishes h and T_r; barrier;
//   2. gathers every rank's h in rank order (T = sum of T_r rows), routes all T tokens (the
//      router is on every rank, so all route alike) and groups the (token, expert) pairs by
//      expert exactly as MoeForward does; computes the grouped rows of the experts it holds, and
//      the shared expert over its own tokens; publishes its expert outputs; barrier;
//   3. sums, for each of its own tokens, the weighted outputs of the token's experts, read from
//      the ranks that hold them, in selection order, then adds the shared expert's output.
// A rank with no tokens in a step still takes part (T_r = 0): its experts serve the others.
// The tokens exchanged are in-process reads of the other ranks' buffers: a rank writes its own
// buffers only before barrier 1 (h) or between barriers 1 and 2 (expert outputs), and the others
// read them between the barriers that follow, so no buffer is rewritten while read (the next
// layer's barrier 1 comes before any rank rewrites its expert outputs).
// Every matmul row is computed independently of the rows beside it (moe_block.h) and each
// token's sum runs in the same order, so a token's output equals MoeForward's bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/moe_block.h"
#include "engine/tp_all_reduce.h"

namespace pd::engine {

// The rank of N that holds routed expert `expert`.
inline int ExpertOwner(int expert, int num_ranks) { return expert % num_ranks; }

// What the ranks publish to one another, one slot per rank.
// Thread safety: rank r writes only slot r, before the barrier after which the others read it.
class MoeExchange {
 public:
  explicit MoeExchange(int num_ranks)
      : h_(num_ranks, nullptr),
        tokens_(num_ranks, 0),
        yg_(num_ranks, nullptr),
        barrier_(num_ranks) {}
  int num_ranks() const { return static_cast<int>(h_.size()); }

 private:
  friend void MoeForwardExpertParallel(const MoeExec&, const model::MoeConfig&,
                                       const RunnerMoeWeights&, MoeExchange*, int, const float*,
                                       int64_t, int64_t, float*, MoeScratch*);
  std::vector<const float*> h_;   // [rank] its tokens' inputs (tokens_[rank], hidden)
  std::vector<int64_t> tokens_;   // [rank] its number of tokens this layer
  std::vector<const float*> yg_;  // [rank] its grouped expert outputs (rows of its experts)
  SpinBarrier barrier_;
};

// out (t, hidden) = the MoE MLP of this rank's h (t, hidden), w holding this rank's experts (the
// others' entries empty). Collective: every rank of ex calls it once per MoE layer, in order.
void MoeForwardExpertParallel(const MoeExec& exec, const model::MoeConfig& moe,
                              const RunnerMoeWeights& w, MoeExchange* ex, int rank, const float* h,
                              int64_t t, int64_t hidden, float* out, MoeScratch* s);

}  // namespace pd::engine
