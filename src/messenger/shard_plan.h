// Shard plans: which bytes of which source (prefill) rank's page go to which bytes of which
// destination (decode) rank's page, for any pairing of tensor-parallel schemes
// (docs/architecture.md, "Sharded KV transfers"). A pure function of the two schemes, the page
// format and a seed.
//
// Which KV heads a rank holds is the engine's rule, engine::RankKvHeads (engine/kv_heads.h):
//   t <= H: heads [r*H/t, (r+1)*H/t)            (H % t == 0)
//   t >  H: head r / (t/H)                       (t % H == 0): t/H replicas of every head
// and, for a replicated (MLA-like latent) cache, every rank holds all H heads: t replicas.
// A rank's page holds only its heads (KvCacheSpec with num_kv_heads = its heads):
//   HND page (rank_heads, 2, page_size, head_dim): a head range is one contiguous run
//   NHD page (page_size, rank_heads, 2, head_dim): a head range is one run per token, merged into
//                                                  one run when it spans the page on both sides
//
// A latent (MLA) cache: every rank holds the one latent "head" whole, so every rank is a replica
// and a destination rank d is served by source rank perm[d % Ts]: each request spreads its writes
// over min(Ts, Td) source ranks (all of them when Td >= Ts), and over many requests (seeds) each
// source rank serves each destination rank equally often.
//
// Replicas: replica k of a scheme is the set of ranks that together hold every head once: the
// k-th holder, in rank order, of each head (t > H: ranks {h*(t/H) + k}; replicated: rank k;
// otherwise the whole instance). Each destination replica j is served by source replica
// perm[j % Rs], perm a seeded shuffle of the Rs source replicas, so with Rd >= Rs every source NIC
// is used and otherwise the seed (say, the request id) spreads requests over them. Every
// destination byte is written exactly once.
//
// Issuing: every PageRun applies identically to every (layer, page) block. For a transfer of pages
// src_pages[k] -> dst_pages[k] over L layers, a run is one transfer::PagedWriteRequest whose
// block lists are {l*src_num_pages + src_pages[k]} and {l*dst_num_pages + dst_pages[k]} with
//   bytes_per_page = run.bytes, src_offset = run.src_offset, src_stride = plan.src_page_bytes,
//   dst_offset = run.dst_offset, dst_stride = plan.dst_page_bytes
// (regions are (num_layers, num_pages, page_bytes)). One run costs one write per (layer, page).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/kv_cache.h"
#include "engine/kv_heads.h"
#include "messenger/wire.h"

namespace pd::messenger {

// One side's sharding.
struct ShardSpec {
  int tp_size = 1;
  int num_kv_heads = 1;     // the model's KV heads (all ranks together)
  bool replicated = false;  // every rank holds every head (MLA latent cache)
};

ShardSpec ToShardSpec(const ShardScheme& scheme);

// The page format both sides share (the handshake enforces it).
struct PageFormat {
  int head_dim = 0;
  int page_size = 0;
  engine::KvLayout layout = engine::KvLayout::kHND;
  int elem_bytes = 0;  // 4 for f32, 2 for bf16, 1 for fp8_e4m3
  // An MLA latent cache: a page is (page_size, head_dim) with head_dim = latent_dim, no K/V pair
  // and no layout; both schemes must be replicated with one "head", so each destination rank's
  // page is one run written whole from one source rank.
  bool latent = false;
};

// Checks a scheme on its own; InvalidArgument naming the field and value otherwise.
Status ValidateShardSpec(const ShardSpec& spec, const char* side);
// The global KV heads [begin, end) rank `rank` holds: engine::RankKvHeads, or all of them when
// replicated.
using HeadRange = engine::KvHeadRange;
HeadRange RankHeads(const ShardSpec& spec, int rank);
int NumReplicas(const ShardSpec& spec);
int ReplicaOf(const ShardSpec& spec, int rank);

// Bytes of [src_offset, src_offset + bytes) in a source page block land at dst_offset in the
// destination page block.
struct PageRun {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
  bool operator==(const PageRun&) const = default;
};

// What one source rank sends one destination rank: heads [head_begin, head_end).
struct ShardSlice {
  int src_rank = 0;
  int dst_rank = 0;
  int head_begin = 0;
  int head_end = 0;
  std::vector<PageRun> runs;  // per (layer, page) block, in source order
  bool operator==(const ShardSlice&) const = default;
};

struct ShardPlan {
  ShardSpec prefill;
  ShardSpec decode;
  PageFormat format;
  uint64_t src_page_bytes = 0;                  // one prefill rank's page block
  uint64_t dst_page_bytes = 0;                  // one decode rank's page block
  std::vector<int> src_replica_of_dst_replica;  // [decode replica] -> prefill replica
  std::vector<ShardSlice> slices;               // ordered by (dst_rank, head_begin)
  size_t num_runs() const;
};

Result<ShardPlan> ComputeShardPlan(const ShardSpec& prefill, const ShardSpec& decode,
                                   const PageFormat& format, uint64_t seed);

// What a transfer of num_pages pages over num_layers layers costs when issued run by run.
struct WriteCounts {
  uint64_t total_writes = 0;                  // the decode side expects this many
  std::vector<uint64_t> writes_per_dst_rank;  // [decode rank]
  std::vector<uint64_t> writes_per_src_rank;  // [prefill rank]
  std::vector<uint64_t> bytes_per_src_rank;   // [prefill rank]
  std::vector<uint64_t> bytes_per_dst_rank;   // [decode rank]
};
WriteCounts ExpectedWrites(const ShardPlan& plan, uint64_t num_pages, uint64_t num_layers);

// "2 slices, 2 runs per block: r0->r0 heads [0,2) 1 run; ..." for logs and the bench.
std::string DescribeShardPlan(const ShardPlan& plan);

}  // namespace pd::messenger
