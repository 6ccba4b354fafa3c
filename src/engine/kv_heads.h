// Which KV heads each rank of a tensor-parallel instance holds: the one rule by which the engine
// shards its KV cache (tp_shard.h) and the messenger plans KV transfers between instances
// (messenger/shard_plan.h).
//
// Rank r of TP t over H KV heads:
//   t <= H: heads [r*H/t, (r+1)*H/t)                   (H % t == 0)
//   t >  H: head r / (t/H), so t/H ranks hold each head  (t % H == 0)
#pragma once

#include "common/status.h"

namespace pd::engine {

// The KV heads [begin, end) of the model that one rank holds.
struct KvHeadRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
  bool operator==(const KvHeadRange&) const = default;
};

// InvalidArgument naming the numbers when tp_size ranks cannot split num_kv_heads heads.
Status ValidateKvHeadSplit(int num_kv_heads, int tp_size);
// The heads rank `rank` holds; the split must be valid and 0 <= rank < tp_size.
KvHeadRange RankKvHeads(int num_kv_heads, int tp_size, int rank);

}  // namespace pd::engine
