// Turning a shard plan into transfer::PagedWriteRequests: the geometry of one run's writes for
// one layer, so the prefill messenger and the benches issue plans the same way.
//
// Regions are (num_layers, num_pages, page_bytes) on each side (engine/kv_cache.h). For layer l, a
// run's write for page pair (src_pages[k], dst_pages[k]) moves run.bytes from
//   src rank base + (l*src_num_pages + src_pages[k])*src_page_bytes + run.src_offset
// to
//   dst rank base + (l*dst_num_pages + dst_pages[k])*dst_page_bytes + run.dst_offset.
#pragma once

#include <cstdint>

#include "messenger/shard_plan.h"
#include "transfer/domain.h"

namespace pd::messenger {

struct RunGeometry {
  int layer = 0;
  uint64_t src_num_pages = 0;  // pages in one layer of the source rank's region
  uint64_t dst_num_pages = 0;  // pages in one layer of the destination rank's region
  uint64_t src_base = 0;       // where the source rank's region starts inside the registered one
  uint64_t dst_base = 0;       // likewise for the destination rank
};

// Sets bytes_per_page, strides and offsets of `req` for `run` of `plan` in layer g.layer; the
// caller fills src, dst, the page lists and imm.
void SetRunGeometry(const ShardPlan& plan, const PageRun& run, const RunGeometry& g,
                    transfer::PagedWriteRequest* req);

}  // namespace pd::messenger
