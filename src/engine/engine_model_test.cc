// The Engine on real (synthetic, HF-layout) models: greedy tokens do not depend on the batch,
// the chunking, the KV layout, the page size or preemption.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "engine/engine.h"
#include "engine/engine_model_test_util.h"
#include "model/weights.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;

const model::ModelWeights& TinyModel(model::Arch arch) { return testing::SyntheticTinyModel(arch); }

struct EngineSetup {
  KvLayout layout = KvLayout::kHND;
  KvDType dtype = KvDType::kF32;
  int page_size = 16;
  int budget = 512;   // 8: prefill chunks of at most 8 - (running decodes) tokens
  int num_pages = 0;  // 0: plenty
};

std::unique_ptr<Engine> MakeEngine(const model::ModelWeights& w, const EngineSetup& s) {
  EngineOptions o;
  o.runner.kv.layout = s.layout;
  o.runner.kv.dtype = s.dtype;
  o.runner.kv.page_size = s.page_size;
  o.runner.num_pages = s.num_pages > 0 ? s.num_pages : 600 / s.page_size + 16;
  o.runner.num_threads = 2;
  o.scheduler.max_num_batched_tokens = s.budget;
  o.scheduler.max_num_seqs = 8;
  o.scheduler.max_model_len = 256;
  auto engine = Engine::Create(w, o);
  PD_CHECK(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

std::vector<int32_t> PromptOf(int len, int salt, int vocab) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = (i * 37 + salt * 101 + 3) % vocab;
  return p;
}

Request GreedyRequest(int64_t id, std::vector<int32_t> prompt, int max_tokens) {
  Request r;
  r.id = id;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

std::map<int64_t, std::vector<int32_t>> RunAll(Engine& engine) {
  std::map<int64_t, std::vector<int32_t>> tokens;
  while (engine.HasWork()) {
    auto outputs = engine.Step();
    PD_CHECK(outputs.ok()) << outputs.status().ToString();
    for (const RequestOutput& out : *outputs) {
      EXPECT_NE(out.finish_reason, FinishReason::kError) << out.error.ToString();
      auto& t = tokens[out.request_id];
      t.insert(t.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    }
  }
  return tokens;
}

constexpr int kLengths[8] = {11, 1, 7, 23, 4, 16, 2, 30};
constexpr int kMaxTokens[8] = {10, 6, 12, 3, 9, 5, 8, 4};

// Request i alone in an engine set up as `s`.
std::vector<int32_t> Alone(model::Arch arch, const EngineSetup& s, int i = 0) {
  const model::ModelWeights& w = TinyModel(arch);
  auto engine = MakeEngine(w, s);
  PD_CHECK(engine
               ->AddRequest(
                   GreedyRequest(i, PromptOf(kLengths[i], i, w.config.vocab_size), kMaxTokens[i]))
               .ok());
  return RunAll(*engine)[i];
}

// The reference: each request alone, whole prompt, HND, pages of 16 (computed once per arch).
const std::vector<std::vector<int32_t>>& Reference(model::Arch arch) {
  static auto* refs = new std::map<model::Arch, std::vector<std::vector<int32_t>>>();
  auto it = refs->find(arch);
  if (it != refs->end()) return it->second;
  std::vector<std::vector<int32_t>> r;
  for (int i = 0; i < 8; ++i) r.push_back(Alone(arch, EngineSetup{}, i));
  return refs->emplace(arch, std::move(r)).first->second;
}

class EngineModelTest
    : public ::testing::TestWithParam<std::tuple<model::Arch, KvLayout, int, int>> {};

TEST_P(EngineModelTest, GreedyTokensAreTheSameWhateverTheBatch) {
  auto [arch, layout, page_size, budget] = GetParam();
  const model::ModelWeights& w = TinyModel(arch);
  const auto& want = Reference(arch);
  std::set<std::vector<int32_t>> distinct(want.begin(), want.end());
  ASSERT_GE(distinct.size(), 6u) << "the model's tokens should depend on the prompt";
  EngineSetup s;
  s.layout = layout;
  s.page_size = page_size;
  s.budget = budget;
  EXPECT_EQ(Alone(arch, s, 0), want[0]) << "alone";
  EXPECT_EQ(Alone(arch, s, 7), want[7]) << "alone";
  auto engine = MakeEngine(w, s);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(engine
                    ->AddRequest(GreedyRequest(i, PromptOf(kLengths[i], i, w.config.vocab_size),
                                               kMaxTokens[i]))
                    .ok());
  }
  auto tokens = RunAll(*engine);
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(want[i].size(), static_cast<size_t>(kMaxTokens[i]));
    EXPECT_EQ(tokens[i], want[i]) << "request " << i << " batched with 7 others";
  }
  EXPECT_EQ(engine->stats().num_free_pages, engine->stats().num_total_pages);
}

std::string ParamName(
    const ::testing::TestParamInfo<std::tuple<model::Arch, KvLayout, int, int>>& info) {
  auto [arch, layout, page_size, budget] = info.param;
  return std::string(model::ArchName(arch)) + "_" + std::string(KvLayoutName(layout)) + "_page" +
         std::to_string(page_size) + (budget < 100 ? "_chunked" : "_whole");
}

INSTANTIATE_TEST_SUITE_P(ArchLayoutPageChunk, EngineModelTest,
                         ::testing::Combine(::testing::Values(model::Arch::kQwen3,
                                                              model::Arch::kQwen2,
                                                              model::Arch::kLlama),
                                            ::testing::Values(KvLayout::kHND, KvLayout::kNHD),
                                            ::testing::Values(1, 3, 16), ::testing::Values(8, 512)),
                         ParamName);

TEST(EngineModelMiscTest, Bf16KvCacheIsBatchInvariantToo) {
  EngineSetup s;
  s.dtype = KvDType::kBF16;
  s.page_size = 3;
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 8; ++i) want.push_back(Alone(model::Arch::kQwen3, s, i));
  s.budget = 8;
  const model::ModelWeights& w = TinyModel(model::Arch::kQwen3);
  auto engine = MakeEngine(w, s);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(engine
                    ->AddRequest(GreedyRequest(i, PromptOf(kLengths[i], i, w.config.vocab_size),
                                               kMaxTokens[i]))
                    .ok());
  }
  auto tokens = RunAll(*engine);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(tokens[i], want[i]) << "request " << i;
}

TEST(EngineModelMiscTest, PreemptionUnderATinyPoolGivesTheSameGreedyTokens) {
  const model::ModelWeights& w = TinyModel(model::Arch::kLlama);
  EngineSetup roomy;
  roomy.page_size = 4;
  auto engine = MakeEngine(w, roomy);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(engine
                    ->AddRequest(GreedyRequest(i, PromptOf(kLengths[i], i, w.config.vocab_size),
                                               kMaxTokens[i] + 6))
                    .ok());
  }
  auto want = RunAll(*engine);
  EngineSetup tight = roomy;
  tight.num_pages = 10;  // 40 tokens: the longest request (30 + 10) just fits
  engine = MakeEngine(w, tight);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(engine
                    ->AddRequest(GreedyRequest(i, PromptOf(kLengths[i], i, w.config.vocab_size),
                                               kMaxTokens[i] + 6))
                    .ok());
  }
  auto got = RunAll(*engine);
  EXPECT_GT(engine->stats().num_preemptions, 0);
  EXPECT_EQ(got, want);
  EXPECT_EQ(engine->stats().num_free_pages, 10);
}

// An fp8_e4m3 cache (llama and deepseek_v3's latent): preemption under a tiny pool recomputes the
// same codes, so the greedy tokens equal those of a roomy pool.
TEST(EngineModelMiscTest, Fp8KvCacheKeepsGreedyTokensUnderPreemption) {
  for (model::Arch arch : {model::Arch::kLlama, model::Arch::kDeepseekV3}) {
    const model::ModelWeights& w = TinyModel(arch);
    EngineSetup s;
    s.dtype = KvDType::kFP8E4M3;
    s.page_size = 4;
    s.budget = 8;  // chunked prefill
    std::map<int64_t, std::vector<int32_t>> runs[2];
    for (int tight = 0; tight < 2; ++tight) {
      s.num_pages = tight ? 10 : 0;  // 40 tokens: the longest request (30 + 10) just fits
      auto engine = MakeEngine(w, s);
      for (int i = 0; i < 8; ++i) {
        ASSERT_TRUE(engine
                        ->AddRequest(GreedyRequest(i, PromptOf(kLengths[i], i, w.config.vocab_size),
                                                   kMaxTokens[i] + 6))
                        .ok());
      }
      runs[tight] = RunAll(*engine);
      if (tight) {
        EXPECT_GT(engine->stats().num_preemptions, 0) << model::ArchName(arch);
      }
    }
    EXPECT_EQ(runs[1], runs[0]) << model::ArchName(arch);
  }
}

TEST(EngineModelMiscTest, AbortFreesPagesAndInvalidRequestsAreRefused) {
  const model::ModelWeights& w = TinyModel(model::Arch::kQwen2);
  EngineSetup s;
  s.page_size = 3;
  auto engine = MakeEngine(w, s);
  const int total = engine->stats().num_total_pages;
  ASSERT_TRUE(engine->AddRequest(GreedyRequest(1, PromptOf(20, 1, 512), 50)).ok());
  ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(engine->stats().num_free_pages, total - 7);
  engine->Abort(1);
  EXPECT_EQ(engine->stats().num_free_pages, total);
  auto outputs = engine->Step();
  ASSERT_TRUE(outputs.ok());
  ASSERT_EQ(outputs->size(), 1u);
  EXPECT_EQ((*outputs)[0].finish_reason, FinishReason::kAbort);

  Status bad = engine->AddRequest(GreedyRequest(2, {1, 512}, 4));
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("prompt_ids[1] = 512"));
  bad = engine->AddRequest(GreedyRequest(3, PromptOf(250, 1, 512), 10));
  EXPECT_THAT(bad.message(), HasSubstr("max_model_len 256"));
}

}  // namespace
}  // namespace pd::engine
