// MoE and MLA in the planner's model shapes and analytical step times.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

#include "common/file_util.h"
#include "model/config.h"
#include "model/model_writer.h"
#include "planner/hardware.h"
#include "planner/scenario.h"
#include "planner/setup.h"

namespace pd::planner {
namespace {

// Published parameter counts are rounded to whole billions: a count must round to them (within
// 0.5B) and, for totals, also lie within 1%.
void ExpectPublished(double count, double published, bool total) {
  EXPECT_LE(std::abs(count - published), 0.5e9) << count << " vs " << published;
  if (total) {
    EXPECT_LE(std::abs(count / published - 1.0), 0.01) << count << " vs " << published;
  }
}

TEST(MoeShape, DeepseekR1CountsMatchThePublished671BTotal37BActive) {
  auto s = BuiltinModelShape("deepseek-ai/DeepSeek-R1");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->is_mla());
  EXPECT_TRUE(s->is_moe());
  EXPECT_EQ(s->num_moe_layers, 58);
  ExpectPublished(s->NumParams(), 671e9, true);
  ExpectPublished(s->ActiveParams(), 37e9, false);
  EXPECT_DOUBLE_EQ(s->WeightBytes(), s->NumParams());  // FP8 weights
}

TEST(MoeShape, Qwen3CoderCountsMatchThePublished480BTotal35BActive) {
  auto s = BuiltinModelShape("qwen3-coder-480b-a35b");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE(s->is_mla());
  EXPECT_TRUE(s->is_moe());
  ExpectPublished(s->NumParams(), 480e9, true);
  ExpectPublished(s->ActiveParams(), 35e9, false);
  EXPECT_DOUBLE_EQ(s->WeightBytes(), 2 * s->NumParams());  // bf16
}

TEST(MoeShape, MlaKvBytesAreTheLatentOnEveryRankGqaHeadsSplit) {
  const ModelShape r1 = *BuiltinModelShape("deepseek-r1");
  EXPECT_DOUBLE_EQ(r1.KvBytesPerToken(), 61.0 * 576 * 2);  // 70,272 bytes in bf16
  EXPECT_DOUBLE_EQ(r1.KvBytesPerToken(), 70272.0);
  EXPECT_DOUBLE_EQ(r1.KvBytesPerTokenPerRank(8), 70272.0);  // replicated, not divided
  const ModelShape qwen = *BuiltinModelShape("qwen3-coder-480b-a35b");
  EXPECT_DOUBLE_EQ(qwen.KvBytesPerToken(), 2.0 * 62 * 8 * 128 * 2);  // 253,952
  EXPECT_DOUBLE_EQ(qwen.KvBytesPerTokenPerRank(8), qwen.KvBytesPerToken() / 8);
  EXPECT_DOUBLE_EQ(qwen.KvBytesPerTokenPerRank(16), qwen.KvBytesPerToken() / 8);  // a head each
  // An instance holds the latent once per rank: TP8 capacity is in tokens of 8 copies.
  const HardwareSpec h200 = *BuiltinHardware("h200");
  const int64_t tp8 = AnalyticalKvCapacityTokens(r1, h200, 8, 1, 0.9);
  const double free = 8 * 141e9 * 0.9 - r1.WeightBytes() - 8 * 0.05 * 141e9;
  EXPECT_NEAR(static_cast<double>(tp8), free / (8 * 70272.0), 1.0);
  // One DP rank of 8 holds the non-expert weights and an eighth of the experts: it fits.
  EXPECT_EQ(AnalyticalKvCapacityTokens(r1, h200, 1, 1, 0.9), 0);
  EXPECT_GT(AnalyticalKvCapacityTokens(r1, h200, 1, 1, 0.9, 8), 100000);
}

TEST(MoeShape, ExpectedActivatedExpertsMatchesMonteCarlo) {
  std::mt19937_64 rng(7);
  for (auto [experts, top_k] : {std::pair{256, 8}, std::pair{160, 8}, std::pair{16, 2}}) {
    std::vector<int> ids(experts);
    for (int tokens : {1, 3, 16, 64, 512}) {
      constexpr int kTrials = 2000;
      double sum = 0;
      for (int t = 0; t < kTrials; ++t) {
        std::set<int> touched;
        for (int i = 0; i < tokens; ++i) {
          for (int e = 0; e < experts; ++e) ids[e] = e;
          // Partial Fisher-Yates: top_k distinct experts for this token.
          for (int j = 0; j < top_k; ++j) {
            std::swap(ids[j], ids[j + rng() % (experts - j)]);
            touched.insert(ids[j]);
          }
        }
        sum += touched.size();
      }
      const double expected = ExpectedActivatedExperts(tokens, experts, top_k);
      EXPECT_NEAR(sum / kTrials, expected, 0.01 * expected + 0.05)
          << experts << " experts, top " << top_k << ", " << tokens << " tokens";
    }
  }
  EXPECT_DOUBLE_EQ(ExpectedActivatedExperts(1, 256, 8), 8.0);
  EXPECT_DOUBLE_EQ(ExpectedActivatedExperts(0, 256, 8), 0.0);
  EXPECT_NEAR(ExpectedActivatedExperts(1e6, 256, 8), 256.0, 1e-9);
}

TEST(MoeShape, DecodeStepReadsTheActivatedExpertsAndComputesActiveParams) {
  const ModelShape r1 = *BuiltinModelShape("deepseek-r1");
  const HardwareSpec h200 = *BuiltinHardware("h200-141gb");
  auto c = AnalyticalLatencyModel(r1, h200).Coeffs(8);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const double bw = h200.mem_bw * h200.mem_eff;
  const double expert_ms = 58 * r1.ExpertParams() / 8 / bw * 1e3;  // FP8: 1 byte each
  EXPECT_NEAR(c->moe.expert_ms, expert_ms, 1e-9);
  EXPECT_NEAR(c->decode_small[2],
              2 * r1.ActiveParams() / 8 / (1979e12 * 0.6) * 1e3 +
                  2.0 * 61 * 2.0 * 7 / 8 * 7168 * 2 / 450e9 * 1e3,
              1e-9);
  // The expert term: 8 experts for one sequence, all 256 for a large batch.
  const double linear1 = c->decode_small[0] + c->decode_small[1] + c->decode_small[2];
  EXPECT_NEAR(c->DecodeMs(1, 1) - linear1, 8 * expert_ms, 1e-9);
  const double linear4k =
      c->decode_small[0] + c->decode_small[1] * 4096 + c->decode_small[2] * 4096;
  EXPECT_NEAR(c->DecodeMs(4096, 4096) - linear4k, 256 * expert_ms, 1e-6);
  // A DP8 rank: non-expert weights whole, 1/8 of the experts, 8x the tokens, all-to-all.
  auto dp = AnalyticalLatencyModel(r1, h200, MoeParallelism{8, 0.0}).Coeffs(1);
  ASSERT_TRUE(dp.ok());
  EXPECT_NEAR(dp->moe.expert_ms, expert_ms, 1e-9);
  EXPECT_EQ(dp->moe.token_multiplier, 8.0);
  EXPECT_NEAR(
      dp->DecodeMs(1, 1) - (dp->decode_small[0] + dp->decode_small[1] + dp->decode_small[2]),
      ExpectedActivatedExperts(8, 256, 8) * expert_ms, 1e-9);
  EXPECT_GT(dp->decode_small[2], 2 * r1.ActiveParams() / (1979e12 * 0.6) * 1e3);  // + all-to-all
  // A mixed step reads the experts once for prompt and decode tokens together.
  StepShape mixed;
  mixed.prefill_tokens = 100;
  mixed.prefill_sq = 100.0 * 100;
  mixed.decode_seqs = 4;
  mixed.decode_context = 400;
  const double moe_ms = c->moe.Ms(104);
  EXPECT_NEAR(c->StepMs(mixed),
              c->prefill[0] + c->prefill[1] * 100 + c->prefill[2] * 1e4 + c->decode_small[1] * 400 +
                  c->decode_small[2] * 4 + moe_ms,
              1e-9);
}

TEST(MoeShape, ShapeFromConfigFillsMlaAndMoeFromTheCheckpointConfig) {
  for (auto arch : {model::Arch::kDeepseekV3, model::Arch::kQwen3Moe}) {
    auto config = model::PresetConfig(arch, "small");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    const ModelShape s = ShapeFromConfig(*config, "m");
    EXPECT_EQ(s.is_mla(), arch == model::Arch::kDeepseekV3);
    EXPECT_TRUE(s.is_moe());
    int moe_layers = 0;
    for (int i = 0; i < config->num_layers; ++i) moe_layers += config->IsMoeLayer(i);
    EXPECT_EQ(s.num_moe_layers, moe_layers);
    EXPECT_GT(moe_layers, 0);
    EXPECT_LT(moe_layers, config->num_layers);  // the presets mix dense and MoE layers
    // The model library's own count (every tensor, norms included) agrees.
    const model::ParameterCounts counts = model::CountParameters(*config);
    EXPECT_NEAR(s.NumParams() / double(counts.total), 1.0, 0.03);
    EXPECT_NEAR((s.ActiveParams() + s.InputEmbeddingParams()) / double(counts.active), 1.0, 0.03);
    if (s.is_mla()) {
      EXPECT_DOUBLE_EQ(s.KvBytesPerToken(),
                       double(config->num_layers) * config->mla.latent_dim() * 2);
    }
  }
}

TEST(MoeShape, PlanOnACheckpointDirectoryUsesTheMoeShape) {
  const std::string dir = ::testing::TempDir() + "/planner_moe_ckpt";
  std::filesystem::create_directories(dir);
  auto config = model::PresetConfig(model::Arch::kDeepseekV3, "tiny");
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(WriteStringToFile(dir + "/config.json", model::ModelConfigToJson(*config)).ok());
  const std::string lengths = dir + "/lengths.csv";
  ASSERT_TRUE(WriteStringToFile(lengths, "prompt_len,output_len\n64,16\n200,8\n30,40\n").ok());
  SetupOptions o;
  o.model = dir;
  o.hardware = "h100-80gb";
  o.profile = "analytical";
  o.lengths = lengths;
  o.nodes = 1;
  o.num_requests = 40;
  o.max_pp = 1;
  o.threads = 1;
  auto setup = BuildPlannerSetup(o);
  ASSERT_TRUE(setup.ok()) << setup.status().ToString();
  PlannerInputs& in = (*setup)->inputs;
  EXPECT_TRUE(in.shape.is_mla());
  EXPECT_TRUE(in.shape.is_moe());
  EXPECT_DOUBLE_EQ(in.shape.KvBytesPerToken(),
                   double(config->num_layers) * config->mla.latent_dim() * 2);
  auto coeffs = in.model->Coeffs(1);
  ASSERT_TRUE(coeffs.ok());
  EXPECT_EQ(coeffs->moe.num_experts, config->moe.num_experts);
  in.max_requests = 200;
  in.min_duration_s = 5;
  in.iterations = 4;
  auto report = SearchPlacement(in);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_GT(report->best.goodput, 0.0);
  std::filesystem::remove_all(dir);
}

TEST(R1Scenario, LengthsAreUniformAroundTheMeans) {
  const auto l = LongPromptChatLengths(4096, 1024, 4000, 3);
  double p = 0, q = 0;
  for (const auto& x : l) {
    EXPECT_GE(x.prompt_len, 2048);
    EXPECT_LE(x.prompt_len, 6144);
    EXPECT_GE(x.output_len, 512);
    EXPECT_LE(x.output_len, 1536);
    p += x.prompt_len;
    q += x.output_len;
  }
  EXPECT_NEAR(p / l.size(), 4096, 60);
  EXPECT_NEAR(q / l.size(), 1024, 15);
}

}  // namespace
}  // namespace pd::planner
