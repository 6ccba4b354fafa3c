#include "messenger/shard_plan.h"
#include "messenger/shard_plan_test_util.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>

namespace pd::messenger {
namespace {

using engine::KvLayout;
using testing::Expected;
using testing::ForEachPageByte;
using testing::RankSpec;

// ---- simulation: apply a plan to byte arrays laid out as the engine stores them ---------------

struct SimResult {
  uint64_t writes = 0;
  std::vector<uint64_t> writes_per_dst;
  std::vector<uint64_t> bytes_per_src;
};

// Moves src_pages[k] -> dst_pages[k] for every layer by applying every run, then checks every
// destination byte: written exactly once with the right value inside transferred pages, never
// written elsewhere.
SimResult Simulate(const ShardPlan& plan, int layers, int src_num_pages, int dst_num_pages,
                   const std::vector<int>& src_pages, const std::vector<int>& dst_pages) {
  const PageFormat& f = plan.format;
  const uint64_t spb = plan.src_page_bytes, dpb = plan.dst_page_bytes;
  std::vector<std::vector<uint8_t>> src(static_cast<size_t>(plan.prefill.tp_size));
  for (int s = 0; s < plan.prefill.tp_size; ++s) {
    engine::KvCacheSpec spec = RankSpec(plan.prefill, s, f, layers);
    EXPECT_EQ(spec.page_bytes(), spb);
    src[s].assign(spb * layers * src_num_pages, 0);
    for (int l = 0; l < layers; ++l)
      for (int p = 0; p < src_num_pages; ++p) {
        uint8_t* block = src[s].data() + (static_cast<uint64_t>(l) * src_num_pages + p) * spb;
        ForEachPageByte(spec, RankHeads(plan.prefill, s).begin,
                        [&](size_t off, int t, int h, int kv, int d, int b) {
                          block[off] = Expected(l, p, t, h, kv, d, b);
                        });
      }
  }
  const size_t ndst = static_cast<size_t>(plan.decode.tp_size);
  std::vector<std::vector<uint8_t>> dst(ndst), count(ndst);
  for (size_t d = 0; d < ndst; ++d) {
    dst[d].assign(dpb * layers * dst_num_pages, 0);
    count[d].assign(dst[d].size(), 0);
  }
  SimResult r;
  r.writes_per_dst.assign(ndst, 0);
  r.bytes_per_src.assign(src.size(), 0);
  for (const ShardSlice& slice : plan.slices) {
    for (const PageRun& run : slice.runs) {
      EXPECT_LE(run.src_offset + run.bytes, spb);
      EXPECT_LE(run.dst_offset + run.bytes, dpb);
      if (run.src_offset + run.bytes > spb || run.dst_offset + run.bytes > dpb) continue;
      for (int l = 0; l < layers; ++l)
        for (size_t k = 0; k < src_pages.size(); ++k) {
          uint64_t so = (static_cast<uint64_t>(l) * src_num_pages + src_pages[k]) * spb;
          uint64_t dof = (static_cast<uint64_t>(l) * dst_num_pages + dst_pages[k]) * dpb;
          for (uint64_t i = 0; i < run.bytes; ++i) {
            dst[slice.dst_rank][dof + run.dst_offset + i] =
                src[slice.src_rank][so + run.src_offset + i];
            ++count[slice.dst_rank][dof + run.dst_offset + i];
          }
          ++r.writes;
          ++r.writes_per_dst[slice.dst_rank];
          r.bytes_per_src[slice.src_rank] += run.bytes;
        }
    }
  }
  std::vector<int> src_of_dst(static_cast<size_t>(dst_num_pages), -1);
  for (size_t k = 0; k < dst_pages.size(); ++k) src_of_dst[dst_pages[k]] = src_pages[k];
  for (size_t d = 0; d < ndst; ++d) {
    engine::KvCacheSpec spec = RankSpec(plan.decode, static_cast<int>(d), f, layers);
    EXPECT_EQ(spec.page_bytes(), dpb);
    int bad = 0;
    for (int l = 0; l < layers; ++l)
      for (int p = 0; p < dst_num_pages; ++p) {
        uint64_t base = (static_cast<uint64_t>(l) * dst_num_pages + p) * dpb;
        int sp = src_of_dst[p];
        ForEachPageByte(
            spec, RankHeads(plan.decode, static_cast<int>(d)).begin,
            [&](size_t off, int t, int h, int kv, int dd, int b) {
              uint8_t want_count = sp < 0 ? 0 : 1;
              bool ok = count[d][base + off] == want_count &&
                        (sp < 0 || dst[d][base + off] == Expected(l, sp, t, h, kv, dd, b));
              if (!ok && ++bad <= 3) {
                ADD_FAILURE() << "dst rank " << d << " layer " << l << " page " << p << " token "
                              << t << " head " << h << " kv " << kv << " dim " << dd << " byte "
                              << b << ": written " << int(count[d][base + off]) << " times";
              }
            });
      }
  }
  return r;
}

// ---- property test -----------------------------------------------------------------------------

TEST(ShardPlanTest, RandomSchemesWriteEveryDestinationByteExactlyOnce) {
  std::mt19937 rng(20240611);
  const int tps[] = {1, 2, 4, 8}, heads[] = {1, 2, 4, 8}, page_sizes[] = {1, 3, 16},
            head_dims[] = {4, 40}, elems[] = {2, 4};
  auto pick = [&](const auto& options) {
    return options[rng() % (sizeof(options) / sizeof(options[0]))];
  };
  for (int iter = 0; iter < 300; ++iter) {
    const int h = pick(heads);
    ShardSpec prefill{pick(tps), h, rng() % 5 == 0};
    ShardSpec decode{pick(tps), h, rng() % 5 == 0};
    PageFormat f{pick(head_dims), pick(page_sizes), rng() % 2 ? KvLayout::kHND : KvLayout::kNHD,
                 pick(elems)};
    const uint64_t seed = rng();
    SCOPED_TRACE(::testing::Message()
                 << "iter " << iter << " prefill tp " << prefill.tp_size
                 << (prefill.replicated ? "R" : "") << " decode tp " << decode.tp_size
                 << (decode.replicated ? "R" : "") << " heads " << h << " head_dim " << f.head_dim
                 << " page " << f.page_size << " " << engine::KvLayoutName(f.layout) << " elem "
                 << f.elem_bytes << " seed " << seed);
    Result<ShardPlan> plan = ComputeShardPlan(prefill, decode, f, seed);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const int layers = 2, src_num_pages = 4, dst_num_pages = 5;
    const std::vector<int> src_pages = {2, 0, 3}, dst_pages = {4, 1, 2};
    SimResult sim = Simulate(*plan, layers, src_num_pages, dst_num_pages, src_pages, dst_pages);
    if (HasFailure()) return;

    WriteCounts want = ExpectedWrites(*plan, src_pages.size(), layers);
    EXPECT_EQ(want.total_writes, sim.writes);
    EXPECT_EQ(want.writes_per_dst_rank, sim.writes_per_dst);
    EXPECT_EQ(want.bytes_per_src_rank, sim.bytes_per_src);

    // Runs per slice: HND one; NHD one per token unless the slice spans both pages.
    for (const ShardSlice& s : plan->slices) {
      const int n = s.head_end - s.head_begin;
      const bool whole =
          n == RankHeads(prefill, s.src_rank).size() && n == RankHeads(decode, s.dst_rank).size();
      const size_t runs = f.layout == KvLayout::kHND || whole ? 1 : f.page_size;
      EXPECT_EQ(s.runs.size(), runs);
    }
    // With at least as many destination replicas as source replicas, every source NIC sends.
    if (NumReplicas(decode) >= NumReplicas(prefill)) {
      for (int s = 0; s < prefill.tp_size; ++s) EXPECT_GT(want.bytes_per_src_rank[s], 0u) << s;
    }
    // Deterministic for a seed.
    Result<ShardPlan> again = ComputeShardPlan(prefill, decode, f, seed);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->slices, plan->slices);
  }
}

// ---- the cases of issue 6 ----------------------------------------------------------------------

PageFormat Format(KvLayout layout) { return PageFormat{128, 16, layout, 2}; }

TEST(ShardPlanTest, SameShardingIsRankToRankOneWritePerPageInBothLayouts) {
  for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
    Result<ShardPlan> plan = ComputeShardPlan({2, 8}, {2, 8}, Format(layout), 1);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->slices.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      const ShardSlice& s = plan->slices[r];
      EXPECT_EQ(s.src_rank, r);
      EXPECT_EQ(s.dst_rank, r);
      EXPECT_EQ(s.head_begin, 4 * r);
      EXPECT_EQ(s.head_end, 4 * r + 4);
      ASSERT_EQ(s.runs.size(), 1u);
      EXPECT_EQ(s.runs[0], (PageRun{0, 0, plan->src_page_bytes}));
    }
    WriteCounts c = ExpectedWrites(*plan, 10, 3);
    EXPECT_EQ(c.total_writes, 2u * 10 * 3);
    EXPECT_EQ(c.writes_per_dst_rank, (std::vector<uint64_t>{30, 30}));
  }
}

TEST(ShardPlanTest, PrefillMoreShardsAssemblesDecodePages) {
  // TP 2 -> 1, 8 heads of 128 bf16, 16 tokens: a decode page is 64 KiB, each prefill half 32 KiB.
  Result<ShardPlan> hnd = ComputeShardPlan({2, 8}, {1, 8}, Format(KvLayout::kHND), 1);
  ASSERT_TRUE(hnd.ok());
  EXPECT_EQ(hnd->src_page_bytes, 32768u);
  EXPECT_EQ(hnd->dst_page_bytes, 65536u);
  ASSERT_EQ(hnd->slices.size(), 2u);
  EXPECT_EQ(hnd->slices[0].runs, (std::vector<PageRun>{{0, 0, 32768}}));
  EXPECT_EQ(hnd->slices[1].runs, (std::vector<PageRun>{{0, 32768, 32768}}));
  EXPECT_EQ(hnd->slices[1].src_rank, 1);

  Result<ShardPlan> nhd = ComputeShardPlan({2, 8}, {1, 8}, Format(KvLayout::kNHD), 1);
  ASSERT_TRUE(nhd.ok());
  ASSERT_EQ(nhd->slices.size(), 2u);
  // Token t of rank 1: its 4 heads (2 KiB) go after the 4 heads of rank 0 in the decode token row.
  ASSERT_EQ(nhd->slices[1].runs.size(), 16u);
  EXPECT_EQ(nhd->slices[1].runs[3], (PageRun{3 * 2048, 3 * 4096 + 2048, 2048}));
}

TEST(ShardPlanTest, DecodeMoreShardsSplitsPrefillPages) {
  Result<ShardPlan> hnd = ComputeShardPlan({1, 8}, {2, 8}, Format(KvLayout::kHND), 1);
  ASSERT_TRUE(hnd.ok());
  ASSERT_EQ(hnd->slices.size(), 2u);
  EXPECT_EQ(hnd->slices[0].src_rank, 0);
  EXPECT_EQ(hnd->slices[1].src_rank, 0);
  EXPECT_EQ(hnd->slices[1].dst_rank, 1);
  EXPECT_EQ(hnd->slices[1].runs, (std::vector<PageRun>{{32768, 0, 32768}}));

  Result<ShardPlan> nhd = ComputeShardPlan({1, 8}, {2, 8}, Format(KvLayout::kNHD), 1);
  ASSERT_TRUE(nhd.ok());
  ASSERT_EQ(nhd->slices[1].runs.size(), 16u);
  EXPECT_EQ(nhd->slices[1].runs[2], (PageRun{2 * 4096 + 2048, 2 * 2048, 2048}));
}

TEST(ShardPlanTest, WritesPerRequestHndAgainstNhd) {
  // A 512-token request (32 pages) of a 32-layer model with 8 KV heads of 128 bf16.
  struct Case {
    int prefill_tp, decode_tp;
    uint64_t hnd_writes, nhd_writes;
  };
  const Case cases[] = {{2, 1, 2 * 32 * 32, 2 * 16 * 32 * 32},
                        {1, 2, 2 * 32 * 32, 2 * 16 * 32 * 32},
                        {2, 2, 2 * 32 * 32, 2 * 32 * 32}};
  printf("%-8s %12s %12s %14s\n", "tp", "hnd writes", "nhd writes", "bytes");
  for (const Case& c : cases) {
    Result<ShardPlan> hnd =
        ComputeShardPlan({c.prefill_tp, 8}, {c.decode_tp, 8}, Format(KvLayout::kHND), 1);
    Result<ShardPlan> nhd =
        ComputeShardPlan({c.prefill_tp, 8}, {c.decode_tp, 8}, Format(KvLayout::kNHD), 1);
    ASSERT_TRUE(hnd.ok() && nhd.ok());
    WriteCounts h = ExpectedWrites(*hnd, 32, 32), n = ExpectedWrites(*nhd, 32, 32);
    EXPECT_EQ(h.total_writes, c.hnd_writes);
    EXPECT_EQ(n.total_writes, c.nhd_writes);
    uint64_t hb = 0, nb = 0;
    for (uint64_t b : h.bytes_per_dst_rank) hb += b;
    for (uint64_t b : n.bytes_per_dst_rank) nb += b;
    EXPECT_EQ(hb, 32ull * 32 * 65536);
    EXPECT_EQ(nb, hb);
    printf("%d->%-5d %12llu %12llu %14llu\n", c.prefill_tp, c.decode_tp,
           static_cast<unsigned long long>(h.total_writes),
           static_cast<unsigned long long>(n.total_writes), static_cast<unsigned long long>(hb));
  }
}

// ---- replication -------------------------------------------------------------------------------

TEST(ShardPlanTest, ReplicaSetsGetDistinctSourceReplicasAndAllAreUsedAcrossSeeds) {
  // Prefill TP 8 over 2 heads: 4 replicas {0,4}, {1,5}, {2,6}, {3,7}. Decode TP 4: 2 replicas.
  const ShardSpec prefill{8, 2}, decode{4, 2};
  EXPECT_EQ(RankHeads(prefill, 5).begin, 1);
  EXPECT_EQ(ReplicaOf(prefill, 5), 1);
  std::set<int> used;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    Result<ShardPlan> plan = ComputeShardPlan(prefill, decode, Format(KvLayout::kHND), seed);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->src_replica_of_dst_replica.size(), 2u);
    EXPECT_NE(plan->src_replica_of_dst_replica[0], plan->src_replica_of_dst_replica[1]);
    ASSERT_EQ(plan->slices.size(), 4u);
    for (const ShardSlice& s : plan->slices) {
      // Decode rank d holds head d / 2 and is replica d % 2.
      EXPECT_EQ(s.head_begin, s.dst_rank / 2);
      EXPECT_EQ(RankHeads(prefill, s.src_rank).begin, s.head_begin);
      EXPECT_EQ(ReplicaOf(prefill, s.src_rank),
                plan->src_replica_of_dst_replica[ReplicaOf(decode, s.dst_rank)]);
      used.insert(s.src_rank);
    }
  }
  EXPECT_EQ(used.size(), 8u);
}

TEST(ShardPlanTest, MoreDestinationReplicasThanSourcesUsesEverySource) {
  Result<ShardPlan> plan = ComputeShardPlan({2, 1}, {8, 1}, Format(KvLayout::kNHD), 99);
  ASSERT_TRUE(plan.ok());
  WriteCounts c = ExpectedWrites(*plan, 4, 2);
  EXPECT_EQ(c.writes_per_src_rank, (std::vector<uint64_t>{4 * 8, 4 * 8}));
  EXPECT_EQ(c.writes_per_dst_rank, std::vector<uint64_t>(8, 8));
}

TEST(ShardPlanTest, FullReplicationSendsWholePagesFromDistinctRanks) {
  // MLA-like: every rank holds the one latent head.
  const ShardSpec prefill{4, 1, true}, decode{4, 1, true};
  Result<ShardPlan> plan = ComputeShardPlan(prefill, decode, Format(KvLayout::kNHD), 5);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->src_page_bytes, plan->dst_page_bytes);
  std::set<int> sources;
  for (const ShardSlice& s : plan->slices) {
    ASSERT_EQ(s.runs.size(), 1u);
    EXPECT_EQ(s.runs[0].bytes, plan->src_page_bytes);
    sources.insert(s.src_rank);
  }
  EXPECT_EQ(sources.size(), 4u);
  // Replicated prefill into a sharded decode: each decode rank reads its heads from one source.
  Result<ShardPlan> split = ComputeShardPlan({2, 4, true}, {4, 4}, Format(KvLayout::kHND), 5);
  ASSERT_TRUE(split.ok());
  ASSERT_EQ(split->slices.size(), 4u);
  EXPECT_EQ(split->slices[3].runs, (std::vector<PageRun>{{3 * 8192, 0, 8192}}));
}

TEST(ShardPlanTest, HeadsMapToRanksAsTheEngineShardsThem) {
  EXPECT_EQ(RankHeads({4, 8}, 3).begin, 6);
  EXPECT_EQ(RankHeads({4, 8}, 3).end, 8);
  EXPECT_EQ(RankHeads({8, 2}, 3).begin, 0);
  EXPECT_EQ(RankHeads({8, 2}, 4).begin, 1);
  EXPECT_EQ(RankHeads({2, 4, true}, 1).size(), 4);
  EXPECT_EQ(NumReplicas({8, 2}), 4);
  EXPECT_EQ(NumReplicas({2, 8}), 1);
  EXPECT_EQ(NumReplicas({3, 1, true}), 3);
  ShardSpec spec = ToShardSpec(ShardScheme{4, 8});
  EXPECT_EQ(spec.tp_size, 4);
  EXPECT_EQ(spec.num_kv_heads, 8);
  EXPECT_FALSE(spec.replicated);
  EXPECT_DEATH(RankHeads({2, 8}, 2), "rank 2 of tp 2");
}

// ---- errors ------------------------------------------------------------------------------------

void ExpectInvalid(const ShardSpec& prefill, const ShardSpec& decode, const PageFormat& f,
                   const std::string& needle) {
  Result<ShardPlan> plan = ComputeShardPlan(prefill, decode, f, 0);
  ASSERT_FALSE(plan.ok()) << needle;
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find(needle), std::string::npos) << plan.status().message();
}

TEST(ShardPlanTest, RejectsSchemesTheEngineCannotShard) {
  const PageFormat f = Format(KvLayout::kHND);
  ExpectInvalid({4, 6}, {1, 6}, f,
                "shard plan: prefill: tensor-parallel size 4 does not divide the 6 KV heads");
  ExpectInvalid({1, 3}, {4, 3}, f, "shard plan: decode: tensor-parallel size 4 exceeds the 3 KV");
  ExpectInvalid({2, 8}, {2, 4}, f, "prefill has 8 KV heads but decode has 4");
  ExpectInvalid({0, 8}, {1, 8}, f, "prefill tp_size must be in [1, 64], got 0");
  ExpectInvalid({1, 8}, {65, 8}, f, "decode tp_size must be in [1, 64], got 65");
  ExpectInvalid({1, 0}, {1, 0}, f, "prefill num_kv_heads must be in [1, 4096], got 0");
  // Replicated schemes need no divisibility.
  EXPECT_TRUE(ComputeShardPlan({3, 2, true}, {3, 2, true}, f, 0).ok());
}

TEST(ShardPlanTest, RejectsBadPageFormats) {
  ExpectInvalid({1, 2}, {1, 2}, {0, 16, KvLayout::kHND, 2},
                "head_dim must be in [1, 65536], got 0");
  ExpectInvalid({1, 2}, {1, 2}, {64, 0, KvLayout::kHND, 2},
                "page_size must be in [1, 65536], got 0");
  ExpectInvalid({1, 2}, {1, 2}, {64, 16, KvLayout::kHND, 3},
                "elem_bytes must be 1, 2, 4 or 8, got 3");
  ExpectInvalid({1, 2}, {1, 2}, {64, 16, static_cast<KvLayout>(7), 2}, "unknown KV layout 7");
}

TEST(ShardPlanTest, DescribeNamesEverySlice) {
  Result<ShardPlan> plan = ComputeShardPlan({2, 8}, {1, 8}, Format(KvLayout::kNHD), 1);
  ASSERT_TRUE(plan.ok());
  std::string text = DescribeShardPlan(*plan);
  EXPECT_NE(text.find("prefill tp 2 -> decode tp 1, 8 KV heads, nhd: 2 slices, 32 runs"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("r1->r0 heads [4,8) 16 run(s)"), std::string::npos) << text;
}

}  // namespace
}  // namespace pd::messenger
