#include "messenger/shard_plan.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace pd::messenger {
namespace {

constexpr int kMaxKvHeads = 4096;
constexpr int kMaxPageDim = 1 << 16;  // page_size and head_dim bound: page bytes stay far from
                                      // overflowing uint64

// splitmix64: a portable generator, so both sides and every build derive the same plan.
uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Fisher-Yates shuffle of [0, n) from `seed`.
std::vector<int> SeededPermutation(int n, uint64_t seed) {
  std::vector<int> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  uint64_t state = seed;
  for (int i = n - 1; i > 0; --i) {
    int j = static_cast<int>(SplitMix(state) % static_cast<uint64_t>(i + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

bool Holds(const ShardSpec& spec, int rank, int head) {
  const HeadRange held = RankHeads(spec, rank);
  return held.begin <= head && head < held.end;
}

// The rank of replica `replica` that holds head `head`: the replica-th holder of the head.
int RankOfReplica(const ShardSpec& spec, int replica, int head) {
  int k = 0;
  for (int r = 0; r < spec.tp_size; ++r) {
    if (Holds(spec, r, head) && k++ == replica) return r;
  }
  PD_CHECK(false) << "replica " << replica << " holds no head " << head;
  return -1;
}

Status ValidateFormat(const PageFormat& f) {
  if (f.head_dim <= 0 || f.head_dim > kMaxPageDim) {
    return InvalidArgument(
        fmt::format("shard plan: head_dim must be in [1, {}], got {}", kMaxPageDim, f.head_dim));
  }
  if (f.page_size <= 0 || f.page_size > kMaxPageDim) {
    return InvalidArgument(
        fmt::format("shard plan: page_size must be in [1, {}], got {}", kMaxPageDim, f.page_size));
  }
  if (f.elem_bytes != 1 && f.elem_bytes != 2 && f.elem_bytes != 4 && f.elem_bytes != 8) {
    return InvalidArgument(
        fmt::format("shard plan: elem_bytes must be 1, 2, 4 or 8, got {}", f.elem_bytes));
  }
  if (f.layout != engine::KvLayout::kHND && f.layout != engine::KvLayout::kNHD) {
    return InvalidArgument(
        fmt::format("shard plan: unknown KV layout {}", static_cast<int>(f.layout)));
  }
  return OkStatus();
}

// The runs moving heads [h0, h1) from a source page whose rank holds `src` to a destination page
// whose rank holds `dst`. unit = one head's K and V of one token.
std::vector<PageRun> MakeRuns(const PageFormat& f, HeadRange src, HeadRange dst, int h0, int h1) {
  if (f.latent) {  // (page_size, latent_dim): the whole page
    return {PageRun{0, 0, static_cast<uint64_t>(f.page_size) * f.head_dim * f.elem_bytes}};
  }
  const uint64_t unit = 2ull * static_cast<uint64_t>(f.head_dim) * f.elem_bytes;
  const uint64_t n = static_cast<uint64_t>(h1 - h0);
  const uint64_t src_head = static_cast<uint64_t>(h0 - src.begin);
  const uint64_t dst_head = static_cast<uint64_t>(h0 - dst.begin);
  const uint64_t tokens = static_cast<uint64_t>(f.page_size);
  if (f.layout == engine::KvLayout::kHND) {
    // (rank_heads, 2, page_size, head_dim): heads are the outermost dimension.
    return {PageRun{src_head * tokens * unit, dst_head * tokens * unit, n * tokens * unit}};
  }
  // (page_size, rank_heads, 2, head_dim): one run per token, merged while contiguous.
  std::vector<PageRun> runs;
  for (uint64_t t = 0; t < tokens; ++t) {
    PageRun run{(t * static_cast<uint64_t>(src.size()) + src_head) * unit,
                (t * static_cast<uint64_t>(dst.size()) + dst_head) * unit, n * unit};
    if (!runs.empty() && runs.back().src_offset + runs.back().bytes == run.src_offset &&
        runs.back().dst_offset + runs.back().bytes == run.dst_offset) {
      runs.back().bytes += run.bytes;
    } else {
      runs.push_back(run);
    }
  }
  return runs;
}

}  // namespace

ShardSpec ToShardSpec(const ShardScheme& scheme) {
  return ShardSpec{scheme.tp_size, scheme.num_kv_heads, scheme.replicated};
}

Status ValidateShardSpec(const ShardSpec& spec, const char* side) {
  if (spec.tp_size < 1 || spec.tp_size > static_cast<int>(kMaxRanks)) {
    return InvalidArgument(fmt::format("shard plan: {} tp_size must be in [1, {}], got {}", side,
                                       kMaxRanks, spec.tp_size));
  }
  if (spec.num_kv_heads < 1 || spec.num_kv_heads > kMaxKvHeads) {
    return InvalidArgument(fmt::format("shard plan: {} num_kv_heads must be in [1, {}], got {}",
                                       side, kMaxKvHeads, spec.num_kv_heads));
  }
  if (spec.replicated) return OkStatus();
  return engine::ValidateKvHeadSplit(spec.num_kv_heads, spec.tp_size)
      .WithContext(fmt::format("shard plan: {}", side));
}

HeadRange RankHeads(const ShardSpec& spec, int rank) {
  PD_CHECK(rank >= 0 && rank < spec.tp_size) << "rank " << rank << " of tp " << spec.tp_size;
  if (spec.replicated) return {0, spec.num_kv_heads};
  return engine::RankKvHeads(spec.num_kv_heads, spec.tp_size, rank);
}

// Every head is held by the same number of ranks: the replicas.
int NumReplicas(const ShardSpec& spec) {
  return spec.tp_size * RankHeads(spec, 0).size() / spec.num_kv_heads;
}

// The rank's position among the holders of its first head.
int ReplicaOf(const ShardSpec& spec, int rank) {
  const int head = RankHeads(spec, rank).begin;
  int k = 0;
  for (int r = 0; r < rank; ++r) k += Holds(spec, r, head) ? 1 : 0;
  return k;
}

size_t ShardPlan::num_runs() const {
  size_t n = 0;
  for (const ShardSlice& s : slices) n += s.runs.size();
  return n;
}

Result<ShardPlan> ComputeShardPlan(const ShardSpec& prefill, const ShardSpec& decode,
                                   const PageFormat& format, uint64_t seed) {
  RETURN_IF_ERROR(ValidateShardSpec(prefill, "prefill"));
  RETURN_IF_ERROR(ValidateShardSpec(decode, "decode"));
  RETURN_IF_ERROR(ValidateFormat(format));
  if (prefill.num_kv_heads != decode.num_kv_heads) {
    return InvalidArgument(
        fmt::format("shard plan: prefill has {} KV heads but decode has {} (different models?)",
                    prefill.num_kv_heads, decode.num_kv_heads));
  }
  if (format.latent && !(prefill.replicated && decode.replicated && prefill.num_kv_heads == 1)) {
    return InvalidArgument(fmt::format(
        "shard plan: a latent (MLA) cache must be replicated with 1 KV head on both sides, got "
        "prefill {} heads{}, decode {}",
        prefill.num_kv_heads, prefill.replicated ? " replicated" : "",
        decode.replicated ? "replicated" : "sharded"));
  }
  ShardPlan plan;
  plan.prefill = prefill;
  plan.decode = decode;
  plan.format = format;
  const uint64_t head_page_bytes = (format.latent ? 1ull : 2ull) *
                                   static_cast<uint64_t>(format.head_dim) * format.elem_bytes *
                                   format.page_size;
  plan.src_page_bytes = head_page_bytes * static_cast<uint64_t>(RankHeads(prefill, 0).size());
  plan.dst_page_bytes = head_page_bytes * static_cast<uint64_t>(RankHeads(decode, 0).size());

  const int src_replicas = NumReplicas(prefill);
  const std::vector<int> perm = SeededPermutation(src_replicas, seed);
  for (int j = 0; j < NumReplicas(decode); ++j) {
    plan.src_replica_of_dst_replica.push_back(perm[static_cast<size_t>(j % src_replicas)]);
  }
  for (int d = 0; d < decode.tp_size; ++d) {
    const HeadRange dst = RankHeads(decode, d);
    const int src_replica =
        plan.src_replica_of_dst_replica[static_cast<size_t>(ReplicaOf(decode, d))];
    for (int h = dst.begin; h < dst.end;) {
      const int s = RankOfReplica(prefill, src_replica, h);
      const HeadRange src = RankHeads(prefill, s);
      PD_CHECK(src.begin <= h && h < src.end) << "rank " << s << " does not hold head " << h;
      const int end = std::min(dst.end, src.end);
      plan.slices.push_back(ShardSlice{s, d, h, end, MakeRuns(format, src, dst, h, end)});
      h = end;
    }
  }
  return plan;
}

WriteCounts ExpectedWrites(const ShardPlan& plan, uint64_t num_pages, uint64_t num_layers) {
  WriteCounts c;
  c.writes_per_dst_rank.assign(static_cast<size_t>(plan.decode.tp_size), 0);
  c.bytes_per_dst_rank.assign(static_cast<size_t>(plan.decode.tp_size), 0);
  c.writes_per_src_rank.assign(static_cast<size_t>(plan.prefill.tp_size), 0);
  c.bytes_per_src_rank.assign(static_cast<size_t>(plan.prefill.tp_size), 0);
  const uint64_t blocks = num_pages * num_layers;
  for (const ShardSlice& s : plan.slices) {
    uint64_t bytes = 0;
    for (const PageRun& r : s.runs) bytes += r.bytes;
    const uint64_t writes = s.runs.size() * blocks;
    c.total_writes += writes;
    c.writes_per_dst_rank[static_cast<size_t>(s.dst_rank)] += writes;
    c.writes_per_src_rank[static_cast<size_t>(s.src_rank)] += writes;
    c.bytes_per_dst_rank[static_cast<size_t>(s.dst_rank)] += bytes * blocks;
    c.bytes_per_src_rank[static_cast<size_t>(s.src_rank)] += bytes * blocks;
  }
  return c;
}

std::string DescribeShardPlan(const ShardPlan& plan) {
  std::string out = fmt::format(
      "prefill tp {}{} -> decode tp {}{}, {} KV heads, {}: {} slices, {} runs per page block",
      plan.prefill.tp_size, plan.prefill.replicated ? " (replicated)" : "", plan.decode.tp_size,
      plan.decode.replicated ? " (replicated)" : "", plan.prefill.num_kv_heads,
      engine::KvLayoutName(plan.format.layout), plan.slices.size(), plan.num_runs());
  for (const ShardSlice& s : plan.slices) {
    out += fmt::format("; r{}->r{} heads [{},{}) {} run(s)", s.src_rank, s.dst_rank, s.head_begin,
                       s.head_end, s.runs.size());
  }
  return out;
}

}  // namespace pd::messenger
