// Token sampling for one request: greedy, temperature, top-k, top-p, a per-request seed, logprobs,
// and the stop rules that end a request.
//
// Each request owns one RequestSampler and so one random generator, which draws exactly one
// number per sampled token: with a seed, a request's tokens depend only on its own logits, never
// on which other requests share the batch. A constrained request (SamplingParams::constraint) may
// draw more than one (see SampleConstrained) and is just as reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/output_constraint.h"
#include "engine/request.h"

namespace pd::engine {

inline constexpr int kMaxLogprobs = 20;

struct SampleResult {
  int32_t token_id = 0;
  float logprob = 0.0f;  // log-softmax of the raw logits (before temperature, top-k, top-p)
  std::vector<std::pair<int32_t, float>> top;  // the top `logprobs` (id, logprob), best first
};

// Checks sampling ranges; InvalidArgument names the field and value ("top_p must be in (0, 1],
// got 1.5"). vocab_size bounds stop_token_ids.
Status ValidateSamplingParams(const SamplingParams& params, int vocab_size);

// Thread safety: not thread-safe; the engine loop owns each request's sampler.
class RequestSampler {
 public:
  // `default_seed` is used when params.seed is unset (the engine draws one per request).
  // `eos_token_id` (-1: none) ends a constrained output, as do params.stop_token_ids.
  RequestSampler(const SamplingParams& params, uint64_t default_seed, int32_t eos_token_id = -1);

  // logits: (vocab). Draws one random number unless greedy (or constrained).
  SampleResult Sample(std::span<const float> logits);
  const SamplingParams& params() const { return params_; }
  // The distribution Sample draws from without a constraint (softmax of logits / temperature cut
  // to top-k and top-p), over the whole vocabulary: probs (vocab). Needs temperature > 0. Draws
  // nothing. Speculative decoding's rejection sampling compares it with a draft's.
  void Distribution(std::span<const float> logits, std::vector<double>* probs);
  // The next number of this request's random stream, in [0, 1).
  double Uniform() { return NextUniform(); }
  // A constraint none of whose tokens fitted was let go: the rest of the output is free.
  bool constraint_released() const { return constraint_ != nullptr && released_; }
  // Speculative decoding: how many leading tokens of `drafts` (the tokens proposed to follow what
  // was sampled so far) the constraint lets this sampler pick, checked position by position on a
  // clone of its state (output_constraint.h); all of them without a constraint. A draft after one
  // the sampler could not pick would be rejected anyway: cutting there saves its verification.
  int NumAllowedDrafts(std::span<const int32_t> drafts) const;

 private:
  // Random choice among `ids` (empty: every token) with one uniform draw.
  int32_t SampleFrom(std::span<const float> logits, std::span<const int32_t> ids);
  int KeepTokens(std::span<const float> logits, std::span<const int32_t> ids, double* sum);
  int32_t SampleConstrained(std::span<const float> logits);
  int32_t GreedyConstrained(std::span<const float> logits);
  bool Allowed(int32_t id) const { return AllowedIn(*constraint_, mask_, id, num_sampled_); }
  // Whether `id` may be sampled as token num_sampled (0-based) with the constraint in `state`,
  // whose allowed tokens are `mask` (null: ask the state token by token).
  bool AllowedIn(const ConstraintState& state, const TokenMask* mask, int32_t id,
                 int num_sampled) const;
  // The mask's tokens and the end tokens, ascending by id within each.
  std::vector<int32_t> MaskCandidates(int vocab) const;
  double NextUniform();  // [0, 1), 53 bits, identical on every platform

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> scratch_;  // (vocab): (scaled logit, id)
  std::vector<double> probs_;                       // (kept tokens): unnormalised probabilities
  std::unique_ptr<ConstraintState> constraint_;     // null: unconstrained
  const TokenMask* mask_ = nullptr;  // the constraint state's allowed tokens, while sampling
  std::vector<int32_t> end_ids_;     // what may follow a complete constrained text
  bool released_ = false;
  int num_sampled_ = 0;
  // Whether the constrained text can complete within max_tokens at all (counted as one byte per
  // token, a lower bound on what byte-level vocabularies allow); then the sampler keeps it within
  // reach (see Allowed).
  bool close_in_time_ = false;
};

// Index of the largest logit; the lowest id wins ties.
int32_t ArgMax(std::span<const float> logits);
// log_softmax(logits)[id].
float LogSoftmaxAt(std::span<const float> logits, int32_t id);
// The n best (id, logprob) of log_softmax(logits), best first, lower id first on ties.
std::vector<std::pair<int32_t, float>> TopLogprobs(std::span<const float> logits, int n);

struct StopCheck {
  FinishReason reason = FinishReason::kNone;
  int32_t stop_token_id = -1;  // the token that stopped it (kStop)
};

struct StopContext {
  int eos_token_id = -1;  // -1: none
  int max_model_len = 0;  // 0: unbounded
};

// Decides whether the request ends after generating `token` as its num_generated-th token, the
// sequence now being context_len tokens long. Stop ids and EOS (unless ignore_eos) win over
// length.
StopCheck CheckStop(const SamplingParams& params, const StopContext& ctx, int32_t token,
                    int num_generated, int context_len);

}  // namespace pd::engine
