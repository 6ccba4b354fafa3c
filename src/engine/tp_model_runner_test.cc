// Tensor-parallel runner: greedy tokens at TP 1/2/4 equal a TP 1 run for every KV head count
// (including replicated KV heads), layout and chunking; logits stay close; bad sizes are refused
// with the numbers; per-rank regions; nothing leaks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "engine/engine.h"
#include "engine/mla_test_util.h"
#include "engine/model_runner.h"
#include "engine/model_runner_test_util.h"
#include "engine/moe_test_util.h"
#include "engine/tp_all_reduce.h"
#include "engine/tp_shard.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;
using testing::MakeTinyModel;
using testing::TinyModel;
using testing::TinyModelOptions;

// 8 query heads, MLP width 48, vocab 67 (not a multiple of 2 or 4: uneven lm_head slices).
const TinyModel& Model(int kv_heads, model::Arch arch = model::Arch::kQwen2,
                       model::DType dtype = model::DType::kBF16) {
  static auto* models =
      new std::map<std::tuple<int, model::Arch, model::DType>, std::unique_ptr<TinyModel>>();
  auto key = std::make_tuple(kv_heads, arch, dtype);
  auto it = models->find(key);
  if (it != models->end()) return *it->second;
  TinyModelOptions o;
  o.arch = arch;
  o.dtype = dtype;
  o.seed = 11 + kv_heads;
  o.vocab = 67;
  o.hidden = 32;
  o.intermediate = 48;
  o.layers = 2;
  o.heads = 8;
  o.kv_heads = kv_heads;
  o.head_dim = 8;
  return *models->emplace(key, MakeTinyModel(o)).first->second;
}

int NumThreadsOfProcess() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

std::unique_ptr<Engine> MakeEngine(const model::ModelWeights& w, int tp, KvLayout layout,
                                   int budget) {
  EngineOptions o;
  o.runner.kv.layout = layout;
  o.runner.kv.page_size = 4;
  o.runner.num_pages = 64;
  o.runner.num_threads = 1;
  o.runner.tensor_parallel_size = tp;
  o.scheduler.max_num_batched_tokens = budget;
  o.scheduler.max_num_seqs = 4;
  o.scheduler.max_model_len = 128;
  auto engine = Engine::Create(w, o);
  PD_CHECK(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

constexpr int kLengths[3] = {13, 5, 21};
constexpr int kMaxTokens[3] = {8, 10, 6};

std::vector<int32_t> PromptOf(int len, int salt, int vocab) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = (i * 37 + salt * 101 + 3) % vocab;
  return p;
}

// Three requests batched together; tokens by request id. Checks every page is free at the end.
std::map<int64_t, std::vector<int32_t>> Generate(const model::ModelWeights& w, int tp,
                                                 KvLayout layout, int budget) {
  auto engine = MakeEngine(w, tp, layout, budget);
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.id = i;
    r.prompt_ids = PromptOf(kLengths[i], i, w.config.vocab_size);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = kMaxTokens[i];
    r.sampling.ignore_eos = true;
    PD_CHECK(engine->AddRequest(std::move(r)).ok());
  }
  std::map<int64_t, std::vector<int32_t>> tokens;
  while (engine->HasWork()) {
    auto outputs = engine->Step();
    PD_CHECK(outputs.ok()) << outputs.status().ToString();
    for (const RequestOutput& out : *outputs) {
      EXPECT_NE(out.finish_reason, FinishReason::kError) << out.error.ToString();
      auto& t = tokens[out.request_id];
      t.insert(t.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    }
  }
  EXPECT_EQ(engine->stats().num_free_pages, engine->stats().num_total_pages) << "leaked pages";
  return tokens;
}

class TpGreedyTest : public ::testing::TestWithParam<std::tuple<int, int, KvLayout, int>> {};

TEST_P(TpGreedyTest, TokensEqualTp1) {
  auto [kv_heads, tp, layout, budget] = GetParam();
  const model::ModelWeights& w = Model(kv_heads).weights;
  static auto* refs = new std::map<int, std::map<int64_t, std::vector<int32_t>>>();
  if (!refs->count(kv_heads))
    (*refs)[kv_heads] = Generate(w, 1, KvLayout::kHND, 512);  // TP 1, whole prompts
  const auto& want = (*refs)[kv_heads];
  std::set<std::vector<int32_t>> distinct;
  for (const auto& [id, t] : want) distinct.insert(t);
  ASSERT_EQ(distinct.size(), 3u) << "tokens should depend on the prompt";
  const int threads_before = NumThreadsOfProcess();
  auto got = Generate(w, tp, layout, budget);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(want.at(i).size(), static_cast<size_t>(kMaxTokens[i]));
    EXPECT_EQ(got[i], want.at(i)) << "request " << i;
  }
  EXPECT_EQ(NumThreadsOfProcess(), threads_before) << "rank threads left behind";
}

std::string GreedyName(const ::testing::TestParamInfo<std::tuple<int, int, KvLayout, int>>& info) {
  auto [kv_heads, tp, layout, budget] = info.param;
  return "kv" + std::to_string(kv_heads) + "_tp" + std::to_string(tp) + "_" +
         std::string(KvLayoutName(layout)) + (budget < 100 ? "_chunked" : "_whole");
}

INSTANTIATE_TEST_SUITE_P(KvTpLayoutChunk, TpGreedyTest,
                         ::testing::Combine(::testing::Values(1, 2, 4, 8),
                                            ::testing::Values(1, 2, 4),
                                            ::testing::Values(KvLayout::kHND, KvLayout::kNHD),
                                            ::testing::Values(6, 512)),
                         GreedyName);

// Prefill a prompt, then decode a few tokens, at TP `tp`; the logits of every step.
std::vector<std::vector<float>> StepLogits(const model::ModelWeights& w, int tp,
                                           KernelKind kernels = KernelKind::kFast) {
  ModelRunnerOptions o;
  o.kernels = kernels;
  o.kv.page_size = 4;
  o.num_pages = 16;
  o.num_threads = 2;
  o.tensor_parallel_size = tp;
  auto runner = ModelRunner::Create(w, o);
  PD_CHECK(runner.ok()) << runner.status().ToString();
  std::vector<int32_t> pages = {3, 9, 1, 12, 5, 7, 2, 11};
  std::vector<int32_t> prompt = PromptOf(17, 5, w.config.vocab_size);
  std::vector<std::vector<float>> logits;
  ForwardBatch b;
  b.seqs.push_back(SeqStep{0, 0, prompt, pages, true});
  ForwardOutput out;
  PD_CHECK((*runner)->Forward(b, &out).ok());
  logits.push_back(out.logits[0]);
  std::vector<int32_t> tok(1);
  for (int s = 0; s < 4; ++s) {
    tok[0] = static_cast<int32_t>(std::max_element(logits.back().begin(), logits.back().end()) -
                                  logits.back().begin());
    b.seqs[0] = SeqStep{0, 17 + s, tok, pages, true};
    PD_CHECK((*runner)->Forward(b, &out).ok());
    logits.push_back(out.logits[0]);
  }
  EXPECT_EQ((*runner)->steps_done(), 5u);
  EXPECT_EQ((*runner)->progress().Value(), 5u * w.config.num_layers);
  return logits;
}

TEST(TpLogitsTest, CloseToTp1AndDeterministic) {
  double worst = 0;
  for (model::Arch arch : {model::Arch::kQwen2, model::Arch::kQwen3, model::Arch::kLlama})
    for (int kv : {1, 2, 4, 8}) {
      const model::ModelWeights& w = Model(kv, arch).weights;
      const auto ref = StepLogits(w, 1);
      for (int tp : {2, 4}) {
        const auto got = StepLogits(w, tp);
        EXPECT_EQ(got, StepLogits(w, tp)) << "TP " << tp << " is not deterministic";
        ASSERT_EQ(got.size(), ref.size());
        for (size_t s = 0; s < ref.size(); ++s) {
          ASSERT_EQ(got[s].size(), ref[s].size());
          double diff = 0, scale = 1e-30;
          for (size_t i = 0; i < ref[s].size(); ++i) {
            diff = std::max(diff, double(std::fabs(got[s][i] - ref[s][i])));
            scale = std::max(scale, double(std::fabs(ref[s][i])));
          }
          EXPECT_LT(diff / scale, 1e-4)
              << model::ArchName(arch) << " kv " << kv << " tp " << tp << " step " << s;
          worst = std::max(worst, diff / scale);
        }
      }
    }
  std::printf("max |logit difference| / max |logit| TP 2,4 vs TP 1: %.3g\n", worst);
  RecordProperty("max_rel_logit_diff", std::to_string(worst));
}

TEST(TpLogitsTest, F32AndF16WeightsAndReferenceKernelsToo) {
  for (model::DType dtype : {model::DType::kF32, model::DType::kF16})
    for (KernelKind kernels : {KernelKind::kFast, KernelKind::kReference}) {
      const model::ModelWeights& w = Model(2, model::Arch::kLlama, dtype).weights;
      const auto ref = StepLogits(w, 1, kernels);
      const auto got = StepLogits(w, 4, kernels);
      ASSERT_EQ(got.size(), ref.size());
      for (size_t s = 0; s < ref.size(); ++s) {
        ASSERT_EQ(got[s].size(), ref[s].size());
        for (size_t i = 0; i < ref[s].size(); ++i)
          ASSERT_NEAR(got[s][i], ref[s][i], 1e-3)
              << model::DTypeName(dtype) << (kernels == KernelKind::kFast ? " fast" : " ref");
      }
    }
}

TEST(TpRunnerTest, OneRegionPerRankWithTheRankHeads) {
  const model::ModelWeights& w = Model(2).weights;
  for (int tp : {1, 2, 4}) {
    ModelRunnerOptions o;
    o.num_pages = 10;
    o.kv.page_size = 4;
    o.num_threads = 1;
    o.tensor_parallel_size = tp;
    auto runner = ModelRunner::Create(w, o);
    ASSERT_TRUE(runner.ok()) << runner.status().ToString();
    ModelRunner& r = **runner;
    ASSERT_EQ(r.num_ranks(), tp);
    EXPECT_EQ(&r.region(), &r.rank_region(0));
    EXPECT_EQ(r.config().num_kv_heads, 2) << "config() is the model's";
    EXPECT_EQ(r.config().num_heads, 8);
    std::set<int> fds;
    for (int k = 0; k < tp; ++k) {
      const KvRegion& region = r.rank_region(k);
      EXPECT_EQ(region.num_pages(), 10);
      EXPECT_EQ(region.spec().num_kv_heads, tp <= 2 ? 2 / tp : 1) << "rank " << k;
      fds.insert(region.fd());
    }
    EXPECT_EQ(fds.size(), static_cast<size_t>(tp)) << "each rank has its own memfd region";
  }
}

TEST(TpRunnerTest, KvCacheBytesIsTheInstanceTotal) {
  ModelRunnerOptions o;
  o.kv.page_size = 4;
  o.kv.dtype = KvDType::kF32;
  o.num_threads = 1;
  // One page over all layers and ranks, KV heads split: 4 tokens * 4 heads * 2 * 8 dims * 4 bytes
  // * 2 layers = 2 KiB whatever the TP.
  o.kv_cache_bytes = 20 * 1024;
  for (int tp : {1, 2, 4}) {
    o.tensor_parallel_size = tp;
    auto runner = ModelRunner::Create(Model(4).weights, o);
    ASSERT_TRUE(runner.ok()) << runner.status().ToString();
    EXPECT_EQ((*runner)->region().num_pages(), 10) << "tp " << tp;
  }
  // One KV head replicated on 4 ranks: a page costs 4 times its TP 1 size.
  o.tensor_parallel_size = 1;
  auto tp1 = ModelRunner::Create(Model(1).weights, o);
  o.tensor_parallel_size = 4;
  auto tp4 = ModelRunner::Create(Model(1).weights, o);
  ASSERT_TRUE(tp1.ok() && tp4.ok());
  EXPECT_EQ((*tp1)->region().num_pages(), 40);
  EXPECT_EQ((*tp4)->region().num_pages(), 10);
  EXPECT_EQ((*tp4)->rank_region(3).num_pages(), 10);
}

TEST(TpShardTest, KvHeadsFollowTheShardPlanRule) {
  model::ModelConfig c = Model(1).weights.config;
  for (int h : {1, 2, 4, 8})
    for (int t : {1, 2, 4, 8}) {
      c.num_kv_heads = h;
      ASSERT_TRUE(ValidateTensorParallel(c, t).ok());
      std::vector<int> holders(h, 0);
      for (int r = 0; r < t; ++r) {
        const TpShard s = ComputeTpShard(c, t, r);
        // kv_heads.h: t <= H: [r*H/t, (r+1)*H/t); t > H: head r / (t/H).
        if (t <= h) {
          EXPECT_EQ(s.kv_head_begin, r * h / t);
          EXPECT_EQ(s.num_kv_heads, h / t);
        } else {
          EXPECT_EQ(s.kv_head_begin, r / (t / h));
          EXPECT_EQ(s.num_kv_heads, 1);
        }
        // The rank's query heads all attend to its KV heads.
        const int group = c.num_heads / h;
        EXPECT_EQ(s.head_begin / group, s.kv_head_begin);
        EXPECT_EQ((s.head_begin + s.num_heads - 1) / group, s.kv_head_begin + s.num_kv_heads - 1);
        for (int k = 0; k < s.num_kv_heads; ++k) ++holders[s.kv_head_begin + k];
      }
      for (int k = 0; k < h; ++k) EXPECT_EQ(holders[k], std::max(1, t / h)) << "head " << k;
    }
}

TEST(TpShardTest, VocabSlicesCoverTheVocabOnce) {
  const model::ModelConfig& c = Model(1).weights.config;  // vocab 67
  for (int t : {2, 4, 8}) {
    int64_t next = 0;
    for (int r = 0; r < t; ++r) {
      const TpShard s = ComputeTpShard(c, t, r);
      EXPECT_EQ(s.vocab_begin, next);
      next += s.vocab;
    }
    EXPECT_EQ(next, c.vocab_size);
  }
}

Status CreateWith(int heads, int kv_heads, int intermediate, int tp) {
  TinyModelOptions o;
  o.heads = heads;
  o.kv_heads = kv_heads;
  o.intermediate = intermediate;
  o.hidden = 24;
  o.head_dim = 4;
  auto m = MakeTinyModel(o);
  ModelRunnerOptions ro;
  ro.num_pages = 4;
  ro.num_threads = 1;
  ro.tensor_parallel_size = tp;
  auto r = ModelRunner::Create(m->weights, ro);
  return r.ok() ? OkStatus() : r.status();
}

TEST(TpRunnerTest, BadSizesAreRefusedWithTheNumbers) {
  Status s = CreateWith(6, 2, 48, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor_parallel_size 4 does not divide num_attention_heads 6"));
  s = CreateWith(8, 8, 50, 4);
  EXPECT_THAT(s.message(), HasSubstr("tensor_parallel_size 4 does not divide the MLP width "
                                     "intermediate_size 50"));
  s = CreateWith(12, 6, 48, 4);
  EXPECT_THAT(s.message(), HasSubstr("tensor-parallel size 4 does not divide the 6 KV heads"));
  s = CreateWith(12, 4, 48, 6);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor-parallel size 6 exceeds the 4 KV heads and is not a multiple"));
  s = CreateWith(8, 2, 48, 0);
  EXPECT_THAT(s.message(), HasSubstr("tensor_parallel_size 0 must be at least 1"));
  s = CreateWith(8, 2, 48, -2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(CreateWith(8, 2, 48, 8).ok());
}

TEST(TpRunnerTest, BadBatchFailsOnEveryRankAndTheNextStepWorks) {
  const model::ModelWeights& w = Model(2).weights;
  ModelRunnerOptions o;
  o.kv.page_size = 4;
  o.num_pages = 8;
  o.num_threads = 1;
  o.tensor_parallel_size = 2;
  auto runner = ModelRunner::Create(w, o);
  ASSERT_TRUE(runner.ok());
  std::vector<int32_t> pages = {0, 1}, bad_pages = {0, 99};
  std::vector<int32_t> tokens = PromptOf(6, 1, w.config.vocab_size);
  ForwardBatch b;
  b.seqs.push_back(SeqStep{0, 0, tokens, bad_pages, true});
  ForwardOutput out;
  Status s = (*runner)->Forward(b, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("page id 99"));
  b.seqs[0].page_table = pages;
  ASSERT_TRUE((*runner)->Forward(b, &out).ok());
  EXPECT_EQ(out.logits[0].size(), static_cast<size_t>(w.config.vocab_size));
  EXPECT_EQ(out.last_hidden[0].size(), static_cast<size_t>(w.config.hidden_size));
  EXPECT_EQ((*runner)->steps_done(), 1u);
}

TEST(TpAllReduceTest, EveryRankSeesEveryPartialOfTheSameRound) {
  constexpr int kRanks = 4, kRounds = 2000;
  TpAllReduce reduce(kRanks);
  std::vector<int> errors(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      float mine = 0;
      for (int round = 0; round < kRounds; ++round) {
        mine = static_cast<float>(round * kRanks + r);  // rewritten only after Depart
        reduce.Arrive(r, &mine);
        float sum = 0;
        for (int k = 0; k < kRanks; ++k) {
          if (*reduce.Parts()[k] != static_cast<float>(round * kRanks + k)) ++errors[r];
          sum += *reduce.Parts()[k];
        }
        if (sum != static_cast<float>(round * kRanks * kRanks + kRanks * (kRanks - 1) / 2))
          ++errors[r];
        reduce.Depart();
      }
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], 0) << "rank " << r;
}

TEST(TpRunnerTest, TheLeaderAloneTracesLayers) {
  const model::ModelWeights& w = Model(2).weights;
  Tracer tracer;
  ModelRunnerOptions o;
  o.kv.page_size = 4;
  o.num_pages = 8;
  o.num_threads = 1;
  o.tensor_parallel_size = 2;
  o.tracer = &tracer;
  auto runner = ModelRunner::Create(w, o);
  ASSERT_TRUE(runner.ok());
  std::vector<int32_t> pages = {0, 1}, tokens = PromptOf(5, 2, w.config.vocab_size);
  ForwardBatch b;
  b.seqs.push_back(SeqStep{0, 0, tokens, pages, true});
  ForwardOutput out;
  ASSERT_TRUE((*runner)->Forward(b, &out).ok());
  EXPECT_EQ(tracer.num_events(), static_cast<size_t>(w.config.num_layers));
  for (const TraceEvent& e : tracer.Events()) EXPECT_EQ(e.tid, Tracer::CurrentThreadId());
}

TEST(TpRunnerTest, ThreadsAreJoinedAtShutdown) {
  const int before = NumThreadsOfProcess();
  {
    ModelRunnerOptions o;
    o.num_pages = 4;
    o.num_threads = 2;
    o.tensor_parallel_size = 4;
    auto runner = ModelRunner::Create(Model(4).weights, o);
    ASSERT_TRUE(runner.ok());
    // 3 rank threads + 4 ranks x 1 pool worker.
    EXPECT_EQ(NumThreadsOfProcess(), before + 3 + 4);
  }
  EXPECT_EQ(NumThreadsOfProcess(), before);
}

// A qwen3_moe-shaped model: layer 0 sparse (6 experts of width 16, top 2), layer 1 dense
// (mlp_only_layers). sigmoid: deepseek_v3's router instead (3 groups, 2 kept, norm, scaling 2)
// with a shared expert.
const TinyModel& MoeModel(bool sigmoid) {
  static auto* models = new std::map<bool, std::unique_ptr<TinyModel>>();
  auto it = models->find(sigmoid);
  if (it != models->end()) return *it->second;
  TinyModelOptions o;
  o.arch = model::Arch::kQwen3Moe;
  o.dtype = model::DType::kBF16;
  o.seed = 29;
  o.hidden = 32;
  o.intermediate = 48;
  o.heads = 8;
  o.kv_heads = 2;
  o.head_dim = 8;
  model::MoeConfig moe;
  moe.num_experts = 6;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 16;
  moe.mlp_only_layers = {1};
  if (sigmoid) {
    moe.scoring = model::MoeConfig::Scoring::kSigmoid;
    moe.n_group = 3;
    moe.topk_group = 2;
    moe.norm_topk_prob = true;
    moe.routed_scaling_factor = 2.0;
    moe.n_shared_experts = 1;
  }
  auto m = MakeTinyModel(o);
  testing::AddMoeLayers(m.get(), moe, 31);
  return *models->emplace(sigmoid, std::move(m)).first->second;
}

class TpMoeGreedyTest : public ::testing::TestWithParam<std::tuple<bool, int, int>> {};

TEST_P(TpMoeGreedyTest, TokensEqualTp1) {
  auto [sigmoid, tp, budget] = GetParam();
  const model::ModelWeights& w = MoeModel(sigmoid).weights;
  static auto* refs = new std::map<bool, std::map<int64_t, std::vector<int32_t>>>();
  if (!refs->count(sigmoid)) (*refs)[sigmoid] = Generate(w, 1, KvLayout::kHND, 512);
  const auto& want = (*refs)[sigmoid];
  std::set<std::vector<int32_t>> distinct;
  for (const auto& [id, t] : want) distinct.insert(t);
  ASSERT_EQ(distinct.size(), 3u) << "tokens should depend on the prompt";
  auto got = Generate(w, tp, KvLayout::kHND, budget);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], want.at(i)) << "request " << i;
}

std::string MoeGreedyName(const ::testing::TestParamInfo<std::tuple<bool, int, int>>& info) {
  const bool sigmoid = std::get<0>(info.param);
  const int tp = std::get<1>(info.param), budget = std::get<2>(info.param);
  return std::string(sigmoid ? "sigmoid" : "softmax") + "_tp" + std::to_string(tp) +
         (budget < 100 ? "_chunked" : "_whole");
}

INSTANTIATE_TEST_SUITE_P(RouterTpChunk, TpMoeGreedyTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(1, 2, 4),
                                            ::testing::Values(6, 512)),
                         MoeGreedyName);

// deepseek_v3 whole: MLA attention (q_lora_rank set, yarn), layer 0 dense (first_k_dense_replace),
// layers 1-2 MoE with noaux_tc routing (4 groups of 2, 2 kept, top 3) and a shared expert.
TEST(TpMoeGreedyTest, DeepseekV3TokensEqualTp1) {
  testing::TinyMlaOptions o;
  o.dtype = model::DType::kBF16;
  o.layers = 3;
  o.heads = 4;
  o.q_lora_rank = 24;
  o.yarn = true;
  auto m = testing::MakeTinyMlaModel(o);
  model::MoeConfig moe;
  moe.scoring = model::MoeConfig::Scoring::kSigmoid;
  moe.num_experts = 8;
  moe.num_experts_per_tok = 3;
  moe.moe_intermediate_size = 12;
  moe.n_group = 4;
  moe.topk_group = 2;
  moe.norm_topk_prob = true;
  moe.routed_scaling_factor = 2.5;
  moe.n_shared_experts = 1;
  moe.first_k_dense_replace = 1;
  testing::AddMoeLayers(m.get(), moe, 37);
  ASSERT_TRUE(m->weights.config.IsMoeLayer(1) && !m->weights.config.IsMoeLayer(0));
  const auto want = Generate(m->weights, 1, KvLayout::kHND, 512);
  std::set<std::vector<int32_t>> distinct;
  for (const auto& [id, t] : want) distinct.insert(t);
  ASSERT_EQ(distinct.size(), 3u) << "tokens should depend on the prompt";
  for (int tp : {1, 2, 4})
    for (int budget : {6, 512}) {
      auto got = Generate(m->weights, tp, KvLayout::kHND, budget);
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(got[i], want.at(i)) << "tp " << tp << " budget " << budget << " request " << i;
    }
}

// The MoE runner's fast kernels (TP 1, 2) against its reference kernels (TP 1).
TEST(TpLogitsTest, MoeFastAndShardedCloseToReference) {
  for (bool sigmoid : {false, true}) {
    const model::ModelWeights& w = MoeModel(sigmoid).weights;
    const auto want = StepLogits(w, 1, KernelKind::kReference);
    for (int tp : {1, 2}) {
      const auto got = StepLogits(w, tp);
      ASSERT_EQ(got.size(), want.size());
      for (size_t s = 0; s < want.size(); ++s)
        for (size_t i = 0; i < want[s].size(); ++i)
          ASSERT_NEAR(got[s][i], want[s][i], 1e-4 * (1 + std::fabs(want[s][i])))
              << "sigmoid " << sigmoid << " tp " << tp << " step " << s << " logit " << i;
    }
  }
}

TEST(TpRunnerTest, MoeWidthNotDividedIsRefused) {
  model::ModelConfig c = MoeModel(false).weights.config;
  c.num_heads = 6;
  c.num_kv_heads = 3;
  const Status st = ValidateTensorParallel(c, 3);
  EXPECT_THAT(st.ToString(), HasSubstr("moe_intermediate_size 16"));
}

}  // namespace
}  // namespace pd::engine
