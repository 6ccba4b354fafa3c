#include "messenger/shard_writes.h"

namespace pd::messenger {

void SetRunGeometry(const ShardPlan& plan, const PageRun& run, const RunGeometry& g,
                    transfer::PagedWriteRequest* req) {
  const uint64_t layer = static_cast<uint64_t>(g.layer);
  req->bytes_per_page = run.bytes;
  req->src_stride = plan.src_page_bytes;
  req->dst_stride = plan.dst_page_bytes;
  req->src_offset = g.src_base + layer * g.src_num_pages * plan.src_page_bytes + run.src_offset;
  req->dst_offset = g.dst_base + layer * g.dst_num_pages * plan.dst_page_bytes + run.dst_offset;
}

}  // namespace pd::messenger
