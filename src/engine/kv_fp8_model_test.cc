// An fp8_e4m3 KV cache on tiny models (llama HND and NHD, qwen3, deepseek_v3's MLA latent): the
// logits of chunked prefill, decode and a preemption's recompute stay within kFp8KvLogitsTol of
// the same steps over an f32 cache, and the cache takes a quarter of f32's bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/mla_test_util.h"
#include "engine/model_runner.h"
#include "engine/model_runner_test_util.h"

namespace pd::engine {
namespace {

using model::Arch;
using testing::MakeTinyMlaModel;
using testing::MakeTinyModel;
using testing::RelError;
using testing::TinyModel;
using testing::Tokens;

// max |fp8 - f32| / max |f32| over a logits row, the bound docs/engine.md states. Measured over
// every step below: llama 0.027 (HND and NHD), qwen3 0.030, deepseek_v3's latent 0.030; the
// power-of-two scales 0.5 / 2.0 give the same (they move the exponent only). e4m3 keeps 3
// mantissa bits: each K/V element is within 2^-4 (relative) of its value.
constexpr double kFp8KvLogitsTol = 5e-2;

struct Case {
  const char* name;
  Arch arch;
  KvLayout layout;
  int page_size;
  bool scaled;  // layer scales 0.5 / 2.0 instead of the checkpoint-less 1.0
};

class Fp8KvModelTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (GetParam().arch == Arch::kDeepseekV3) {
      model_ = MakeTinyMlaModel({});
    } else {
      testing::TinyModelOptions o;
      o.arch = GetParam().arch;
      model_ = MakeTinyModel(o);
    }
    if (GetParam().scaled) {
      model_->weights.kv_scales.assign(model_->weights.config.num_layers, {0.5f, 2.0f});
      model_->weights.kv_scales[0] = {2.0f, 0.5f};
    }
  }
  std::unique_ptr<ModelRunner> Make(KvDType dtype, KernelKind kind) {
    ModelRunnerOptions opt;
    opt.kv.page_size = GetParam().page_size;
    opt.kv.layout = GetParam().layout;
    opt.kv.dtype = dtype;
    opt.num_pages = 64;
    opt.num_threads = 2;
    opt.kernels = kind;
    auto r = ModelRunner::Create(model_->weights, opt);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::vector<int32_t> Pages(int first, int tokens) const {
    const int n = (tokens + GetParam().page_size - 1) / GetParam().page_size;
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = first + n - 1 - i;  // out of order: exercise the table
    return p;
  }
  // Tokens [begin, end) as one step; the last token's logits.
  static std::vector<float> Step(ModelRunner& r, const std::vector<int32_t>& t,
                                 const std::vector<int32_t>& pages, int begin, int end) {
    ForwardBatch b;
    b.seqs.push_back(
        SeqStep{1, begin, std::span<const int32_t>(t).subspan(begin, end - begin), pages, true});
    ForwardOutput out;
    const Status s = r.Forward(b, &out);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return s.ok() ? out.logits[0] : std::vector<float>();
  }
  // Prefill of `prompt` tokens in chunks of `chunk`, then one decode step per further token: the
  // logits after the prefill and after each decode.
  std::vector<std::vector<float>> Run(ModelRunner& r, const std::vector<int32_t>& t,
                                      const std::vector<int32_t>& pages, int prompt, int chunk) {
    std::vector<std::vector<float>> logits;
    std::vector<float> last;
    for (int b = 0; b < prompt; b += chunk)
      last = Step(r, t, pages, b, std::min(prompt, b + chunk));
    logits.push_back(last);
    for (int p = prompt; p < static_cast<int>(t.size()); ++p)
      logits.push_back(Step(r, t, pages, p, p + 1));
    return logits;
  }

  std::unique_ptr<TinyModel> model_;
};

// f32 cache, whole prefill then decode, against an fp8 cache with chunked prefill then decode
// (reference and fast kernels), and an fp8 run preempted after two decodes: its pages dropped,
// prompt and generated tokens recomputed into other pages in chunks, decode resumed.
TEST_P(Fp8KvModelTest, LogitsStayWithinToleranceOfF32Cache) {
  const int vocab = model_->weights.config.vocab_size;
  constexpr int kPrompt = 21, kTotal = 27, kPreemptAt = 23;
  const std::vector<int32_t> t = Tokens(kTotal, 9, vocab);
  const std::vector<int32_t> pages = Pages(0, kTotal), other = Pages(32, kTotal);
  auto f32 = Make(KvDType::kF32, KernelKind::kFast);
  ASSERT_TRUE(f32);
  const auto want = Run(*f32, t, pages, kPrompt, kPrompt);
  double worst = 0;
  for (KernelKind kind : {KernelKind::kReference, KernelKind::kFast}) {
    auto fp8 = Make(KvDType::kFP8E4M3, kind);
    ASSERT_TRUE(fp8);
    EXPECT_EQ(fp8->region().spec().dtype, KvDType::kFP8E4M3);
    const auto got = Run(*fp8, t, pages, kPrompt, 8);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); ++s) {
      const double e = RelError(got[s], want[s]);
      worst = std::max(worst, e);
      EXPECT_LT(e, kFp8KvLogitsTol) << "step " << s;
      EXPECT_GT(e, 0.0) << "step " << s << ": an fp8 cache rounds K/V, logits cannot be exact";
    }
  }
  // Preemption: recompute [0, kPreemptAt) in chunks of 5 into `other`, then decode to the end.
  auto fp8 = Make(KvDType::kFP8E4M3, KernelKind::kFast);
  ASSERT_TRUE(fp8);
  Run(*fp8, std::vector<int32_t>(t.begin(), t.begin() + kPreemptAt), pages, kPrompt, 8);
  const auto resumed = Run(*fp8, t, other, kPreemptAt, 5);
  for (size_t s = 0; s < resumed.size(); ++s) {
    const double e = RelError(resumed[s], want[kPreemptAt - kPrompt + s]);
    worst = std::max(worst, e);
    EXPECT_LT(e, kFp8KvLogitsTol) << "after preemption, step " << s;
  }
  std::printf("[ fp8 KV ] %s: max relative logits error against the f32 cache %.3g\n",
              GetParam().name, worst);
}

// The cache holds a quarter of f32's bytes per page (half of bf16's).
TEST_P(Fp8KvModelTest, PagesTakeAQuarterOfF32Bytes) {
  auto f32 = Make(KvDType::kF32, KernelKind::kReference);
  auto bf16 = Make(KvDType::kBF16, KernelKind::kReference);
  auto fp8 = Make(KvDType::kFP8E4M3, KernelKind::kReference);
  ASSERT_TRUE(f32 && bf16 && fp8);
  EXPECT_EQ(fp8->region().spec().page_bytes() * 4, f32->region().spec().page_bytes());
  EXPECT_EQ(fp8->region().spec().page_bytes() * 2, bf16->region().spec().page_bytes());
  const model::KvScales want =
      GetParam().scaled ? model::KvScales{2.0f, 0.5f} : model::KvScales{1.0f, 1.0f};
  EXPECT_EQ(fp8->region().spec().LayerScales(0), want);
  EXPECT_EQ(f32->region().spec().LayerScales(0), model::KvScales{}) << "only fp8 uses scales";
}

INSTANTIATE_TEST_SUITE_P(
    Models, Fp8KvModelTest,
    ::testing::Values(Case{"llama_hnd", Arch::kLlama, KvLayout::kHND, 3, false},
                      Case{"llama_nhd", Arch::kLlama, KvLayout::kNHD, 16, false},
                      Case{"llama_nhd_scaled", Arch::kLlama, KvLayout::kNHD, 4, true},
                      Case{"qwen3_hnd", Arch::kQwen3, KvLayout::kHND, 5, false},
                      Case{"deepseek_v3_latent", Arch::kDeepseekV3, KvLayout::kHND, 3, false},
                      Case{"deepseek_v3_latent_scaled", Arch::kDeepseekV3, KvLayout::kHND, 16,
                           true}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pd::engine
