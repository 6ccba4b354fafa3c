// Speculative decoding: the configuration (vLLM's `--speculative-config` JSON shape), the n-gram
// (prompt lookup) proposer and the rejection sampler that keeps the target's distribution.
//
// A sequence that has drafts runs its last accepted token and K drafts as one step (K + 1 query
// tokens, logits at every position, scheduler.h); the engine then walks the positions in order:
// it samples the target's token at position j exactly as it would without speculation, keeps it,
// and goes on to j + 1 only while that token equals draft j. For a draft given as one token
// (n-gram; q a point mass at x) this is rejection sampling itself: x is kept with probability
// p(x) = min(1, p(x)/q(x)), and otherwise the token drawn from p is not x, i.e. distributed as
// norm(max(p - q, 0)). Sampling the target first keeps one random draw per output token, so a
// seeded request gives the same tokens with and without speculation, and the output constraint
// and logprobs work position by position unchanged. A draft with a full distribution q (a draft
// model) goes through RejectionSample.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pd::engine {

enum class SpecMethod { kNone, kNgram, kDraftModel, kMtp };
std::string_view SpecMethodName(SpecMethod method);  // "", "ngram", "draft_model", "mtp"

struct SpeculativeConfig {
  SpecMethod method = SpecMethod::kNone;
  int num_speculative_tokens = 0;  // K drafts per step
  std::string model;               // draft_model: the draft checkpoint's directory
  int prompt_lookup_min = 0;       // ngram: shortest n-gram matched
  int prompt_lookup_max = 0;       // ngram: longest n-gram matched
  bool enabled() const { return method != SpecMethod::kNone && num_speculative_tokens > 0; }
};

inline constexpr int kMaxSpeculativeTokens = 16;

// Parses `--speculative-config` ('{"method": "ngram", "num_speculative_tokens": 3,
// "prompt_lookup_max": 4}'). As in vLLM, an ngram config given one of prompt_lookup_min/max uses
// it for both, and neither means 5 and 5. InvalidArgument names the field and value; unknown
// fields are refused.
Result<SpeculativeConfig> ParseSpeculativeConfig(std::string_view json);
// The ranges ParseSpeculativeConfig enforces, for a config built in code.
Status ValidateSpeculativeConfig(const SpeculativeConfig& config);

// Prompt lookup (vLLM's ngram proposer): the longest n in [min_n, max_n] whose last n tokens of
// `tokens` occur earlier in `tokens`; at its earliest occurrence, the up to k tokens that follow.
// Empty when no n-gram matches.
std::vector<int32_t> NgramPropose(std::span<const int32_t> tokens, int min_n, int max_n, int k);

struct RejectionResult {
  int32_t token_id = 0;
  bool accepted = false;  // token_id is the draft
};

// One position of rejection sampling (Leviathan et al.; Chen et al.): p and q are the target's and
// the draft's probabilities over the vocabulary (each summing to 1), `draft` was drawn from q.
// The draft is kept when u_accept < p(draft) / q(draft); otherwise the token is drawn by inverse
// CDF with u_resample from norm(max(p - q, 0)). u_* in [0, 1). The output is distributed as p.
RejectionResult RejectionSample(std::span<const double> p, std::span<const double> q, int32_t draft,
                                double u_accept, double u_resample);

// Counters in vLLM's names (spec_decode_num_drafts, ...): a draft is one verification of >= 1
// draft tokens; accepted_per_pos[j] counts drafts whose token j was kept.
struct SpecDecodeCounters {
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;  // (num_speculative_tokens)
  // Prompt tokens a draft model computed here: a prefill instance computes them for its decode
  // instances, which then compute only each prompt's last token (spec_draft_model.h).
  int64_t num_draft_prompt_tokens = 0;
  // Adds another engine's counts (a data-parallel instance sums its ranks'); accepted_per_pos
  // grows to the longer of the two.
  SpecDecodeCounters& operator+=(const SpecDecodeCounters& other);
};

}  // namespace pd::engine
