#include "engine/moe_routing.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace pd::engine {
namespace {

// Whether (a, value va) ranks above (b, value vb): larger value first, then lower index.
bool Before(float va, int a, float vb, int b) { return va > vb || (va == vb && a < b); }

// qwen3_moe: softmax over the row, top_k, optional renormalisation.
void RouteSoftmax(const model::MoeConfig& moe, const float* logits, int32_t* experts,
                  float* weights, float* p) {
  const int n = moe.num_experts, k = moe.num_experts_per_tok;
  float max = logits[0];
  for (int e = 1; e < n; ++e) max = std::max(max, logits[e]);
  double sum = 0;
  for (int e = 0; e < n; ++e) {
    p[e] = std::exp(logits[e] - max);
    sum += p[e];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int e = 0; e < n; ++e) p[e] *= inv;
  TopKIndices(p, n, k, experts);
  float total = 0;
  for (int j = 0; j < k; ++j) {
    weights[j] = p[experts[j]];
    total += weights[j];
  }
  if (moe.norm_topk_prob)
    for (int j = 0; j < k; ++j) weights[j] /= total;
}

// deepseek_v3 noaux_tc: group-limited top_k on the biased sigmoid scores.
void RouteSigmoid(const model::MoeConfig& moe, const float* logits, const float* bias,
                  int32_t* experts, float* weights, float* scratch) {
  const int n = moe.num_experts, k = moe.num_experts_per_tok;
  const int groups = moe.n_group, per_group = n / groups;
  float* s = scratch;           // (n) unbiased scores
  float* choice = scratch + n;  // (n) biased, then masked
  for (int e = 0; e < n; ++e) {
    s[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[e] = s[e] + (bias != nullptr ? bias[e] : 0.0f);
  }
  if (moe.topk_group < groups) {
    float group_score[kMaxGroups] = {};
    int32_t top[2];
    PD_CHECK(groups <= kMaxGroups) << "n_group " << groups << " above " << kMaxGroups;
    for (int g = 0; g < groups; ++g) {
      const int m = std::min(2, per_group);
      TopKIndices(choice + g * per_group, per_group, m, top);
      group_score[g] = 0;
      for (int j = 0; j < m; ++j) group_score[g] += choice[g * per_group + top[j]];
    }
    int32_t kept[kMaxGroups];
    TopKIndices(group_score, groups, moe.topk_group, kept);
    bool keep[kMaxGroups] = {};
    for (int j = 0; j < moe.topk_group; ++j) keep[kept[j]] = true;
    for (int g = 0; g < groups; ++g)
      if (!keep[g]) std::fill(choice + g * per_group, choice + (g + 1) * per_group, 0.0f);
  }
  TopKIndices(choice, n, k, experts);
  float total = 0;
  for (int j = 0; j < k; ++j) {
    weights[j] = s[experts[j]];
    total += weights[j];
  }
  const float scale = static_cast<float>(moe.routed_scaling_factor);
  for (int j = 0; j < k; ++j) {
    if (moe.norm_topk_prob) weights[j] /= total + 1e-20f;
    weights[j] *= scale;
  }
}

}  // namespace

void TopKIndices(const float* v, int n, int k, int32_t* idx) {
  PD_CHECK(k >= 0 && k <= n) << "top-" << k << " of " << n;
  if (k == 0) return;
  // Insertion into a sorted prefix of length k: n is the expert count (tens to hundreds).
  int filled = 0;
  for (int i = 0; i < n; ++i) {
    if (filled == k && !Before(v[i], i, v[idx[k - 1]], idx[k - 1])) continue;
    int j = filled < k ? filled++ : k - 1;
    while (j > 0 && Before(v[i], i, v[idx[j - 1]], idx[j - 1])) {
      idx[j] = idx[j - 1];
      --j;
    }
    idx[j] = i;
  }
}

void RouteTokens(const model::MoeConfig& moe, const float* logits, int64_t num_tokens, int64_t ld,
                 const float* bias, int32_t* experts, float* weights, float* scratch) {
  const int64_t k = moe.num_experts_per_tok;
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (moe.scoring == model::MoeConfig::Scoring::kSoftmax) {
      RouteSoftmax(moe, logits + t * ld, experts + t * k, weights + t * k, scratch);
    } else {
      RouteSigmoid(moe, logits + t * ld, bias, experts + t * k, weights + t * k, scratch);
    }
  }
}

}  // namespace pd::engine
