// Private to src/engine: the router of a sparse MoE layer, as Hugging Face computes it — which
// top-k experts each token goes to, and with what weights. Plain scalar code on the router's
// (num_tokens, num_experts) f32 logits; the fast and the reference MoE block share it.
//
// qwen3_moe (MoeConfig::Scoring::kSoftmax): p = softmax(logits); the top_k largest p; with
//   norm_topk_prob the k weights are divided by their sum.
// deepseek_v3 (kSigmoid, topk_method noaux_tc): s = sigmoid(logits), choice = s + bias
//   (e_score_correction_bias); experts in n_group equal groups, a group's score the sum of its two
//   largest choice values (its only one for groups of one expert); the topk_group best groups stay
//   eligible, every other expert's choice value becomes 0.0 (as transformers' masked_fill, not
//   -inf); the top_k largest choice values select the experts, whose weights are the unbiased s,
//   divided by (their sum + 1e-20) with norm_topk_prob, times routed_scaling_factor.
//
// Ties (equal values, within a token) go to the lower index, for experts and for groups: the
// routing is a pure function of the logits. transformers leaves torch.topk's tie order
// unspecified; real logits rarely tie exactly.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace pd::engine {

// The most expert groups (n_group) RouteTokens handles; PrepareRunnerWeights refuses more.
constexpr int kMaxGroups = 256;

// logits (num_tokens, num_experts) row stride ld; bias (num_experts) or nullptr (kSigmoid only)
// -> experts (num_tokens, top_k) and weights (num_tokens, top_k): each token's experts in order
// of decreasing selection value (the biased choice value for kSigmoid), with their weights.
// scratch: at least 2 * num_experts floats.
void RouteTokens(const model::MoeConfig& moe, const float* logits, int64_t num_tokens, int64_t ld,
                 const float* bias, int32_t* experts, float* weights, float* scratch);

// The k largest of v (n) into idx (k), largest first, ties to the lower index.
void TopKIndices(const float* v, int n, int k, int32_t* idx);

}  // namespace pd::engine
