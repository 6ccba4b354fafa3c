// What a prefill and a decode instance must agree on before any KV moves, and how many writes a
// transfer takes.
//
//   KvFormat mine = MakeKvFormat(ModelFingerprint(weights), runner.region().spec());
//   Status ok = CheckCompatible(mine, hello.format);   // a clear reason when they differ
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "engine/kv_cache.h"
#include "messenger/wire.h"
#include "model/config.h"
#include "model/weights.h"

namespace pd::messenger {

// A hash of the config (as config.json would say it) and of every tensor's name, shape and the
// checkpoint dtype: two instances with equal fingerprints run the same architecture. (Weights'
// values are not hashed: reading them all would cost a pass over the checkpoint.)
uint64_t ModelFingerprint(const model::ModelConfig& config, model::DType weights_dtype);
uint64_t ModelFingerprint(const model::ModelWeights& weights);

KvFormat MakeKvFormat(uint64_t model_hash, const engine::KvCacheSpec& spec);

// OK when both sides can exchange KV pages; otherwise FailedPrecondition naming every field that
// differs with both values, e.g. "page_size: ours 16, theirs 8".
Status CheckCompatible(const KvFormat& ours, const KvFormat& theirs);

// Writes the decode side must count for one transfer of `num_pages` pages (the prompt without its
// last token), given both sharding schemes: the shard planner's job. TP 1 on both sides is one
// write per page per layer plus one metadata write; other schemes are Unimplemented until the
// planner lands.
Result<uint64_t> ExpectedWrites(const ShardScheme& prefill, const ShardScheme& decode,
                                uint32_t num_layers, uint32_t num_pages);

// Decode pages a prompt of `num_prefill_tokens` tokens occupies on the wire.
inline uint32_t PagesForTokens(uint32_t num_prefill_tokens, uint32_t page_size) {
  return (num_prefill_tokens + page_size - 1) / page_size;
}

}  // namespace pd::messenger
