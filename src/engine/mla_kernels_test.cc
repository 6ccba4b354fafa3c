// The MLA kernels: the absorbed reference against the expanded attention it replaces, every fast
// kernel against the reference on odd shapes (kv_lora_rank 40, rope 6, 3 heads, 7 tokens, page
// size 3, f32 and bf16 latents), the rope conventions and yarn against transformers' rules.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "engine/cpu_features.h"
#include "engine/kernels.h"
#include "engine/kernels_ref.h"
#include "engine/mla_kernels.h"
#include "engine/mla_kernels_ref.h"
#include "engine/mla_parallel.h"
#include "engine/mla_rope.h"
#include "engine/model_runner_test_util.h"
#include "engine/thread_pool.h"
#include "model/dtype.h"

namespace pd::engine::kernels {
namespace {

using pd::engine::testing::Random;

constexpr int kR = 40, kRope = 6, kL = kR + kRope, kHeads = 3, kPage = 3;

// A latent cache of num_pages pages and a batch over it: a 7-token prefill run of one sequence
// (positions 2..8) and lone decode tokens at positions 0, 40 and 150 of three others.
struct Batch {
  std::vector<uint8_t> region;
  PagedLatent kv;
  std::vector<std::vector<int32_t>> tables;
  std::vector<AttnSeq> seqs;
  std::vector<int32_t> token_seq;
  std::vector<float> q;
  int num_tokens = 0;
  int max_pos = 0;
  int heads = kHeads;
  MlaAttentionArgs Args(float* out) const {
    MlaAttentionArgs a;
    a.kv = kv;
    a.num_heads = heads;
    a.q = q.data();
    a.ldq = heads * kL + 5;
    a.out = out;
    a.ldo = heads * kR + 3;
    a.seqs = seqs.data();
    a.num_seqs = static_cast<int>(seqs.size());
    a.token_seq = token_seq.data();
    a.num_tokens = num_tokens;
    a.scale = 0.37f;
    return a;
  }
};

// dtype 0 f32, 1 bf16, 2 fp8 (latent scale 0.75).
Batch MakeBatch(int dtype, int heads = kHeads) {
  Batch b;
  b.heads = heads;
  const int num_pages = 200;
  b.kv.page_size = kPage;
  b.kv.latent_dim = kL;
  b.kv.kv_lora_rank = kR;
  b.kv.bf16 = dtype == 1;
  b.kv.fp8 = dtype == 2;
  if (b.kv.fp8) b.kv.scale = 0.75f;
  b.kv.page_bytes = kPage * kL * b.kv.elem_bytes();
  b.region.assign(static_cast<size_t>(num_pages) * b.kv.page_bytes, 0);
  b.kv.base = b.region.data();
  const std::vector<std::pair<int, int>> runs = {{2, 7}, {0, 1}, {40, 1}, {150, 1}};
  int next_page = num_pages - 1, token = 0;
  b.tables.resize(runs.size());
  for (size_t s = 0; s < runs.size(); ++s) {
    const int len = runs[s].first + runs[s].second;
    for (int p = 0; p < (len + kPage - 1) / kPage; ++p) b.tables[s].push_back(next_page--);
  }
  for (size_t s = 0; s < runs.size(); ++s) {
    const int len = runs[s].first + runs[s].second;
    b.seqs.push_back(AttnSeq{token, runs[s].second, runs[s].first, b.tables[s].data()});
    AttnSeq all{0, len, 0, b.tables[s].data()};  // fill every position's row
    const std::vector<float> rows = Random(static_cast<size_t>(len) * kL, 100 + s);
    ref::AppendLatent(b.kv, all, rows.data(), kL);
    for (int j = 0; j < runs[s].second; ++j) b.token_seq.push_back(static_cast<int32_t>(s));
    token += runs[s].second;
    b.max_pos = std::max(b.max_pos, len - 1);
  }
  b.num_tokens = token;
  b.q = Random(static_cast<size_t>(token) * (heads * kL + 5), 7);
  return b;
}

double MaxAbsDiff(const float* a, const float* b, int rows, int cols, int64_t ld) {
  double d = 0;
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < cols; ++i)
      d = std::max(d, std::fabs(double{a[r * ld + i]} - b[r * ld + i]));
  return d;
}

class MlaIsaTest : public ::testing::TestWithParam<IsaLevel> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) GTEST_SKIP() << "this CPU lacks " << IsaLevelName(GetParam());
  }
};

TEST_P(MlaIsaTest, ParallelAttentionMatchesReference) {
  const MlaIsaKernels& isa = MlaKernelsFor(GetParam());
  for (int dtype : {0, 1, 2})
    for (int threads : {1, 3}) {
      const Batch b = MakeBatch(dtype);
      const int64_t ldo = kHeads * kR + 3;
      std::vector<float> want(b.num_tokens * ldo, -7.0f), got(b.num_tokens * ldo, -7.0f);
      std::vector<float> scratch(b.max_pos + 1);
      ref::MlaAttention(b.Args(want.data()), scratch.data());
      ThreadPool pool(threads);
      MlaWorkspace ws;
      ParallelMlaAttention(pool, isa, b.Args(got.data()), &ws);
      EXPECT_LT(MaxAbsDiff(got.data(), want.data(), b.num_tokens, kHeads * kR, ldo), 2e-5)
          << isa.name << " dtype=" << dtype << " threads=" << threads;
      for (int t = 0; t < b.num_tokens; ++t)  // the row padding past H*R is never written
        for (int64_t i = kHeads * kR; i < ldo; ++i) EXPECT_EQ(got[t * ldo + i], -7.0f);
    }
}

// 9 heads: whole 4-head register tiles (whose 16 scores are reduced together) and a tail tile.
TEST_P(MlaIsaTest, WholeHeadTilesMatchReference) {
  const MlaIsaKernels& isa = MlaKernelsFor(GetParam());
  constexpr int kManyHeads = 9;
  for (int dtype : {0, 1, 2}) {
    const Batch b = MakeBatch(dtype, kManyHeads);
    const int64_t ldo = kManyHeads * kR + 3;
    std::vector<float> want(b.num_tokens * ldo, -7.0f), got(b.num_tokens * ldo, -7.0f);
    std::vector<float> scratch(b.max_pos + 1);
    ref::MlaAttention(b.Args(want.data()), scratch.data());
    ThreadPool pool(2);
    MlaWorkspace ws;
    ParallelMlaAttention(pool, isa, b.Args(got.data()), &ws);
    EXPECT_LT(MaxAbsDiff(got.data(), want.data(), b.num_tokens, kManyHeads * kR, ldo), 2e-5)
        << isa.name << " dtype=" << dtype;
  }
}

TEST_P(MlaIsaTest, ChunkKernelSplitsMergeToTheWholeRange) {
  const MlaIsaKernels& isa = MlaKernelsFor(GetParam());
  const Batch b = MakeBatch(1);
  const int token = b.num_tokens - 1;  // position 150: 151 rows
  std::vector<float> out(b.num_tokens * (kHeads * kR + 3)),
      scratch(MlaChunkScratchFloats(kHeads, kL));
  std::vector<float> buf(3 * MlaPartialFloats(kHeads, kR));
  MlaPartial parts[3];
  const int bounds[4] = {0, 33, 100, 151};  // not block aligned
  for (int p = 0; p < 3; ++p) {
    float* base = buf.data() + p * MlaPartialFloats(kHeads, kR);
    parts[p] = MlaPartial{base, base + kHeads, base + 2 * kHeads};
    isa.chunk(b.Args(out.data()), token, bounds[p], bounds[p + 1], parts[p], scratch.data());
  }
  std::vector<float> merged(kHeads * kR), want(b.num_tokens * (kHeads * kR + 3));
  MlaMergePartials(parts, 3, kHeads, kR, merged.data());
  std::vector<float> ref_scratch(b.max_pos + 1);
  ref::MlaAttention(b.Args(want.data()), ref_scratch.data());
  const float* w = want.data() + token * (kHeads * kR + 3);
  for (int i = 0; i < kHeads * kR; ++i) EXPECT_NEAR(merged[i], w[i], 2e-5) << i;
}

TEST_P(MlaIsaTest, HeadMatmulMatchesPerHeadReference) {
  const IsaKernels& isa = KernelsFor(GetParam());
  for (bool bf16 : {false, true})
    for (bool panel : {false, true}) {
      if (panel && isa.matmul_panel == nullptr) continue;  // this ISA keeps row-major weights
      const int64_t n = 40, k = 9, rows = 5, ldx = kHeads * 11 + 2, ldo = kHeads * 41 + 1;
      std::vector<float> wf = Random(kHeads * n * k, 3);
      std::vector<uint16_t> wb;
      for (float v : wf) wb.push_back(model::F32ToBf16(v));
      ThreadPool pool(3);
      std::vector<WeightMatrix> row_major(kHeads), used(kHeads);
      std::vector<std::vector<uint8_t>> packed(kHeads);
      for (int h = 0; h < kHeads; ++h) {
        WeightMatrix& w = row_major[h];
        w.bf16 = bf16;
        w.n = n;
        w.k = k;
        w.data = bf16 ? static_cast<const void*>(wb.data() + h * n * k) : wf.data() + h * n * k;
        used[h] = w;
        if (panel) {
          packed[h].resize(Panel32Bytes(n, k, bf16));
          used[h] = PackPanel32(pool, &w, 1, packed[h].data());
        }
      }
      const std::vector<float> x = Random(rows * ldx, 5);
      std::vector<float> want(rows * ldo, -7.0f), got(rows * ldo, -7.0f);
      for (int h = 0; h < kHeads; ++h)
        ref::Matmul(x.data() + h * 11, rows, ldx, row_major[h], want.data() + h * 41, ldo);
      HeadMatmulArgs a{x.data(), ldx, 11, used.data(), kHeads, got.data(), ldo, 41, rows};
      ParallelHeadMatmul(pool, isa, a);
      EXPECT_LT(MaxAbsDiff(got.data(), want.data(), rows, kHeads * 41 + 1, ldo), 1e-4)
          << isa.name << " bf16=" << bf16 << " panel=" << panel;
    }
}

INSTANTIATE_TEST_SUITE_P(Isa, MlaIsaTest,
                         ::testing::Values(IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512),
                         [](const auto& info) { return std::string(IsaLevelName(info.param)); });

// The absorbed form computes the attention of the expanded one: per head
// k[s] = [W_UK c[s] | k_rope[s]], v[s] = W_UV c[s], out = W_UV (sum p c[s]).
TEST(MlaReferenceTest, AbsorbedEqualsExpandedAttention) {
  const int dn = 5, dv = 7;
  const Batch b = MakeBatch(0);
  const std::vector<float> uk = Random(kHeads * dn * kR, 11, 0.3f);  // W_UK[h] (dn, R)
  const std::vector<float> uv = Random(kHeads * dv * kR, 12, 0.3f);  // W_UV[h] (dv, R)
  const std::vector<float> qn = Random(b.num_tokens * kHeads * (dn + kRope), 13);
  Batch absorbed = b;  // q_abs[h] = [W_UK[h]^T q_nope[h] | q_rope[h]]
  const int64_t ldq = kHeads * kL + 5, ldo = kHeads * kR + 3;
  for (int t = 0; t < b.num_tokens; ++t)
    for (int h = 0; h < kHeads; ++h) {
      const float* qh = qn.data() + (t * kHeads + h) * (dn + kRope);
      float* qa = absorbed.q.data() + t * ldq + h * kL;
      for (int r = 0; r < kR; ++r) {
        qa[r] = 0;
        for (int i = 0; i < dn; ++i) qa[r] += uk[(h * dn + i) * kR + r] * qh[i];
      }
      for (int i = 0; i < kRope; ++i) qa[kR + i] = qh[dn + i];
    }
  std::vector<float> olat(b.num_tokens * ldo), scratch(b.max_pos + 1);
  ref::MlaAttention(absorbed.Args(olat.data()), scratch.data());
  for (int t = 0; t < b.num_tokens; ++t) {
    const AttnSeq& seq = b.seqs[b.token_seq[t]];
    const int pos = seq.start_pos + (t - seq.token_begin);
    for (int h = 0; h < kHeads; ++h) {
      const float* qh = qn.data() + (t * kHeads + h) * (dn + kRope);
      std::vector<double> score(pos + 1), out(dv, 0.0);
      double mx = -1e300, sum = 0;
      for (int s = 0; s <= pos; ++s) {
        const uint8_t* row = ref::LatentRowPtr(b.kv, seq.page_table[s / kPage], s % kPage);
        double dot = 0;
        for (int i = 0; i < dn; ++i) {
          double k = 0;
          for (int r = 0; r < kR; ++r)
            k += uk[(h * dn + i) * kR + r] * ref::LoadLatent(b.kv, row, r);
          dot += qh[i] * k;
        }
        for (int i = 0; i < kRope; ++i) dot += qh[dn + i] * ref::LoadLatent(b.kv, row, kR + i);
        score[s] = dot * 0.37;
        mx = std::max(mx, score[s]);
      }
      for (int s = 0; s <= pos; ++s) sum += std::exp(score[s] - mx);
      for (int s = 0; s <= pos; ++s) {
        const uint8_t* row = ref::LatentRowPtr(b.kv, seq.page_table[s / kPage], s % kPage);
        const double p = std::exp(score[s] - mx) / sum;
        for (int i = 0; i < dv; ++i) {
          double v = 0;
          for (int r = 0; r < kR; ++r)
            v += uv[(h * dv + i) * kR + r] * ref::LoadLatent(b.kv, row, r);
          out[i] += p * v;
        }
      }
      for (int i = 0; i < dv; ++i) {
        double got = 0;  // W_UV[h] o_lat[h]
        for (int r = 0; r < kR; ++r) got += uv[(h * dv + i) * kR + r] * olat[t * ldo + h * kR + r];
        EXPECT_NEAR(got, out[i], 1e-4 * (1 + std::fabs(out[i]))) << "token " << t << " head " << h;
      }
    }
  }
}

// transformers' apply_rotary_pos_emb_interleave de-interleaves (0, 2, 4, .., 1, 3, 5, ..) and
// applies rotate_half; we rotate pairs (2i, 2i+1) in place: the same numbers, permuted alike for q
// and k.
TEST(MlaReferenceTest, InterleavedRopeIsTransformersPermuted) {
  const int d = kRope, rows = 4, heads = 2, stride = 9;
  std::vector<int32_t> pos = {0, 1, 5, 77};
  std::vector<float> cs(rows * d / 2), sn(rows * d / 2);
  ref::RopeTable(pos.data(), rows, d, 10000.0, cs.data(), sn.data());
  std::vector<float> x = Random(rows * heads * stride, 21), hf(rows * heads * d);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < d / 2; ++i) {
        hf[(r * heads + h) * d + i] = x[r * heads * stride + h * stride + 2 * i];
        hf[(r * heads + h) * d + d / 2 + i] = x[r * heads * stride + h * stride + 2 * i + 1];
      }
  ref::ApplyRope(hf.data(), rows, heads, d, heads * d, cs.data(), sn.data());
  ref::ApplyRopeStrided(x.data(), rows, heads * stride, heads, stride, d, cs.data(), sn.data(),
                        true);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < d / 2; ++i) {
        EXPECT_EQ(x[r * heads * stride + h * stride + 2 * i], hf[(r * heads + h) * d + i]);
        EXPECT_EQ(x[r * heads * stride + h * stride + 2 * i + 1],
                  hf[(r * heads + h) * d + d / 2 + i]);
      }
}

// DeepSeek-V3's rope_scaling: factor 40, original_max_position_embeddings 4096 (max 163840),
// beta 32/1, mscale = mscale_all_dim = 1, rope dim 64: correction range [10, 23].
TEST(MlaRopeTest, YarnFollowsTransformers) {
  model::ModelConfig c;
  c.max_position_embeddings = 163840;
  c.rope_theta = 10000.0;
  c.mla.kv_lora_rank = 512;
  c.mla.qk_nope_head_dim = 128;
  c.mla.qk_rope_head_dim = 64;
  c.yarn = true;
  c.yarn_scaling.factor = 40;
  c.yarn_scaling.original_max_position_embeddings = 4096;
  c.yarn_scaling.mscale = 1.0;
  c.yarn_scaling.mscale_all_dim = 1.0;
  MlaRope rope = ComputeMlaRope(c);
  ASSERT_EQ(rope.inv_freq.size(), 32u);
  EXPECT_DOUBLE_EQ(rope.attention_factor, 1.0);  // mscale / mscale_all_dim
  auto base = [](int i) { return std::pow(10000.0, -2.0 * i / 64); };
  for (int i = 0; i <= 10; ++i) EXPECT_DOUBLE_EQ(rope.inv_freq[i], base(i)) << i;
  for (int i = 23; i < 32; ++i) EXPECT_DOUBLE_EQ(rope.inv_freq[i], base(i) / 40) << i;
  const double ramp = (16 - 10) / 13.0;
  EXPECT_NEAR(rope.inv_freq[16], base(16) / 40 * ramp + base(16) * (1 - ramp), 1e-15);
  const double m = 0.1 * std::log(40.0) + 1;
  EXPECT_FLOAT_EQ(MlaSoftmaxScale(c), static_cast<float>(m * m / std::sqrt(192.0)));
  // `factor` is taken as given (transformers main), even when max / original says otherwise
  // (here 8): original only sets the correction range. Without mscale the attention factor is
  // mscale(factor, 1).
  c.max_position_embeddings = 8 * 4096;
  c.yarn_scaling.mscale = 0;
  rope = ComputeMlaRope(c);
  EXPECT_DOUBLE_EQ(rope.inv_freq[31], base(31) / 40);
  EXPECT_DOUBLE_EQ(rope.attention_factor, 0.1 * std::log(40.0) + 1);
  std::vector<int32_t> pos = {3};
  std::vector<float> cs(32), sn(32);
  MlaRopeTable(rope, pos.data(), 1, cs.data(), sn.data());
  EXPECT_FLOAT_EQ(cs[31], static_cast<float>(std::cos(3 * base(31) / 40) * rope.attention_factor));
  c.yarn = false;  // plain rope: theta^(-2i/d), scale qk_head_dim^-0.5
  rope = ComputeMlaRope(c);
  EXPECT_DOUBLE_EQ(rope.inv_freq[31], base(31));
  EXPECT_FLOAT_EQ(MlaSoftmaxScale(c), static_cast<float>(1 / std::sqrt(192.0)));
}

}  // namespace
}  // namespace pd::engine::kernels
