// Tensor parallelism over FP8 block-scaled weights: greedy tokens at TP 2 and 4 equal TP 1's and
// logits stay close, for dense (llama, qwen3), qwen3_moe and deepseek_v3 models quantised as FP8
// checkpoints store them, on shapes whose shards start on 128-wide scale blocks (kept FP8) and
// inside them (dequantised per rank); MLP widths split on block boundaries; what each rank holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "engine/cpu_features.h"
#include "engine/engine.h"
#include "engine/fp8_test_util.h"
#include "engine/matmul_precision.h"
#include "engine/mla_test_util.h"
#include "engine/model_runner.h"
#include "engine/model_runner_test_util.h"
#include "engine/model_runner_weights.h"
#include "engine/moe_test_util.h"
#include "engine/tp_shard.h"
#include "engine/tp_shard_slices.h"

namespace pd::engine {
namespace {

using testing::MakeTinyModel;
using testing::TinyModel;
using testing::TinyModelOptions;
using testing::ToFp8;

// head_dim 128: every rank's heads start on a scale block at TP 2 and 4 (KV heads replicated at
// TP 4); MLP width 640, whose even split (320, 160) is not on blocks: split 256/384 and
// 128/128/128/256. The odd shape (head_dim 24, width 88) starts shards inside blocks.
std::unique_ptr<TinyModel> DenseModel(model::Arch arch, bool aligned) {
  TinyModelOptions o;
  o.arch = arch;
  o.seed = 41;
  o.vocab = 67;
  o.hidden = 48;
  o.layers = 2;
  o.heads = aligned ? 4 : 8;
  o.kv_heads = 2;
  o.head_dim = aligned ? 128 : 24;
  o.intermediate = aligned ? 640 : 88;
  return ToFp8(MakeTinyModel(o));
}

// qwen3_moe: head_dim 128, experts of width 384 (TP 2: 128 + 256 on blocks; TP 4: three blocks
// for four ranks, so an even split of 96, dequantised where it starts inside a block); layer 1
// dense (width 256).
std::unique_ptr<TinyModel> MoeModel() {
  TinyModelOptions o;
  o.arch = model::Arch::kQwen3Moe;
  o.seed = 43;
  o.hidden = 48;
  o.intermediate = 256;
  o.layers = 3;
  o.heads = 4;
  o.kv_heads = 2;
  o.head_dim = 128;
  model::MoeConfig moe;
  moe.num_experts = 4;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 384;
  moe.mlp_only_layers = {1};
  auto m = MakeTinyModel(o);
  testing::AddMoeLayers(m.get(), moe, 47);
  return ToFp8(std::move(m));
}

// deepseek_v3: MLA with q heads of 48 + 16 (TP 2: rank 1's q_b rows and o_proj columns start at
// 128; TP 4: at 64, inside a block), layer 0 dense, then MoE with a shared expert, width 256.
std::unique_ptr<TinyModel> MlaModel(int q_lora_rank) {
  testing::TinyMlaOptions o;
  o.layers = 2;
  o.heads = 4;
  o.hidden = 48;
  o.intermediate = 256;
  o.q_lora_rank = q_lora_rank;
  o.kv_lora_rank = 40;
  o.nope = 48;
  o.rope = 16;
  o.v_head_dim = 64;
  auto m = testing::MakeTinyMlaModel(o);
  model::MoeConfig moe;
  moe.scoring = model::MoeConfig::Scoring::kSigmoid;
  moe.num_experts = 4;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 256;
  moe.n_group = 2;
  moe.topk_group = 1;
  moe.norm_topk_prob = true;
  moe.routed_scaling_factor = 2.5;
  moe.n_shared_experts = 1;
  moe.first_k_dense_replace = 1;
  testing::AddMoeLayers(m.get(), moe, 53);
  return ToFp8(std::move(m));
}

std::vector<int32_t> PromptOf(int len, int salt, int vocab) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = (i * 37 + salt * 101 + 3) % vocab;
  return p;
}

// Three requests batched together, prompts chunked by `budget`; greedy tokens by request id.
std::map<int64_t, std::vector<int32_t>> Generate(const model::ModelWeights& w, int tp, int budget) {
  EngineOptions o;
  o.runner.kv.page_size = 4;
  o.runner.num_pages = 64;
  o.runner.num_threads = 1;
  o.runner.tensor_parallel_size = tp;
  o.scheduler.max_num_batched_tokens = budget;
  o.scheduler.max_num_seqs = 4;
  o.scheduler.max_model_len = 128;
  auto engine = Engine::Create(w, o);
  PD_CHECK(engine.ok()) << engine.status().ToString();
  constexpr int kLengths[3] = {13, 5, 21}, kMaxTokens[3] = {8, 10, 6};
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.id = i;
    r.prompt_ids = PromptOf(kLengths[i], i, w.config.vocab_size);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = kMaxTokens[i];
    r.sampling.ignore_eos = true;
    PD_CHECK((*engine)->AddRequest(std::move(r)).ok());
  }
  std::map<int64_t, std::vector<int32_t>> tokens;
  while ((*engine)->HasWork()) {
    auto outputs = (*engine)->Step();
    PD_CHECK(outputs.ok()) << outputs.status().ToString();
    for (const RequestOutput& out : *outputs) {
      EXPECT_NE(out.finish_reason, FinishReason::kError) << out.error.ToString();
      auto& t = tokens[out.request_id];
      t.insert(t.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    }
  }
  EXPECT_EQ((*engine)->stats().num_free_pages, (*engine)->stats().num_total_pages) << "leaked";
  return tokens;
}

// The logits of a 17-token prefill and 3 greedy decode steps at TP `tp`.
std::vector<std::vector<float>> StepLogits(const model::ModelWeights& w, int tp,
                                           MatmulPrecision matmul = MatmulPrecision::kF32) {
  ModelRunnerOptions o;
  o.matmul = matmul;
  o.kv.page_size = 4;
  o.num_pages = 16;
  o.num_threads = 1;
  o.tensor_parallel_size = tp;
  auto runner = ModelRunner::Create(w, o);
  PD_CHECK(runner.ok()) << runner.status().ToString();
  const std::vector<int32_t> pages = {3, 9, 1, 12, 5, 7, 2, 11};
  const std::vector<int32_t> prompt = PromptOf(17, 5, w.config.vocab_size);
  std::vector<int32_t> tok(1);
  std::vector<std::vector<float>> logits;
  ForwardBatch b;
  b.seqs.push_back(SeqStep{0, 0, prompt, pages, true});
  ForwardOutput out;
  for (int s = 0; s < 4; ++s) {
    PD_CHECK((*runner)->Forward(b, &out).ok());
    logits.push_back(out.logits[0]);
    const auto& l = logits.back();
    tok[0] = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    b.seqs[0] = SeqStep{0, 17 + s, tok, pages, true};
  }
  return logits;
}

// Max |a - b| over max |b| per step; 1 when the shapes differ.
std::vector<double> RelDiffs(const std::vector<std::vector<float>>& a,
                             const std::vector<std::vector<float>>& b) {
  std::vector<double> out;
  for (size_t s = 0; s < b.size(); ++s) {
    if (s >= a.size() || a[s].size() != b[s].size()) return {1.0};
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < b[s].size(); ++i) {
      diff = std::max(diff, double(std::fabs(a[s][i] - b[s][i])));
      scale = std::max(scale, double(std::fabs(b[s][i])));
    }
    out.push_back(diff / scale);
  }
  return out;
}

// Tokens at TP 2 and 4 (whole and chunked prompts) equal TP 1's; logits within 1e-4 of the
// largest (an FP8 block's partial sum times its scale against f32 code*scale products, and the
// all-reduce's order of the partial sums).
void ExpectTpMatchesTp1(const model::ModelWeights& w, const std::string& what) {
  const auto want = Generate(w, 1, 512);
  std::set<std::vector<int32_t>> distinct;
  for (const auto& [id, t] : want) distinct.insert(t);
  ASSERT_EQ(distinct.size(), 3u) << what << ": tokens should depend on the prompt";
  const auto ref = StepLogits(w, 1);
  for (int tp : {2, 4}) {
    for (int budget : {6, 512}) {
      auto got = Generate(w, tp, budget);
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(got[i], want.at(i))
            << what << " tp " << tp << " budget " << budget << " req " << i;
    }
    const std::vector<double> diffs = RelDiffs(StepLogits(w, tp), ref);
    ASSERT_EQ(diffs.size(), 4u) << what << " tp " << tp;
    for (size_t s = 0; s < diffs.size(); ++s)
      EXPECT_LT(diffs[s], 1e-4) << what << " tp " << tp << " step " << s;
  }
}

TEST(TpFp8Test, DenseTokensAndLogitsMatchTp1) {
  for (model::Arch arch : {model::Arch::kLlama, model::Arch::kQwen3})
    for (bool aligned : {true, false}) {
      auto m = DenseModel(arch, aligned);
      ExpectTpMatchesTp1(m->weights, std::string(model::ArchName(arch)) +
                                         (aligned ? " on blocks" : " inside blocks"));
    }
}

TEST(TpFp8Test, Qwen3MoeTokensAndLogitsMatchTp1) {
  auto m = MoeModel();
  ExpectTpMatchesTp1(m->weights, "qwen3_moe");
}

TEST(TpFp8Test, DeepseekV3TokensAndLogitsMatchTp1) {
  for (int q_lora_rank : {40, 0}) {
    auto m = MlaModel(q_lora_rank);
    ExpectTpMatchesTp1(m->weights, "deepseek_v3 q_lora_rank " + std::to_string(q_lora_rank));
  }
}

// --matmul bf16 where AMX is usable: the prefill's FP8 matmuls of every rank on AMX tiles (x
// rounded to bf16 alike on every rank), within 1e-3 of TP 1's where every slice stays FP8 (the
// dense model at TP 2 and 4, the MoE one at TP 2; a dequantised slice takes the bf16 tiles as
// rounded bf16 weights).
TEST(TpFp8Test, AmxPrefillCloseToTp1) {
  if (!DetectAmx().usable) GTEST_SKIP() << "AMX not usable: " << DetectAmx().reason;
  const testing::ScopedAmxAllowed allow(true);
  auto dense = DenseModel(model::Arch::kQwen3, true);
  auto moe = MoeModel();
  for (const auto& [w, tps] : {std::pair{&dense->weights, std::vector<int>{2, 4}},
                               std::pair{&moe->weights, std::vector<int>{2}}}) {
    const auto ref = StepLogits(*w, 1, MatmulPrecision::kBf16);
    const std::vector<double> f32 = RelDiffs(StepLogits(*w, 1), ref);
    ASSERT_EQ(f32.size(), 4u);
    EXPECT_GT(f32[0], 0.0) << "the prefill did not take AMX";
    for (int tp : tps) {
      const std::vector<double> diffs = RelDiffs(StepLogits(*w, tp, MatmulPrecision::kBf16), ref);
      ASSERT_EQ(diffs.size(), 4u);
      for (size_t s = 0; s < diffs.size(); ++s)
        EXPECT_LT(diffs[s], 1e-3) << model::ArchName(w->config.arch) << " tp " << tp << " step "
                                  << s << " (f32 x: " << f32[s] << ")";
    }
  }
}

// Whole blocks dealt to ranks where the even split is not on them; the even split otherwise, and
// when there are fewer blocks than ranks.
TEST(TpFp8Test, SplitWidthDealsWholeBlocks) {
  auto widths = [](int64_t width, int tp, bool fp8) {
    std::vector<int64_t> n;
    int64_t next = 0;
    for (int r = 0; r < tp; ++r) {
      const WidthSplit s = SplitWidth(width, tp, r, fp8);
      EXPECT_EQ(s.begin, next) << width << " over " << tp;
      next = s.begin + s.n;
      n.push_back(s.n);
    }
    EXPECT_EQ(next, width);
    return n;
  };
  EXPECT_EQ(widths(768, 4, true), (std::vector<int64_t>{128, 256, 128, 256}));  // Qwen3-30B-A3B
  EXPECT_EQ(widths(768, 4, false), (std::vector<int64_t>{192, 192, 192, 192}));
  EXPECT_EQ(widths(2048, 8, true), std::vector<int64_t>(8, 256));  // DeepSeek-V3's experts
  EXPECT_EQ(widths(18432, 8, true), std::vector<int64_t>(8, 2304));
  EXPECT_EQ(widths(704, 2, true), (std::vector<int64_t>{384, 320}));        // last block partial
  EXPECT_EQ(widths(384, 4, true), (std::vector<int64_t>{96, 96, 96, 96}));  // 3 blocks, 4 ranks
}

// What the ranks hold: FP8 views and copies where a shard starts on a block, f32 (the same values)
// where it starts inside one; the rank's config carries its MLP widths.
TEST(TpFp8Test, RanksKeepFp8OnBlocksAndDequantiseInside) {
  auto aligned = DenseModel(model::Arch::kQwen3, true);
  auto full = PrepareRunnerWeights(aligned->weights);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  const model::ModelConfig& c = (*full)->config;
  for (int r = 0; r < 4; ++r) {
    auto w = ShardRunnerWeights(**full, ComputeTpShard(c, 4, r));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const RunnerLayerWeights& l = (*w)->layers[1];
    for (const LinearWeight* x : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
      EXPECT_TRUE(x->w.fp8) << "rank " << r;
    EXPECT_EQ((*w)->config.intermediate_size, r == 3 ? 256 : 128);
    EXPECT_EQ(l.down.w.k, (*w)->config.intermediate_size);
  }
  auto odd = DenseModel(model::Arch::kQwen3, false);
  auto odd_full = PrepareRunnerWeights(odd->weights);
  ASSERT_TRUE(odd_full.ok()) << odd_full.status().ToString();
  const RunnerLayerWeights& f = (*odd_full)->layers[0];
  auto w = ShardRunnerWeights(**odd_full, ComputeTpShard((*odd_full)->config, 2, 1));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const RunnerLayerWeights& l = (*w)->layers[0];
  // q rows start at 4 heads * 24 = 96: q, k, v (fused at packing) all f32, their values exact.
  for (const LinearWeight* x : {&l.q, &l.k, &l.v, &l.o}) EXPECT_FALSE(x->w.fp8 || x->w.bf16);
  const float* q = static_cast<const float*>(l.q.w.data);
  const uint8_t* codes = static_cast<const uint8_t*>(f.q.w.data);
  const int64_t k = f.q.w.k, kb = kernels::Fp8KBlocks(k);
  for (int64_t r = 0; r < l.q.w.n; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const int64_t sr = 96 + r;
      ASSERT_EQ(q[r * k + i],
                model::Fp8E4m3ToF32(codes[sr * k + i]) * f.q.w.scales[(sr / 128) * kb + i / 128])
          << r << "," << i;
    }
}

}  // namespace
}  // namespace pd::engine
