// The prefill messenger's draft KV region (PrefillMessengerOptions::draft_kv): a request's decode
// descriptors of the drafter's region, and the writes of its pages' draft KV. The target's KV goes
// layer by layer as the runner computes it; the drafter computes a chunk's KV after the target's
// step over it (engine/spec_draft_model.h, CatchUp), so its KV is whole once the engine's final
// output for the request has come: every layer of it is posted then (after the target's last
// layer, before the metadata), under the transfer's imm and into the destination page ids of the
// target's. Impl's definition in prefill_side_impl.h.
#include <string>
#include <utility>
#include <vector>

#include "messenger/prefill_side_impl.h"

namespace pd::messenger {

Status PrefillMessenger::Impl::AdmitDraft(const PrefillRequest& r, const DecodePeer& peer,
                                          Transfer* t) {
  const std::string id = "request " + std::to_string(r.request_id);
  if (!has_draft_kv()) {
    if (!r.draft_rank_regions.empty())
      return InvalidArgument(id + ": draft_rank_regions given, but this instance has no draft KV");
    return OkStatus();
  }
  if (r.draft_rank_regions.size() != r.rank_regions.size()) {
    return InvalidArgument(id + ": draft_rank_regions has " +
                           std::to_string(r.draft_rank_regions.size()) + " descriptors for " +
                           std::to_string(r.rank_regions.size()) +
                           " decode ranks (both sides keep a draft KV region)");
  }
  ASSIGN_OR_RETURN(t->draft_plan,
                   PlanDraftTransfer(scheme_, r.decode_scheme, owner_->format_, r.request_id));
  const uint64_t layer_bytes =
      t->draft_plan.dst_page_bytes * uint64_t{owner_->format_.draft_kv.num_layers};
  std::vector<transfer::MemoryDescriptor> dsts;
  RETURN_IF_ERROR(ParseRankRegions(r, r.draft_rank_regions, layer_bytes, &dsts));
  for (const transfer::MemoryDescriptor& d : dsts) {
    if (d.fabric_addr != t->dst[0].descriptor.fabric_addr)
      return InvalidArgument(id + ": the draft KV regions belong to another instance");
  }
  t->draft_dst_num_pages = dsts[0].length / layer_bytes;
  for (size_t k = 0; k < r.dst_pages.size(); ++k) {
    if (static_cast<uint64_t>(r.dst_pages[k]) >= t->draft_dst_num_pages) {
      return OutOfRange(id + ": dst_pages[" + std::to_string(k) + "] = " +
                        std::to_string(r.dst_pages[k]) + " is outside the decode draft region's " +
                        std::to_string(t->draft_dst_num_pages) + " pages");
    }
  }
  std::vector<transfer::RemoteRegion> nic0;
  for (const transfer::MemoryDescriptor& d : dsts) nic0.push_back({d, t->peer.fi_addr});
  return ParseNicRegions(r, r.draft_nic_regions, peer, nic0, &t->draft_nic_dst);
}

void PrefillMessenger::Impl::PostDraftKv(Transfer* t) {
  if (!has_draft_kv() || !t->error.ok()) return;
  const int end = static_cast<int>(t->dst_pages.size());
  if (t->src_pages.size() != t->dst_pages.size()) {
    Fail(t, Internal("request " + std::to_string(t->request_id) +
                     ": no page table of the engine's for the draft KV"));
    return;
  }
  std::vector<uint32_t> src_pages, dst_pages;
  for (int k = t->first_page; k < end; ++k) {
    src_pages.push_back(static_cast<uint32_t>(t->src_pages[k]));
    dst_pages.push_back(static_cast<uint32_t>(t->dst_pages[k]));
  }
  if (src_pages.empty()) return;
  const uint32_t n = static_cast<uint32_t>(src_pages.size());
  const uint64_t src_num_pages = static_cast<uint64_t>(options_.draft_kv->region().num_pages());
  const int layers = static_cast<int>(owner_->format_.draft_kv.num_layers);
  const uint64_t id = t->request_id;
  for (int layer = 0; layer < layers; ++layer) {
    const RunGeometry g{layer, src_num_pages, t->draft_dst_num_pages, 0, 0};
    for (const ShardSlice& slice : t->draft_plan.slices) {
      for (const PageRun& run : slice.runs) {
        KvWrite kw;
        kw.src_rank = slice.src_rank;
        kw.dst_rank = slice.dst_rank;
        kw.draft = true;
        kw.shape.src_pages = src_pages;
        kw.shape.dst_pages = dst_pages;
        SetRunGeometry(t->draft_plan, run, g, &kw.shape);
        (void)PostKv(t, kw, /*count=*/true);
        t = Find(id);  // a refused post fails t, which may free it
        if (t == nullptr || !t->error.ok()) return;
        t->log.push_back(std::move(kw));
        t->kv_bytes += uint64_t{n} * run.bytes;
        owner_->metrics_.RankWrites(slice.src_rank, n);
      }
    }
  }
}

}  // namespace pd::messenger
