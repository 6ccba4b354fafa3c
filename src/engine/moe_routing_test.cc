#include "engine/moe_routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace pd::engine {
namespace {

using Scoring = model::MoeConfig::Scoring;

// The logit whose sigmoid is s.
float Logit(double s) { return static_cast<float>(std::log(s / (1.0 - s))); }

struct Routed {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

Routed Route(const model::MoeConfig& moe, const std::vector<float>& logits,
             const std::vector<float>& bias = {}) {
  Routed r;
  r.experts.assign(moe.num_experts_per_tok, -1);
  r.weights.assign(moe.num_experts_per_tok, 0.0f);
  std::vector<float> scratch(2 * moe.num_experts);
  RouteTokens(moe, logits.data(), 1, moe.num_experts, bias.empty() ? nullptr : bias.data(),
              r.experts.data(), r.weights.data(), scratch.data());
  return r;
}

model::MoeConfig Sigmoid(int experts, int top_k, int groups, int topk_group) {
  model::MoeConfig m;
  m.scoring = Scoring::kSigmoid;
  m.num_experts = experts;
  m.num_experts_per_tok = top_k;
  m.n_group = groups;
  m.topk_group = topk_group;
  return m;
}

TEST(MoeRoutingTest, SoftmaxTopKTiesToTheLowerIndexAndRenormalises) {
  model::MoeConfig m;
  m.num_experts = 4;
  m.num_experts_per_tok = 2;
  const std::vector<float> logits = {1, 3, 2, 3};
  const double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
  Routed r = Route(m, logits);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(r.weights[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(r.weights[1], std::exp(3.0) / z, 1e-6);
  m.norm_topk_prob = true;
  r = Route(m, logits);
  EXPECT_NEAR(r.weights[0], 0.5, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.5, 1e-6);
  const std::vector<float> skewed = {0, 2, 1, -1};  // top-2: 1 then 2, weights e^2 : e^1
  r = Route(m, skewed);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(r.weights[0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.0)), 1e-6);
}

TEST(MoeRoutingTest, GroupMaskingChangesTheChoice) {
  // Groups of 2: {0,1} sums 1.0, {2,3} 1.2, {4,5} 1.1, {6,7} 1.0. The best two groups are 1 and
  // 2, so experts 6 (0.95) and 0 (0.9), the two best overall, are masked out.
  model::MoeConfig m = Sigmoid(8, 2, 4, 2);
  m.norm_topk_prob = true;
  m.routed_scaling_factor = 2.5;
  std::vector<float> logits;
  for (double s : {0.9, 0.1, 0.6, 0.6, 0.55, 0.55, 0.95, 0.05}) logits.push_back(Logit(s));
  Routed r = Route(m, logits, std::vector<float>(8, 0.0f));
  EXPECT_EQ(r.experts, (std::vector<int32_t>{2, 3}));  // tied: the lower index first
  EXPECT_NEAR(r.weights[0], 1.25, 1e-5);               // 0.6 / 1.2 * 2.5
  EXPECT_NEAR(r.weights[1], 1.25, 1e-5);
  m.topk_group = 4;  // every group eligible: the plain top-2
  r = Route(m, logits, std::vector<float>(8, 0.0f));
  EXPECT_EQ(r.experts, (std::vector<int32_t>{6, 0}));
  EXPECT_NEAR(r.weights[0], 0.95 / 1.85 * 2.5, 1e-5);
}

TEST(MoeRoutingTest, BiasChangesTheSelectionButNotTheWeights) {
  model::MoeConfig m = Sigmoid(4, 1, 1, 1);
  std::vector<float> logits;
  for (double s : {0.7, 0.6, 0.2, 0.1}) logits.push_back(Logit(s));
  Routed r = Route(m, logits, {0, 0, 0, 0});
  EXPECT_EQ(r.experts[0], 0);
  EXPECT_NEAR(r.weights[0], 0.7, 1e-6);
  r = Route(m, logits, {0, 0.2f, 0, 0});  // choice 0.8 for expert 1: selected, weight stays 0.6
  EXPECT_EQ(r.experts[0], 1);
  EXPECT_NEAR(r.weights[0], 0.6, 1e-6);
  m.norm_topk_prob = true;
  m.routed_scaling_factor = 3.0;
  r = Route(m, logits, {0, 0.2f, 0, 0});
  EXPECT_EQ(r.experts[0], 1);
  EXPECT_NEAR(r.weights[0], 3.0, 1e-5);
}

TEST(MoeRoutingTest, MaskedExpertsScoreZeroNotMinusInfinity) {
  // Every biased choice value is negative: the masked group's experts (0.0, as transformers'
  // masked_fill) outrank the eligible ones, and expert 2 (lower index of the tie) is chosen.
  model::MoeConfig m = Sigmoid(4, 1, 2, 1);
  std::vector<float> logits;
  for (double s : {0.3, 0.3, 0.1, 0.1}) logits.push_back(Logit(s));
  Routed r = Route(m, logits, std::vector<float>(4, -0.5f));
  EXPECT_EQ(r.experts[0], 2);
  EXPECT_NEAR(r.weights[0], 0.1, 1e-6);  // its unbiased score
}

TEST(MoeRoutingTest, TopKMatchesAStableSort) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(0, 5);  // many ties
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 37, k = 1 + trial % n;
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(small(rng));
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[a] > v[b]; });
    std::vector<int32_t> idx(k);
    TopKIndices(v.data(), n, k, idx.data());
    EXPECT_EQ(idx, std::vector<int32_t>(order.begin(), order.begin() + k)) << "n " << n;
  }
}

}  // namespace
}  // namespace pd::engine
