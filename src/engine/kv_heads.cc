#include "engine/kv_heads.h"

#include <string>

#include "common/check.h"

namespace pd::engine {
namespace {

bool Splits(int num_kv_heads, int tp_size) {
  if (tp_size < 1 || num_kv_heads < 1) return false;
  return tp_size <= num_kv_heads ? num_kv_heads % tp_size == 0 : tp_size % num_kv_heads == 0;
}

}  // namespace

Status ValidateKvHeadSplit(int num_kv_heads, int tp_size) {
  if (Splits(num_kv_heads, tp_size)) return OkStatus();
  const std::string t = std::to_string(tp_size), h = std::to_string(num_kv_heads);
  if (tp_size < 1) return InvalidArgument("tensor-parallel size " + t + " must be at least 1");
  if (num_kv_heads < 1) return InvalidArgument("KV heads " + h + " must be at least 1");
  if (tp_size <= num_kv_heads) {
    return InvalidArgument("tensor-parallel size " + t + " does not divide the " + h + " KV heads");
  }
  return InvalidArgument("tensor-parallel size " + t + " exceeds the " + h +
                         " KV heads and is not a multiple of them");
}

KvHeadRange RankKvHeads(int num_kv_heads, int tp_size, int rank) {
  PD_CHECK(Splits(num_kv_heads, tp_size))
      << "tp " << tp_size << " cannot split " << num_kv_heads << " KV heads";
  PD_CHECK(rank >= 0 && rank < tp_size) << "rank " << rank << " of tp " << tp_size;
  if (tp_size > num_kv_heads) {
    const int head = rank / (tp_size / num_kv_heads);
    return {head, head + 1};
  }
  const int per_rank = num_kv_heads / tp_size;
  return {rank * per_rank, (rank + 1) * per_rank};
}

}  // namespace pd::engine
