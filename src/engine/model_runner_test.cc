#include "engine/model_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "engine/model_runner_test_util.h"

namespace pd::engine {
namespace {

using model::Arch;
using model::DType;
using testing::MakeTinyModel;
using testing::RelError;
using testing::TinyModel;
using testing::TinyModelOptions;
using testing::Tokens;

std::vector<int32_t> Pages(int first, int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = first + n - 1 - i;  // not in order: exercise the table
  return p;
}

struct Case {
  Arch arch;
  DType dtype;
  KvLayout layout;
  KvDType kv_dtype;
  int page_size;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(model::ArchName(c.arch)) + "_" + std::string(model::DTypeName(c.dtype)) + "_" +
         std::string(KvLayoutName(c.layout)) + "_kv" + std::string(KvDTypeName(c.kv_dtype)) + "_p" +
         std::to_string(c.page_size);
}

class RunnerTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    TinyModelOptions o;
    o.arch = GetParam().arch;
    o.dtype = GetParam().dtype;
    o.tie = o.arch == Arch::kQwen2;
    model_ = MakeTinyModel(o);
  }
  std::unique_ptr<ModelRunner> Make(KernelKind kind, int threads = 2) {
    ModelRunnerOptions opt;
    opt.kv.page_size = GetParam().page_size;
    opt.kv.layout = GetParam().layout;
    opt.kv.dtype = GetParam().kv_dtype;
    opt.num_pages = 200;
    opt.num_threads = threads;
    opt.kernels = kind;
    auto r = ModelRunner::Create(model_->weights, opt);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  // Runs tokens [begin, end) of a sequence as one step; returns the last token's logits.
  std::vector<float> Step(ModelRunner& r, const std::vector<int32_t>& tokens,
                          const std::vector<int32_t>& pages, int begin, int end) {
    ForwardBatch b;
    b.seqs.push_back(SeqStep{1, begin, std::span<const int32_t>(tokens).subspan(begin, end - begin),
                             pages, true});
    ForwardOutput out;
    Status s = r.Forward(b, &out);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return s.ok() ? out.logits[0] : std::vector<float>();
  }
  int PagesFor(int tokens) const {
    return (tokens + GetParam().page_size - 1) / GetParam().page_size;
  }

  std::unique_ptr<TinyModel> model_;
};

TEST_P(RunnerTest, FastMatchesReferenceOnMixedBatches) {
  auto ref = Make(KernelKind::kReference);
  auto fast = Make(KernelKind::kFast, 3);
  ASSERT_TRUE(ref && fast);
  const int vocab = model_->weights.config.vocab_size;
  const std::vector<int32_t> a = Tokens(12, 1, vocab), b = Tokens(13, 2, vocab);
  const std::vector<int32_t> pa = Pages(0, PagesFor(12)), pb = Pages(100, PagesFor(13));
  // With a bf16 cache, a last-bit difference in a projection (summation order) can round a K/V
  // element to the neighbouring bf16 value (2^-8 relative), so the bound is looser there.
  const double tol = GetParam().kv_dtype == KvDType::kF32 ? 1e-4 : 1e-3;
  // step 0: a prefills 9, b prefills 7; step 1: a decodes, b prefills 5; step 2: both decode.
  const int plan[3][4] = {{0, 9, 0, 7}, {9, 10, 7, 12}, {10, 11, 12, 13}};
  for (int step = 0; step < 3; ++step) {
    ForwardBatch batch;
    const int* p = plan[step];
    batch.seqs.push_back(
        SeqStep{1, p[0], std::span<const int32_t>(a).subspan(p[0], p[1] - p[0]), pa, true});
    batch.seqs.push_back(
        SeqStep{2, p[2], std::span<const int32_t>(b).subspan(p[2], p[3] - p[2]), pb, step != 1});
    ForwardOutput out_ref, out_fast;
    ASSERT_TRUE(ref->Forward(batch, &out_ref).ok());
    ASSERT_TRUE(fast->Forward(batch, &out_fast).ok());
    ASSERT_EQ(out_fast.logits.size(), 2u);
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(out_ref.logits[s].size(), batch.seqs[s].compute_logits ? vocab : 0u);
      EXPECT_LT(RelError(out_fast.logits[s], out_ref.logits[s]), tol) << "step " << step;
      EXPECT_LT(RelError(out_fast.last_hidden[s], out_ref.last_hidden[s]), tol);
    }
  }
  EXPECT_EQ(fast->steps_done(), 3u);
}

TEST_P(RunnerTest, ChunkedPrefillMatchesWholePrefill) {
  const int vocab = model_->weights.config.vocab_size;
  const std::vector<int32_t> t = Tokens(13, 3, vocab);
  const std::vector<int32_t> pages = Pages(0, PagesFor(13));
  for (KernelKind kind : {KernelKind::kReference, KernelKind::kFast}) {
    auto whole = Make(kind);
    auto chunked = Make(kind);
    const std::vector<float> want = Step(*whole, t, pages, 0, 13);
    std::vector<float> got;
    for (int b = 0; b < 13; b += 5) got = Step(*chunked, t, pages, b, std::min(13, b + 5));
    EXPECT_LT(RelError(got, want), 1e-5);
    EXPECT_EQ(chunked->steps_done(), 3u);
  }
}

TEST_P(RunnerTest, PrefillThenDecodeMatchesLongerPrefill) {
  const int vocab = model_->weights.config.vocab_size;
  const std::vector<int32_t> t = Tokens(14, 4, vocab);
  const std::vector<int32_t> pages = Pages(0, PagesFor(14));
  auto long_run = Make(KernelKind::kFast);
  auto decode_run = Make(KernelKind::kFast);
  const std::vector<float> want = Step(*long_run, t, pages, 0, 14);
  std::vector<float> got = Step(*decode_run, t, pages, 0, 10);
  for (int p = 10; p < 14; ++p) got = Step(*decode_run, t, pages, p, p + 1);
  EXPECT_LT(RelError(got, want), 1e-5);
}

TEST_P(RunnerTest, BatchCompanyDoesNotChangeLogits) {
  const int vocab = model_->weights.config.vocab_size;
  const std::vector<int32_t> a = Tokens(11, 5, vocab), b = Tokens(6, 6, vocab);
  const std::vector<int32_t> pa = Pages(0, PagesFor(11)), pb = Pages(50, PagesFor(6));
  auto alone = Make(KernelKind::kFast);
  auto together = Make(KernelKind::kFast);
  const std::vector<float> want = Step(*alone, a, pa, 0, 11);
  ForwardBatch batch;
  batch.seqs.push_back(SeqStep{7, 0, b, pb, false});
  batch.seqs.push_back(SeqStep{8, 0, a, pa, true});
  ForwardOutput out;
  ASSERT_TRUE(together->Forward(batch, &out).ok());
  EXPECT_TRUE(out.logits[0].empty());
  EXPECT_EQ(out.last_hidden[0].size(), static_cast<size_t>(model_->weights.config.hidden_size));
  EXPECT_LT(RelError(out.logits[1], want), 1e-6);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (Arch arch : {Arch::kLlama, Arch::kQwen2, Arch::kQwen3})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD})
        for (KvDType kv : {KvDType::kF32, KvDType::kBF16})
          for (int page : {1, 3, 16}) cases.push_back(Case{arch, dt, layout, kv, page});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, RunnerTest, ::testing::ValuesIn(AllCases()), CaseName);

// MatmulPrecision::kBf16 on a bf16 model whose dims are long enough for several k blocks' worth
// of pairs: the fast kernels (where the CPU has AVX512_BF16) equal the emulating reference
// within the other kernels' rounding, differ from the f32 precision by bf16 rounding only, and
// a sequence's logits do not depend on its batch.
// AMX off: with it, a step's matmuls of 16 rows or more take tiles (amx_runner_test.cc).
TEST(RunnerMatmulPrecisionTest, Bf16DotMatchesItsReferenceAndIsBatchInvariant) {
  const testing::ScopedAmxAllowed no_amx(false);
  TinyModelOptions o;
  o.dtype = DType::kBF16;
  o.hidden = 64;
  o.intermediate = 96;
  o.vocab = 97;
  o.head_dim = 16;
  std::unique_ptr<TinyModel> m = MakeTinyModel(o);
  auto make = [&](KernelKind kind, MatmulPrecision p) {
    ModelRunnerOptions opt;
    opt.num_pages = 64;
    opt.num_threads = 2;
    opt.kernels = kind;
    opt.matmul = p;
    auto r = ModelRunner::Create(m->weights, opt);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  };
  const std::vector<int32_t> a = Tokens(70, 7, o.vocab), b = Tokens(5, 8, o.vocab);
  const std::vector<int32_t> pa = Pages(0, 5), pb = Pages(20, 1);
  auto run = [&](ModelRunner& r, bool with_b) {
    ForwardBatch batch;
    if (with_b) batch.seqs.push_back(SeqStep{2, 0, b, pb, true});
    batch.seqs.push_back(SeqStep{1, 0, a, pa, true});
    ForwardOutput out;
    const Status st = r.Forward(batch, &out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return st.ok() ? out.logits.back() : std::vector<float>();
  };
  auto ref_bf16 = make(KernelKind::kReference, MatmulPrecision::kBf16);
  auto ref_f32 = make(KernelKind::kReference, MatmulPrecision::kF32);
  ASSERT_TRUE(ref_bf16 && ref_f32);
  const std::vector<float> want = run(*ref_bf16, false), exact = run(*ref_f32, false);
  EXPECT_GT(RelError(want, exact), 1e-5);  // x rounded to bf16 changes the logits ...
  EXPECT_LT(RelError(want, exact), 5e-2);  // ... by bf16 rounding
  if (!MatmulBf16DotUsed(KernelKind::kFast, MatmulPrecision::kBf16))
    GTEST_SKIP() << "this CPU lacks AVX512_BF16: the fast kernels keep f32";
  auto alone = make(KernelKind::kFast, MatmulPrecision::kBf16);
  auto together = make(KernelKind::kFast, MatmulPrecision::kBf16);
  ASSERT_TRUE(alone && together);
  const std::vector<float> got = run(*alone, false);
  EXPECT_LT(RelError(got, want), 1e-2);
  EXPECT_EQ(run(*together, true), got);
}

TEST(RunnerMatmulPrecisionTest, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseMatmulPrecision("f32"), MatmulPrecision::kF32);
  EXPECT_EQ(*ParseMatmulPrecision("bf16"), MatmulPrecision::kBf16);
  const auto bad = ParseMatmulPrecision("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'fp8'"), std::string::npos) << bad.status().ToString();
  EXPECT_FALSE(MatmulBf16DotUsed(KernelKind::kFast, MatmulPrecision::kF32));
  EXPECT_TRUE(MatmulBf16DotUsed(KernelKind::kReference, MatmulPrecision::kBf16));
}

class RunnerBasicsTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = MakeTinyModel(TinyModelOptions{}); }
  Result<std::unique_ptr<ModelRunner>> Make(ModelRunnerOptions opt = {}) {
    if (opt.num_pages == 0 && opt.kv_cache_bytes == ModelRunnerOptions{}.kv_cache_bytes)
      opt.num_pages = 16;
    opt.num_threads = 2;
    return ModelRunner::Create(model_->weights, opt);
  }
  std::unique_ptr<TinyModel> model_;
};

TEST_F(RunnerBasicsTest, ProgressCountsLayersAcrossSteps) {
  auto r = Make();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ModelRunner& runner = **r;
  const int layers = model_->weights.config.num_layers;
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7};
  const std::vector<int32_t> pages = {3};
  bool reached = false;
  std::thread waiter([&] { reached = runner.progress().WaitAtLeast(2 * layers + 1, 60000); });
  for (int step = 0; step < 3; ++step) {
    ForwardBatch b;
    b.seqs.push_back(
        SeqStep{1, step * 2, std::span<const int32_t>(t).subspan(step * 2, 2), pages, step == 2});
    ForwardOutput out;
    ASSERT_TRUE(runner.Forward(b, &out).ok());
    EXPECT_EQ(runner.progress().Value(), static_cast<uint64_t>((step + 1) * layers));
  }
  waiter.join();
  EXPECT_TRUE(reached);
  EXPECT_EQ(runner.steps_done(), 3u);
  EXPECT_FALSE(runner.progress().WaitAtLeast(3 * layers + 1, 1));
  EXPECT_TRUE(runner.progress().WaitAtLeast(3 * layers, 0));
}

TEST_F(RunnerBasicsTest, LogitsAreFarFromUniform) {
  auto r = Make();
  ASSERT_TRUE(r.ok());
  const std::vector<int32_t> t = {5, 9, 11};
  const std::vector<int32_t> pages = {0};
  ForwardBatch b;
  b.seqs.push_back(SeqStep{1, 0, t, pages, true});
  ForwardOutput out;
  ASSERT_TRUE((*r)->Forward(b, &out).ok());
  const auto& l = out.logits[0];
  const float spread =
      *std::max_element(l.begin(), l.end()) - *std::min_element(l.begin(), l.end());
  EXPECT_GT(spread, 2.0f);
  for (float v : l) EXPECT_TRUE(std::isfinite(v));
}

TEST_F(RunnerBasicsTest, BadBatchesAreInvalidArgument) {
  auto r = Make();
  ASSERT_TRUE(r.ok());
  ModelRunner& runner = **r;
  const std::vector<int32_t> ok_tokens = {1, 2, 3};
  const std::vector<int32_t> bad_token = {1, 67, 3};
  const std::vector<int32_t> negative_token = {-1};
  const std::vector<int32_t> none;
  const std::vector<int32_t> page = {0}, bad_page = {16}, two = {0, 1};
  struct Bad {
    SeqStep step;
    const char* expect;
  };
  const Bad cases[] = {
      {SeqStep{1, 0, bad_token, page, true}, "token id 67"},
      {SeqStep{1, 0, negative_token, page, true}, "token id -1"},
      {SeqStep{1, 0, none, page, true}, "no tokens"},
      {SeqStep{1, -1, ok_tokens, page, true}, "negative start_pos"},
      {SeqStep{1, 15, ok_tokens, page, true}, "page table has 1 pages, 2 needed"},
      {SeqStep{1, 0, ok_tokens, bad_page, true}, "page id 16"},
      {SeqStep{1, 0, ok_tokens, none, true}, "page table has 0 pages"},
      {SeqStep{1, 254, ok_tokens, std::vector<int32_t>(17, 0), true}, "max_position_embeddings"},
  };
  for (const Bad& bad : cases) {
    ForwardBatch b;
    b.seqs.push_back(SeqStep{9, 0, ok_tokens, two, true});  // a good seq first: nothing runs
    b.seqs.push_back(bad.step);
    ForwardOutput out;
    Status s = runner.Forward(b, &out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad.expect;
    EXPECT_NE(s.message().find(bad.expect), std::string::npos) << s.message();
  }
  EXPECT_EQ(runner.steps_done(), 0u);
  EXPECT_EQ(runner.progress().Value(), 0u);
}

TEST_F(RunnerBasicsTest, CreateRejectsBadWeightsAndSizes) {
  model_->weights.layers[1].up_proj.data = nullptr;
  auto missing = Make();
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("model.layers.1.mlp.up_proj.weight"),
            std::string::npos);
  model_ = MakeTinyModel(TinyModelOptions{});
  model_->weights.layers[0].k_proj.shape = {5, 24};
  auto shape = Make();
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("expected shape [20, 24], found [5, 24]"),
            std::string::npos)
      << shape.status().message();
  model_ = MakeTinyModel(TinyModelOptions{});
  ModelRunnerOptions tiny;
  tiny.kv_cache_bytes = 100;
  auto small = Make(tiny);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("holds no page"), std::string::npos);
  ModelRunnerOptions zero_page;
  zero_page.kv.page_size = 0;
  EXPECT_EQ(Make(zero_page).status().code(), StatusCode::kInvalidArgument);
  ModelRunnerOptions sized;
  sized.kv_cache_bytes = 1 << 20;
  auto by_bytes = Make(sized);
  ASSERT_TRUE(by_bytes.ok());
  const KvCacheSpec& spec = (*by_bytes)->region().spec();
  EXPECT_EQ(spec.num_kv_heads, 2);
  EXPECT_EQ(spec.head_dim, 10);
  EXPECT_EQ((*by_bytes)->region().num_pages(),
            static_cast<int>((1 << 20) / (spec.page_bytes() * 2)));
}

}  // namespace
}  // namespace pd::engine
