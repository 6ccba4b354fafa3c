// The decode messenger's --kv-checksum check (kv_checksum.h): once an attempt's KV counter fired,
// every layer's CRC32C over the pages that landed against the record the prefill instance wrote
// after its metadata slot.
#include "messenger/decode_side_impl.h"

namespace pd::messenger {

Status DecodeMessenger::Impl::CheckKvChecksums(const Req& r) const {
  ASSIGN_OR_RETURN(ShardPlan plan,
                   PlanTransfer(peers_[r.peer].scheme, scheme_, format_, r.wire_id));
  std::vector<RankKv> ranks;
  const std::vector<const transfer::MemoryRegion*> mrs = TargetRegions(r);
  for (size_t k = 0; k < mrs.size(); ++k) {
    ranks.push_back({reinterpret_cast<const uint8_t*>(mrs[k]->data),
                     static_cast<uint64_t>(runner_.rank_region(TargetRank(r, k)).num_pages())});
  }
  const uint32_t num_pages =
      PagesForTokens(static_cast<uint32_t>(r.info->prefill_tokens.size()), spec_.page_size);
  // The pages written: those from first_page (the ones before were in our prefix cache).
  const std::vector<int32_t> all = TargetPages(r, num_pages);
  const std::vector<int32_t> pages(all.begin() + r.first_page, all.end());
  const std::vector<uint32_t> crcs = LayerChecksums(plan, KvSide::kDestination, ranks,
                                                    static_cast<int>(format_.num_layers), pages);
  return VerifyChecksums(meta_buffer_.data() + slot_bytes_ * r.meta_slot + meta_bytes_, r.imm,
                         crcs);
}

}  // namespace pd::messenger
