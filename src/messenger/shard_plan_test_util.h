// Test helpers (header-only, not part of pd_messenger): KV pages filled the way the engine stores
// them, so a shard plan's result can be checked byte by byte.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/kv_cache.h"
#include "messenger/shard_plan.h"

namespace pd::messenger::testing {

// The byte the engine stores at (layer, page, token, global head, kv, dim, byte of the element).
inline uint8_t Expected(int layer, int page, int token, int head, int kv, int dim, int byte) {
  uint64_t x =
      (((((static_cast<uint64_t>(layer) * 131 + page) * 257 + token) * 263 + head) * 2 + kv) *
           4099 +
       dim) *
          8 +
      byte;
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x);
}

inline engine::KvCacheSpec RankSpec(const ShardSpec& scheme, int rank, const PageFormat& f,
                                    int layers) {
  engine::KvCacheSpec spec;
  spec.num_layers = layers;
  spec.num_kv_heads = RankHeads(scheme, rank).size();
  spec.head_dim = f.head_dim;
  spec.page_size = f.page_size;
  spec.layout = f.layout;
  spec.dtype = f.elem_bytes == 4 ? engine::KvDType::kF32 : engine::KvDType::kBF16;
  return spec;
}

// Calls fn(byte offset in the page block, token, global head, kv, dim, byte) for every byte of
// one rank's page, using the engine's own element addressing.
template <typename Fn>
void ForEachPageByte(const engine::KvCacheSpec& spec, int head_begin, Fn fn) {
  const size_t e = spec.elem_bytes();
  for (int t = 0; t < spec.page_size; ++t)
    for (int h = 0; h < spec.num_kv_heads; ++h)
      for (int kv = 0; kv < 2; ++kv)
        for (int d = 0; d < spec.head_dim; ++d)
          for (size_t b = 0; b < e; ++b)
            fn((spec.ElemOffset(t, h, kv) + d) * e + b, t, head_begin + h, kv, d,
               static_cast<int>(b));
}

}  // namespace pd::messenger::testing
