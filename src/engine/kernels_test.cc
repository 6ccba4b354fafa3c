// Every fast kernel against its reference kernel, on random inputs and odd shapes, for every
// instruction set this CPU has; plus hand-computed checks of the reference kernels themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu_features.h"
#include "engine/kernels.h"
#include "engine/kernels_ref.h"
#include "engine/kernels_test_util.h"
#include "engine/kv_cache.h"
#include "engine/model_runner_test_util.h"
#include "engine/thread_pool.h"
#include "model/dtype.h"

namespace pd::engine::kernels {
namespace {

using pd::engine::testing::Random;

struct Weights {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  WeightMatrix w;
};

Weights MakeWeights(int64_t n, int64_t k, bool bf16, uint64_t seed) {
  Weights r;
  r.f32 = Random(n * k, seed);
  if (bf16) {
    for (float v : r.f32) r.bf16.push_back(model::F32ToBf16(v));
    r.w.data = r.bf16.data();
  } else {
    r.w.data = r.f32.data();
  }
  r.w.bf16 = bf16;
  r.w.n = n;
  r.w.k = k;
  return r;
}

class IsaTest : public ::testing::TestWithParam<IsaLevel> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) GTEST_SKIP() << "this CPU lacks " << IsaLevelName(GetParam());
    isa_ = &KernelsFor(GetParam());
  }
  const IsaKernels* isa_ = nullptr;
};

// The kernels only AVX-512 has (IsaKernels::matmul_panel, attention_rows); scalar and AVX2 keep
// row-major weights and attend per item, so have none of them to test. Skipped only where the CPU
// lacks AVX-512.
class Avx512OnlyTest : public IsaTest {
 protected:
  void SetUp() override {
    IsaTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_NE(isa_->matmul_panel, nullptr) << isa_->name << " lost its panel kernel";
    ASSERT_NE(isa_->attention_rows, nullptr) << isa_->name << " lost attention_rows";
  }
};

TEST_P(IsaTest, MatmulMatchesReferenceOnOddShapes) {
  for (bool bf16 : {false, true})
    for (int64_t m : {1, 2, 3, 4, 5, 13})
      for (int64_t n : {1, 5, 8, 13, 33})
        for (int64_t k : {1, 7, 15, 16, 17, 40, 100, 129}) {
          Weights w = MakeWeights(n, k, bf16, n * 1000 + k);
          const int64_t ldx = k + 3, ldo = n + 2;
          std::vector<float> x = Random(m * ldx, m + k);
          std::vector<float> want(m * ldo, -7.0f), got(m * ldo, -7.0f);
          ref::Matmul(x.data(), m, ldx, w.w, want.data(), ldo);
          isa_->matmul(x.data(), m, ldx, w.w, 0, n, got.data(), ldo);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < ldo; ++j) {
              double bound = 1e-6;
              for (int64_t kk = 0; j < n && kk < k; ++kk)
                bound += 2e-6 * std::fabs(x[i * ldx + kk] * w.f32[j * k + kk]);
              ASSERT_NEAR(got[i * ldo + j], want[i * ldo + j], bound)
                  << "bf16=" << bf16 << " m=" << m << " n=" << n << " k=" << k << " at " << i << ","
                  << j;
            }
        }
}

TEST_P(IsaTest, MatmulSliceWritesOnlyItsColumns) {
  Weights w = MakeWeights(37, 24, true, 5);
  std::vector<float> x = Random(3 * 24, 6);
  std::vector<float> want(3 * 37, 0.0f), got(3 * 37, 123.0f);
  ref::Matmul(x.data(), 3, 24, w.w, want.data(), 37);
  isa_->matmul(x.data(), 3, 24, w.w, 9, 30, got.data(), 37);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 37; ++j) {
      if (j >= 9 && j < 30) {
        EXPECT_NEAR(got[i * 37 + j], want[i * 37 + j], 1e-4);
      } else {
        EXPECT_EQ(got[i * 37 + j], 123.0f);
      }
    }
}

TEST_P(IsaTest, ParallelMatmulMatchesReference) {
  ThreadPool pool(3);
  Weights w = MakeWeights(101, 64, false, 8);
  std::vector<float> x = Random(13 * 64, 9);
  std::vector<float> want(13 * 101), got(13 * 101);
  ref::Matmul(x.data(), 13, 64, w.w, want.data(), 101);
  ParallelMatmul(pool, *isa_, x.data(), 13, 64, w.w, got.data(), 101);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4) << i;
}

TEST_P(IsaTest, RowKernelsMatchReferenceOnOddSizes) {
  for (int64_t dim : {1, 7, 16, 33, 100, 2048}) {
    std::vector<float> g = Random(dim, dim, 4.0f), u = Random(dim, dim + 1), w = Random(dim, 3);
    g[0] = -120.0f;             // exp(-g) overflows: the product is 0
    if (dim > 1) g[1] = 95.0f;  // sigmoid(g) is 1
    std::vector<float> want(dim), got(dim, 5.0f);
    ref::SiluMul(g.data(), dim, u.data(), dim, 1, dim, want.data(), dim);
    isa_->silu_mul_row(g.data(), u.data(), dim, got.data());
    for (int64_t i = 0; i < dim; ++i)
      ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::fabs(want[i])))
          << "silu dim=" << dim << " " << i;
    std::vector<float> alias = g;  // out may alias gate
    isa_->silu_mul_row(alias.data(), u.data(), dim, alias.data());
    EXPECT_EQ(alias, got);
    ref::RmsNorm(g.data(), 1, dim, dim, w.data(), 1e-5f, want.data(), dim);
    isa_->rms_norm_row(g.data(), w.data(), dim, 1e-5f, got.data());
    for (int64_t i = 0; i < dim; ++i)
      ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::fabs(want[i])))
          << "norm dim=" << dim << " " << i;
    isa_->rms_norm_row(g.data(), w.data(), dim, 1e-5f, g.data());  // out may alias x
    EXPECT_EQ(g, got);
  }
}

// W stacked from several row-major parts and packed into the kPanel32 layout.
struct PanelWeights {
  std::vector<Weights> parts;
  std::vector<uint8_t> packed;
  WeightMatrix w;
  std::vector<float> f32;  // the stacked matrix (n, k) as f32, for bounds

  PanelWeights(std::vector<int64_t> ns, int64_t k, bool bf16, uint64_t seed, ThreadPool& pool) {
    std::vector<WeightMatrix> srcs;
    for (int64_t n : ns) {
      parts.push_back(MakeWeights(n, k, bf16, seed++));
      srcs.push_back(parts.back().w);
    }
    for (const Weights& p : parts)
      for (size_t i = 0; i < p.f32.size(); ++i)
        f32.push_back(bf16 ? model::Bf16ToF32(p.bf16[i]) : p.f32[i]);
    int64_t n = 0;
    for (int64_t v : ns) n += v;
    packed.assign(Panel32Bytes(n, k, bf16), 0xAB);
    w = PackPanel32(pool, srcs.data(), static_cast<int>(srcs.size()), packed.data());
  }
  // Reference: out = x @ W^T over the stacked row-major parts.
  void Reference(const float* x, int64_t m, int64_t ldx, float* out, int64_t ldo) const {
    testing::StackedReference(parts, x, m, ldx, out, ldo);
  }
};

TEST_P(Avx512OnlyTest, PanelMatmulMatchesReferenceOnOddShapes) {
  ThreadPool pool(2);
  for (bool bf16 : {false, true})
    for (int64_t m : {1, 2, 3, 4, 5, 13, 15, 30, 70})
      for (std::vector<int64_t> ns : std::vector<std::vector<int64_t>>{{1}, {33}, {8, 5, 70}, {64}})
        for (int64_t k : {1, 17, 64, 400}) {
          PanelWeights pw(ns, k, bf16, m * 7 + k, pool);
          const int64_t n = pw.w.n, ldx = k + 3, ldo = n + 2;
          std::vector<float> x = Random(m * ldx, m + k);
          std::vector<float> want(m * ldo, -7.0f), got(m * ldo, -7.0f);
          pw.Reference(x.data(), m, ldx, want.data(), ldo);
          isa_->matmul_panel(x.data(), m, ldx, pw.w, 0, n, got.data(), ldo);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < ldo; ++j) {
              double bound = 1e-6;
              for (int64_t kk = 0; j < n && kk < k; ++kk)
                bound += 2e-6 * std::fabs(x[i * ldx + kk] * pw.f32[j * k + kk]);
              ASSERT_NEAR(got[i * ldo + j], want[i * ldo + j], bound)
                  << "bf16=" << bf16 << " m=" << m << " n=" << n << " k=" << k << " at " << i << ","
                  << j;
            }
        }
}

TEST_P(Avx512OnlyTest, PanelMatmulRowsDoNotDependOnTheirCompany) {
  ThreadPool pool(1);
  PanelWeights pw({77}, 600, true, 3, pool);
  const int64_t n = 77, k = 600;
  std::vector<float> x = Random(80 * k, 4);
  std::vector<float> all(80 * n), some(3 * n);
  isa_->matmul_panel(x.data(), 80, k, pw.w, 0, n, all.data(), n);  // blocked, converted
  for (int64_t rows : {1, 3})                                      // streamed
    for (int64_t m : {0, 5, 19, 77}) {
      isa_->matmul_panel(x.data() + m * k, rows, k, pw.w, 0, n, some.data(), n);
      for (int64_t j = 0; j < rows * n; ++j)
        ASSERT_EQ(some[j], all[m * n + j]) << "rows " << rows << " row " << m << " at " << j;
    }
  for (int64_t rows : {20, 40}) {  // blocked, bf16 read directly
    std::vector<float> mid(rows * n);
    isa_->matmul_panel(x.data() + 7 * k, rows, k, pw.w, 0, n, mid.data(), n);
    for (int64_t j = 0; j < rows * n; ++j) ASSERT_EQ(mid[j], all[7 * n + j]) << rows << " " << j;
  }
}

// The blocked path over several k blocks (the last not a multiple of 16; prefill-sized and
// decode-sized batches block k differently, so k = 2100 gives both several), several runs of
// groups (the last with an odd group) and a slice not starting at group 0: every row equals that
// row computed alone (streamed, bit for bit) and the reference (within rounding); columns outside
// the slice are untouched.
TEST_P(Avx512OnlyTest, PanelMatmulBlockedOverManyRunsEqualsStreamedRows) {
  ThreadPool pool(2);
  const int64_t n = 32 * 19 + 5, n_begin = 64;
  for (bool bf16 : {true, false})
    for (int64_t k : {1000, 2100}) {
      PanelWeights pw({n - 40, 40}, k, bf16, bf16 ? 11 : 12, pool);
      for (int64_t m : {70, 30, 17}) {
        std::vector<float> x = Random(m * k, m);
        std::vector<float> want(m * n), got(m * n, -3.0f), row(n, -5.0f);
        pw.Reference(x.data(), m, k, want.data(), n);
        isa_->matmul_panel(x.data(), m, k, pw.w, n_begin, n, got.data(), n);
        for (int64_t i = 0; i < m; ++i) {
          isa_->matmul_panel(x.data() + i * k, 1, k, pw.w, n_begin, n, row.data(), n);
          for (int64_t j = 0; j < n; ++j) {
            if (j < n_begin) {
              ASSERT_EQ(got[i * n + j], -3.0f) << "bf16=" << bf16 << " m=" << m << " " << i;
              continue;
            }
            ASSERT_EQ(got[i * n + j], row[j])
                << "bf16=" << bf16 << " k=" << k << " m=" << m << " at " << i << "," << j;
            ASSERT_NEAR(got[i * n + j], want[i * n + j], 2e-3) << i << "," << j;
          }
        }
      }
    }
}

TEST_P(Avx512OnlyTest, PanelMatmulSliceWritesOnlyItsColumns) {
  ThreadPool pool(1);
  PanelWeights pw({100}, 24, true, 5, pool);
  for (int64_t m : {2, 9}) {
    std::vector<float> x = Random(m * 24, 6);
    std::vector<float> want(m * 100, 0.0f), got(m * 100, 123.0f);
    pw.Reference(x.data(), m, 24, want.data(), 100);
    isa_->matmul_panel(x.data(), m, 24, pw.w, 32, 97, got.data(), 100);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < 100; ++j) {
        if (j >= 32 && j < 97) {
          EXPECT_NEAR(got[i * 100 + j], want[i * 100 + j], 1e-4);
        } else {
          EXPECT_EQ(got[i * 100 + j], 123.0f) << i << "," << j;
        }
      }
  }
}

TEST_P(Avx512OnlyTest, ParallelPanelMatmulMatchesReference) {
  ThreadPool pool(3);
  PanelWeights pw({101, 40}, 64, false, 8, pool);
  std::vector<float> x = Random(13 * 64, 9);
  std::vector<float> want(13 * 141), got(13 * 141);
  pw.Reference(x.data(), 13, 64, want.data(), 141);
  ParallelMatmul(pool, *isa_, x.data(), 13, 64, pw.w, got.data(), 141);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4) << i;
}

// Decode batches (up to 64 rows) deal chunks of groups to whichever thread asks (fixed sizes up
// to 4 rows, shrinking guided chunks above): every column is still written, once, with the bits
// of a single-threaded call.
TEST_P(Avx512OnlyTest, ParallelPanelMatmulDealtInChunksEqualsOneThread) {
  ThreadPool pool2(2), pool3(3);
  const int64_t n = 32 * 41 + 7, k = 96;  // 42 groups: several chunks at every batch size
  PanelWeights pw({n}, k, true, 21, pool2);
  for (ThreadPool* pool : {&pool2, &pool3})
    for (int64_t rows : {1, 2, 3, 4, 13, 32, 64}) {
      std::vector<float> x = Random(rows * k, 30 + rows);
      std::vector<float> want(rows * n, NAN), got(rows * n, NAN);
      isa_->matmul_panel(x.data(), rows, k, pw.w, 0, n, want.data(), n);
      ParallelMatmul(*pool, *isa_, x.data(), rows, k, pw.w, got.data(), n);
      for (int64_t i = 0; i < rows * n; ++i) {
        ASSERT_FALSE(std::isnan(got[i])) << rows << " rows: column " << i % n << " not written";
        ASSERT_EQ(got[i], want[i]) << rows << " rows, element " << i;
      }
    }
}

// The bf16-dot matmul: every batch size (streamed, blocked with bf16 read directly, blocked
// and converted), several k blocks and runs, a slice not starting at group 0: bit for bit
// ref::MatmulBf16Dot (x with tiny and denormal values, flushed), columns outside untouched;
// f32 weights and odd k take the exact panel kernel.
class Bf16DotTest : public IsaTest {
 protected:
  void SetUp() override {
    IsaTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_NE(isa_->matmul_panel_bf16_dot, nullptr) << isa_->name << " lost its bf16 dot kernel";
    if (!DetectCpuFeatures().avx512_bf16) GTEST_SKIP() << "this CPU lacks AVX512_BF16";
  }
  // ref::MatmulBf16Dot over pw's stacked parts into out (ldo), columns [n_begin, n).
  static void Reference(const PanelWeights& pw, const float* x, int64_t m, int64_t ldx,
                        int64_t n_begin, float* out, int64_t ldo) {
    std::vector<float> all(m * pw.w.n);
    int64_t col = 0;
    for (const Weights& p : pw.parts) {
      ref::MatmulBf16Dot(x, m, ldx, p.w, all.data() + col, pw.w.n);
      col += p.w.n;
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = n_begin; j < pw.w.n; ++j) out[i * ldo + j] = all[i * pw.w.n + j];
  }
};

TEST_P(Bf16DotTest, EqualsTheReferenceBitForBitAtEveryBatchSize) {
  ThreadPool pool(2);
  for (int64_t k : {2, 18, 64, 400, 2100})
    for (std::vector<int64_t> ns :
         std::vector<std::vector<int64_t>>{{1}, {8, 5, 70}, {32 * 19 + 5}})
      for (int64_t m : {1, 2, 3, 4, 5, 13, 30, 70}) {
        PanelWeights pw(ns, k, true, m * 3 + k, pool);
        const int64_t n = pw.w.n, ldx = k + 3, ldo = n + 2, n_begin = n > 64 ? 64 : 0;
        std::vector<float> x = Random(m * ldx, m + 2 * k);
        x[0] = 1e-39f;  // a denormal: zero in bf16
        if (x.size() > 3) x[3] = -3e-38f;
        std::vector<float> want(m * ldo, -7.0f), got(m * ldo, -7.0f);
        Reference(pw, x.data(), m, ldx, n_begin, want.data(), ldo);
        isa_->matmul_panel_bf16_dot(x.data(), m, ldx, pw.w, n_begin, n, got.data(), ldo);
        for (int64_t i = 0; i < m * ldo; ++i)
          ASSERT_EQ(got[i], want[i])
              << "m=" << m << " n=" << n << " k=" << k << " at " << i / ldo << "," << i % ldo;
      }
}

TEST_P(Bf16DotTest, IsCloseToTheExactMatmulAndFallsBackToItWhereItCannotApply) {
  ThreadPool pool(1);
  const int64_t m = 9, n = 70, k = 512;
  PanelWeights pw({n}, k, true, 17, pool);
  std::vector<float> x = Random(m * k, 18);
  std::vector<float> exact(m * n), dot(m * n);
  isa_->matmul_panel(x.data(), m, k, pw.w, 0, n, exact.data(), n);
  isa_->matmul_panel_bf16_dot(x.data(), m, k, pw.w, 0, n, dot.data(), n);
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(dot[i]) - exact[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(exact[i])));
  }
  EXPECT_GT(diff, 0.0);  // x was rounded to bf16
  EXPECT_LT(diff, 2e-2 * scale);
  for (bool bf16 : {false, true}) {  // f32 weights; odd k
    const int64_t kk = bf16 ? 33 : k;
    PanelWeights other({n}, kk, bf16, 19, pool);
    std::vector<float> a(m * n), b(m * n, 1.0f);
    isa_->matmul_panel(x.data(), m, kk, other.w, 0, n, a.data(), n);
    isa_->matmul_panel_bf16_dot(x.data(), m, kk, other.w, 0, n, b.data(), n);
    EXPECT_EQ(a, b) << "bf16=" << bf16 << " k=" << kk;
  }
}

TEST(PackPanel32Test, LaysOutGroupsAsDocumented) {
  ThreadPool pool(2);
  Weights a = MakeWeights(20, 3, true, 1), b = MakeWeights(15, 3, true, 2);
  const WeightMatrix srcs[2] = {a.w, b.w};
  std::vector<uint16_t> packed(Panel32Bytes(35, 3, true) / 2, 0xFFFF);
  ASSERT_EQ(packed.size(), 64u * 3);
  const WeightMatrix w = PackPanel32(pool, srcs, 2, packed.data());
  EXPECT_EQ(w.n, 35);
  EXPECT_EQ(w.layout, WeightLayout::kPanel32);
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t r = 0; r < 32; ++r) {
        const int64_t row = g * 32 + r;
        const uint16_t want = row < 20   ? a.bf16[row * 3 + k]
                              : row < 35 ? b.bf16[(row - 20) * 3 + k]
                                         : 0;
        const int64_t pos = r < 16 ? 2 * r : 2 * (r - 16) + 1;
        EXPECT_EQ(packed[(g * 3 + k) * 32 + pos], want) << g << " " << k << " " << r;
      }
}

// KV element types the attention tests run over (PagedKv's bf16 / fp8 flags).
enum KvElemType { kKvF32 = 0, kKvBf16 = 1, kKvFp8 = 2 };
const char* KvElemName(int t) { return t == kKvF32 ? "f32" : (t == kKvBf16 ? "bf16" : "fp8"); }

// A paged KV region in plain memory with three sequences: 5 cached + 7 new tokens (a prefill
// chunk; or first_start cached + first_len new), 40 cached + 1 new (a decode crossing attention
// blocks), and a 1-token prompt.
struct AttnFixture {
  std::vector<uint8_t> region;
  PagedKv kv;
  std::vector<std::vector<int32_t>> tables;
  std::vector<AttnSeq> seqs;
  std::vector<int32_t> token_seq;
  std::vector<float> q, want, got;
  AttentionArgs args;

  // dtype: a KvElemType; fp8 with k_scale 0.5 and v_scale 1.5 (codes of K / 0.5 and V / 1.5).
  AttnFixture(bool hnd, int dtype, int head_dim, int page_size, int group, int first_start = 5,
              int first_len = 7) {
    const int kv_heads = 2, heads = kv_heads * group;
    const int starts[3] = {first_start, 40, 0}, lens[3] = {first_len, 1, 1};
    kv.num_kv_heads = kv_heads;
    kv.head_dim = head_dim;
    kv.page_size = page_size;
    kv.hnd = hnd;
    kv.bf16 = dtype == kKvBf16;
    kv.fp8 = dtype == kKvFp8;
    if (kv.fp8) {
      kv.k_scale = 0.5f;
      kv.v_scale = 1.5f;
    }
    kv.page_bytes = static_cast<int64_t>(page_size) * kv_heads * 2 * head_dim * kv.elem_bytes();
    int next_page = 0, tokens = 0;
    for (int s = 0; s < 3; ++s) {
      const int end = starts[s] + lens[s];
      std::vector<int32_t> t;
      for (int p = 0; p < (end + page_size - 1) / page_size; ++p) t.push_back(next_page++);
      std::reverse(t.begin(), t.end());
      tables.push_back(t);
    }
    region.assign(next_page * kv.page_bytes, 0xff);  // garbage outside written slots
    kv.base = region.data();
    for (int s = 0; s < 3; ++s) {
      const int end = starts[s] + lens[s];
      // Every position's K/V, written as earlier steps (and this one) would have.
      const std::vector<float> k = Random(end * kv_heads * head_dim, 100 + s);
      const std::vector<float> v = Random(end * kv_heads * head_dim, 200 + s);
      AttnSeq all{0, end, 0, tables[s].data()};
      ref::AppendKv(kv, all, k.data(), kv_heads * head_dim, v.data(), kv_heads * head_dim);
      seqs.push_back(AttnSeq{tokens, lens[s], starts[s], tables[s].data()});
      for (int i = 0; i < lens[s]; ++i) token_seq.push_back(s);
      tokens += lens[s];
    }
    const int64_t ld = heads * head_dim + 5;
    q = Random(tokens * ld, 7, 0.5f);
    want.assign(tokens * heads * head_dim, 0.0f);
    got.assign(want.size(), 0.0f);
    args.kv = kv;
    args.num_heads = heads;
    args.q = q.data();
    args.ldq = ld;
    args.ldo = heads * head_dim;
    args.seqs = seqs.data();
    args.num_seqs = 3;
    args.token_seq = token_seq.data();
    args.num_tokens = tokens;
    args.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    std::vector<float> scratch(64 + first_start + first_len);  // a score per position
    args.out = want.data();
    ref::PagedAttention(args, scratch.data());
    args.out = got.data();
  }
};

TEST_P(IsaTest, AttentionMatchesReferenceForLayoutsAndDtypes) {
  for (bool hnd : {true, false})
    for (int dtype : {kKvF32, kKvBf16, kKvFp8})
      for (int head_dim : {40, 64, 10, 128, 136})
        for (int page_size : {1, 3, 16})
          for (int group : {1, 2, 3, 4}) {
            AttnFixture f(hnd, dtype, head_dim, page_size, group);
            std::vector<float> scratch(AttentionItemScratchFloats(group, head_dim), -1.0f);
            for (int t = 0; t < f.args.num_tokens; ++t)
              for (int g = 0; g < 2; ++g) isa_->attention_item(f.args, t, g, scratch.data());
            for (size_t i = 0; i < f.want.size(); ++i)
              ASSERT_NEAR(f.got[i], f.want[i], 2e-5)
                  << "hnd=" << hnd << " " << KvElemName(dtype) << " d=" << head_dim
                  << " page=" << page_size << " group=" << group << " at " << i;
          }
}

TEST_P(IsaTest, ParallelAttentionMatchesReference) {
  ThreadPool pool(3);
  AttnFixture f(true, true, 40, 3, 4);
  const size_t stride = AttentionItemScratchFloats(4, 40);
  std::vector<float> scratch(stride * 3);
  ParallelAttention(pool, *isa_, f.args, scratch.data(), stride);
  for (size_t i = 0; i < f.want.size(); ++i) ASSERT_NEAR(f.got[i], f.want[i], 2e-5) << i;
}

// attention_rows over splits of a 37-token chunk at positions 30..66 (crossing two block ends)
// into runs of 1 to kAttnRows tokens gives each token attention_item's exact bits.
TEST_P(Avx512OnlyTest, AttentionRowsEqualPerTokenItemsBitForBit) {
  for (bool hnd : {true, false})
    for (int dtype : {kKvF32, kKvBf16, kKvFp8})
      for (int head_dim : {40, 64, 10, 128, 136})
        for (int page_size : {1, 3, 16})
          for (int group : {1, 3, 4}) {
            AttnFixture f(hnd, dtype, head_dim, page_size, group, 30, 37);
            std::vector<float> scratch(AttentionItemScratchFloats(group, head_dim), -1.0f);
            for (int t = 0; t < 37; ++t)
              for (int g = 0; g < 2; ++g) isa_->attention_item(f.args, t, g, scratch.data());
            const std::vector<float> items(f.got.begin(), f.got.begin() + 37 * f.args.ldo);
            for (size_t i = 0; i < items.size(); ++i)
              ASSERT_NEAR(items[i], f.want[i], 2e-5) << "item d=" << head_dim << " at " << i;
            for (int run : {1, 2, 3, 7, kAttnRows - 1, kAttnRows}) {
              std::fill(f.got.begin(), f.got.end(), -7.0f);
              for (int t = 0; t < 37; t += run)
                for (int g = 0; g < 2; ++g)
                  isa_->attention_rows(f.args, t, std::min(run, 37 - t), g, scratch.data());
              ASSERT_EQ(std::memcmp(f.got.data(), items.data(), items.size() * sizeof(float)), 0)
                  << "hnd=" << hnd << " " << KvElemName(dtype) << " d=" << head_dim
                  << " page=" << page_size << " group=" << group << " run=" << run;
              EXPECT_EQ(f.got[items.size()], -7.0f) << "wrote past its tokens";
            }
          }
}

// ParallelAttention over a long chunk, a decode token and a prompt token (windows mixing
// sequences, rows and items) gives the per-token items' bits whatever the thread count.
TEST_P(IsaTest, ParallelAttentionRowsEqualItemsForAnyThreadCount) {
  for (int dtype : {kKvF32, kKvBf16, kKvFp8}) {
    AttnFixture f(true, dtype, 64, 16, 4, 3, 70);
    std::vector<float> scratch(AttentionItemScratchFloats(4, 64) * 3);
    for (int t = 0; t < f.args.num_tokens; ++t)
      for (int g = 0; g < 2; ++g) isa_->attention_item(f.args, t, g, scratch.data());
    const std::vector<float> items = f.got;
    for (size_t i = 0; i < items.size(); ++i) ASSERT_NEAR(items[i], f.want[i], 2e-5) << i;
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::fill(f.got.begin(), f.got.end(), -7.0f);
      ParallelAttention(pool, *isa_, f.args, scratch.data(), AttentionItemScratchFloats(4, 64));
      ASSERT_EQ(std::memcmp(f.got.data(), items.data(), items.size() * sizeof(float)), 0)
          << KvElemName(dtype) << " threads=" << threads;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, IsaTest,
                         ::testing::Values(IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512),
                         [](const auto& info) { return std::string(IsaLevelName(info.param)); });

INSTANTIATE_TEST_SUITE_P(Avx512, Avx512OnlyTest, ::testing::Values(IsaLevel::kAvx512),
                         [](const auto& info) { return std::string(IsaLevelName(info.param)); });

INSTANTIATE_TEST_SUITE_P(Avx512, Bf16DotTest, ::testing::Values(IsaLevel::kAvx512),
                         [](const auto& info) { return std::string(IsaLevelName(info.param)); });

// x rounds to bf16 at nearest even (1 + 2^-8 is a tie: 1; 1 + 3*2^-8: 1 + 2^-6), denormals to
// zero; the pair's k + 1 product is added first.
TEST(RefKernelsTest, MatmulBf16DotRoundsXAndAddsEachPairHighFirst) {
  const float x[4] = {1.0f + 0x1p-8f, 3.0f, 1.0f + 3 * 0x1p-8f, 1e-39f};
  const uint16_t w[8] = {model::F32ToBf16(2.0f), model::F32ToBf16(1.0f),    model::F32ToBf16(1.0f),
                         model::F32ToBf16(5.0f), model::F32ToBf16(0x1p24f), model::F32ToBf16(0.0f),
                         model::F32ToBf16(1.0f), model::F32ToBf16(0.0f)};
  WeightMatrix wm;
  wm.data = w;
  wm.bf16 = true;
  wm.n = 2;
  wm.k = 4;
  float out[2];
  ref::MatmulBf16Dot(x, 1, 4, wm, out, 2);
  EXPECT_EQ(out[0], 1.0f * 2 + 3.0f * 1 + (1.0f + 0x1p-6f) * 1);  // 5 (pair 0), then 6.015625
  // Row 1: pair 0 gives 0 + 3*0 = 0, then 0 + 1*2^24 = 2^24; pair 1: + 0, then + 1.015625:
  // 2^24 + 1.015625 rounds to 2^24 + 2.
  EXPECT_EQ(out[1], 0x1p24f + 2.0f);
}

TEST(RefKernelsTest, AppendKvMatchesTheSpecLayout) {
  for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
    KvCacheSpec spec;
    spec.num_layers = 2;
    spec.num_kv_heads = 3;
    spec.head_dim = 4;
    spec.page_size = 3;
    spec.layout = layout;
    auto region = KvRegion::Create(spec, 4);
    ASSERT_TRUE(region.ok());
    PagedKv kv{(*region)->Block(1, 0),
               static_cast<int64_t>(spec.page_bytes()),
               3,
               3,
               4,
               layout == KvLayout::kHND,
               false};
    const int32_t table[2] = {2, 0};
    std::vector<float> k(5 * 12), v(5 * 12);
    for (int i = 0; i < 60; ++i) k[i] = i, v[i] = 1000 + i;
    ref::AppendKv(kv, AttnSeq{0, 5, 0, table}, k.data(), 12, v.data(), 12);
    const float* base = reinterpret_cast<const float*>((*region)->base());
    for (int pos = 0; pos < 5; ++pos)
      for (int h = 0; h < 3; ++h)
        for (int which = 0; which < 2; ++which) {
          const size_t block = (*region)->BlockOffset(1, table[pos / 3]) / 4;
          const float* p = base + block + spec.ElemOffset(pos % 3, h, which);
          for (int i = 0; i < 4; ++i) EXPECT_EQ(p[i], (which ? 1000 : 0) + pos * 12 + h * 4 + i);
        }
    // Layer 0 untouched.
    for (size_t i = 0; i < (*region)->BlockOffset(1, 0); ++i) ASSERT_EQ((*region)->base()[i], 0);
  }
}

TEST(RefKernelsTest, HandComputedValues) {
  const float x[2] = {3, 4}, w[2] = {1, 2};
  float out[2];
  ref::RmsNorm(x, 1, 2, 2, w, 0.0f, out, 2);
  EXPECT_NEAR(out[0], 3 / std::sqrt(12.5f), 1e-6);
  EXPECT_NEAR(out[1], 8 / std::sqrt(12.5f), 1e-6);
  // RoPE, head_dim 4, pos 1: angles 1 and 10000^-0.5 = 0.01; pairs (0, 2) and (1, 3).
  const int32_t pos[2] = {0, 1};
  float cs[4], sn[4];
  ref::RopeTable(pos, 2, 4, 10000.0, cs, sn);
  float q[8] = {1, 2, 3, 4, 1, 0, 0, 1};
  ref::ApplyRope(q, 2, 1, 4, 4, cs, sn);
  EXPECT_FLOAT_EQ(q[0], 1);  // position 0 is the identity
  EXPECT_FLOAT_EQ(q[3], 4);
  EXPECT_NEAR(q[4], std::cos(1.0), 1e-6);
  EXPECT_NEAR(q[6], std::sin(1.0), 1e-6);
  EXPECT_NEAR(q[5], -std::sin(0.01), 1e-6);
  EXPECT_NEAR(q[7], std::cos(0.01), 1e-6);
  const float g[2] = {1, -2}, u[2] = {2, 3};
  float act[2];
  ref::SiluMul(g, 2, u, 2, 1, 2, act, 2);
  EXPECT_NEAR(act[0], 2 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(act[1], -2 / (1 + std::exp(2.0)) * 3, 1e-6);
}

TEST(RefKernelsTest, AttentionOverOnePositionReturnsItsValue) {
  std::vector<uint8_t> page(2 * 1 * 2 * 8 * 4);
  PagedKv kv{page.data(), static_cast<int64_t>(page.size()), 2, 1, 8, false, false};
  std::vector<float> k = Random(8, 1), v = Random(8, 2);
  const int32_t table[1] = {0};
  ref::AppendKv(kv, AttnSeq{0, 1, 0, table}, k.data(), 8, v.data(), 8);
  std::vector<float> q = Random(8, 3), out(8), scratch(4);
  const AttnSeq seq{0, 1, 0, table};
  const int32_t token_seq[1] = {0};
  AttentionArgs a;
  a.kv = kv;
  a.num_heads = 1;
  a.q = q.data();
  a.ldq = 8;
  a.out = out.data();
  a.ldo = 8;
  a.seqs = &seq;
  a.num_seqs = 1;
  a.token_seq = token_seq;
  a.num_tokens = 1;
  ref::PagedAttention(a, scratch.data());
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(out[i], v[i]);
}

}  // namespace
}  // namespace pd::engine::kernels
