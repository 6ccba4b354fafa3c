// --kv-checksum: one CRC32C per layer of the KV a transfer moves, computed by the prefill side over
// the bytes it writes and checked by the decode side over the bytes that landed, before the request
// is marked ready. A mismatch fails the attempt (DataLoss; retried like any failed attempt).
//
// Both sides walk the same bytes in the same order. For layer l: for each page k of the transfer
// in order, each slice of the shard plan in order, each run of the slice: run.bytes bytes of block
// (l, page) of the slice's rank. The prefill side reads src_rank's src_pages[k] at run.src_offset,
// the decode side dst_rank's dst_pages[k] at run.dst_offset. The prefill side extends a layer's
// CRC chunk by chunk as it posts the layer's writes (pages arrive in order).
//
// The checksums travel as one more write of the transfer, posted after the last layer's KV writes:
// it carries the transfer imm and is counted with the KV writes (ExpectedWrites adds it), so the
// decode side's counter fires only once the KV and its checksums have all landed, and the check
// needs no new wait. Its bytes, ChecksumBytes(num_layers) of them right after the decode side's
// metadata slot (PrefillRequest::metadata_offset + metadata_bytes), are little-endian:
//   u32 transfer_imm | u32 num_layers | u32 crc[num_layers]
// The imm ties them to the attempt: what a slot held before never passes.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "messenger/shard_plan.h"

namespace pd::messenger {

// One rank's KV region, (num_layers, num_pages, page_bytes) with the plan's page bytes of its side.
struct RankKv {
  const uint8_t* base = nullptr;
  uint64_t num_pages = 0;  // pages in one layer
};

enum class KvSide { kSource, kDestination };

// `crc` extended with layer `layer` of pages [first, end) of `pages` (the source or the
// destination page ids) on `side`, over `ranks` (indexed by that side's rank).
uint32_t ExtendLayerChecksum(uint32_t crc, const ShardPlan& plan, KvSide side,
                             const std::vector<RankKv>& ranks, int layer,
                             const std::vector<int32_t>& pages, int first, int end);

// Every layer's checksum of `pages` on `side` (what the decode side computes once all landed).
std::vector<uint32_t> LayerChecksums(const ShardPlan& plan, KvSide side,
                                     const std::vector<RankKv>& ranks, int num_layers,
                                     const std::vector<int32_t>& pages);

inline uint64_t ChecksumBytes(uint32_t num_layers) { return 8 + 4 * uint64_t{num_layers}; }

// Writes the checksum record (ChecksumBytes(crcs.size()) bytes) to `out`.
void EncodeChecksums(uint32_t transfer_imm, const std::vector<uint32_t>& crcs, uint8_t* out);

// OK when the record at `record` was written for `transfer_imm` and holds `computed`; else
// DataLoss saying what differs (the record's imm or layer count, or which layers' CRCs).
Status VerifyChecksums(const uint8_t* record, uint32_t transfer_imm,
                       const std::vector<uint32_t>& computed);

}  // namespace pd::messenger
