#include "messenger/kv_checksum.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "common/check.h"
#include "common/crc32c.h"

namespace pd::messenger {
namespace {

uint32_t LoadU32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

void StoreU32(uint32_t v, uint8_t* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

}  // namespace

uint32_t ExtendLayerChecksum(uint32_t crc, const ShardPlan& plan, KvSide side,
                             const std::vector<RankKv>& ranks, int layer,
                             const std::vector<int32_t>& pages, int first, int end) {
  const bool src = side == KvSide::kSource;
  const uint64_t page_bytes = src ? plan.src_page_bytes : plan.dst_page_bytes;
  for (int k = first; k < end; ++k) {
    for (const ShardSlice& slice : plan.slices) {
      const RankKv& rank = ranks.at(static_cast<size_t>(src ? slice.src_rank : slice.dst_rank));
      const uint64_t block = uint64_t(layer) * rank.num_pages + static_cast<uint64_t>(pages[k]);
      const uint8_t* base = rank.base + block * page_bytes;
      for (const PageRun& run : slice.runs) {
        crc = Crc32c(base + (src ? run.src_offset : run.dst_offset), run.bytes, crc);
      }
    }
  }
  return crc;
}

std::vector<uint32_t> LayerChecksums(const ShardPlan& plan, KvSide side,
                                     const std::vector<RankKv>& ranks, int num_layers,
                                     const std::vector<int32_t>& pages) {
  std::vector<uint32_t> crcs(static_cast<size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    crcs[l] =
        ExtendLayerChecksum(0, plan, side, ranks, l, pages, 0, static_cast<int>(pages.size()));
  }
  return crcs;
}

void EncodeChecksums(uint32_t transfer_imm, const std::vector<uint32_t>& crcs, uint8_t* out) {
  StoreU32(transfer_imm, out);
  StoreU32(static_cast<uint32_t>(crcs.size()), out + 4);
  for (size_t l = 0; l < crcs.size(); ++l) StoreU32(crcs[l], out + 8 + 4 * l);
}

Status VerifyChecksums(const uint8_t* record, uint32_t transfer_imm,
                       const std::vector<uint32_t>& computed) {
  const uint32_t imm = LoadU32(record);
  const uint32_t layers = LoadU32(record + 4);
  if (imm != transfer_imm) {
    return DataLoss("KV checksum record not written by this transfer (imm " + std::to_string(imm) +
                    ", expected " + std::to_string(transfer_imm) + ")");
  }
  if (layers != computed.size()) {
    return DataLoss("KV checksum record has " + std::to_string(layers) + " layers, expected " +
                    std::to_string(computed.size()));
  }
  std::string bad;
  int num_bad = 0;
  for (size_t l = 0; l < computed.size(); ++l) {
    const uint32_t sent = LoadU32(record + 8 + 4 * l);
    if (sent == computed[l]) continue;
    if (num_bad++ < 4) {
      bad += (bad.empty() ? "" : ", ") + std::string("layer ") + std::to_string(l) + " (sent " +
             Hex(sent) + ", landed " + Hex(computed[l]) + ")";
    }
  }
  if (num_bad == 0) return OkStatus();
  return DataLoss("KV checksum mismatch in " + std::to_string(num_bad) + " of " +
                  std::to_string(computed.size()) + " layers: " + bad);
}

}  // namespace pd::messenger
