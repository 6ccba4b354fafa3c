// The prefill messenger's --kv-checksum (kv_checksum.h): each layer's CRC32C extended as the
// layer's pages are posted, and the checksum record written after the last layer's KV writes.
#include <cstring>

#include "messenger/prefill_side_impl.h"

namespace pd::messenger {

Status PrefillMessenger::Impl::InitChecksums() {
  const uint64_t record = ChecksumBytes(static_cast<uint32_t>(num_layers_));
  ASSIGN_OR_RETURN(crc_staging_, transfer::HostBuffer::Allocate(
                                     static_cast<size_t>(options_.max_transfers) * record));
  ASSIGN_OR_RETURN(crc_mr_, domain_->RegisterMemory(crc_staging_.data(), crc_staging_.size(),
                                                    transfer::RegionAccess::kLocalSource));
  for (int r = 0; r < runner_.num_ranks(); ++r) {
    src_kv_.push_back({reinterpret_cast<const uint8_t*>(kv_mrs_[static_cast<size_t>(r)].data),
                       static_cast<uint64_t>(runner_.rank_region(r).num_pages())});
  }
  return OkStatus();
}

// Pages [w.first_page, w.end_page) of `layer`, just posted: their bytes are final (the writes
// only read them), and each layer's pages come in order, chunk after chunk.
void PrefillMessenger::Impl::ChecksumLayer(Transfer* t, const LayerWork& w, int layer) {
  if (t->layer_crcs.empty()) t->layer_crcs.assign(static_cast<size_t>(num_layers_), 0);
  t->layer_crcs[static_cast<size_t>(layer)] =
      ExtendLayerChecksum(t->layer_crcs[static_cast<size_t>(layer)], t->plan, KvSide::kSource,
                          src_kv_, layer, t->src_pages, w.first_page, w.end_page);
}

// One more write carrying the transfer imm (the decode side counts it with the KV writes), into
// the bytes after the decode side's metadata slot.
void PrefillMessenger::Impl::PostChecksums(Transfer* t) {
  if (t->checksums_posted || !t->error.ok()) return;
  t->checksums_posted = true;
  if (t->layer_crcs.empty()) t->layer_crcs.assign(static_cast<size_t>(num_layers_), 0);
  Track(t, SubmitChecksums(t), t->imm, ChecksumBytes(static_cast<uint32_t>(num_layers_)), 1);
}

// The checksum record (naming t->imm: a Reroute re-posts it under the new imm) into the decode
// side's slot, on NIC 0 (where the metadata region is registered), counted with the KV writes.
Result<uint64_t> PrefillMessenger::Impl::SubmitChecksums(Transfer* t) {
  const uint64_t record = ChecksumBytes(static_cast<uint32_t>(num_layers_));
  const uint64_t offset = record * static_cast<uint64_t>(t->meta_slot);
  EncodeChecksums(t->imm, t->layer_crcs, crc_staging_.data() + offset);
  transfer::WriteRequest req;
  req.src = crc_mr_;
  req.src_offset = offset;
  req.length = record;
  req.dst = t->meta;
  req.dst_offset = t->meta_offset + meta_bytes_;
  req.imm = t->imm;
  auto slot = std::make_shared<transfer::TransferId>(0);
  ASSIGN_OR_RETURN(transfer::TransferId id,
                   domain_->SubmitWrite(req, WriteDone(t->request_id, 0, slot)));
  *slot = id;
  return InflightKey(0, id);
}

}  // namespace pd::messenger
