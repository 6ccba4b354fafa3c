#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/check.h"

namespace pd::engine {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

namespace {

template <typename T>
Status BadField(const char* field, T value, const char* want) {
  std::ostringstream os;
  os << field << " must be " << want << ", got " << value;
  return InvalidArgument(os.str());
}

// log(sum(exp(x))) over logits, stable.
double LogSumExp(std::span<const float> logits) {
  float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  return max + std::log(sum);
}

}  // namespace

Status ValidateSamplingParams(const SamplingParams& p, int vocab_size) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return BadField("temperature", p.temperature, ">= 0");
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return BadField("top_p", p.top_p, "in (0, 1]");
  if (p.top_k < -1) return BadField("top_k", p.top_k, "-1, 0 (off) or positive");
  if (p.max_tokens < 1) return BadField("max_tokens", p.max_tokens, ">= 1");
  if (p.logprobs < -1 || p.logprobs > kMaxLogprobs) {
    return BadField("logprobs", p.logprobs, "in [-1, 20]");
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return BadField("stop_token_ids", id, "token ids in [0, vocab_size)");
    }
  }
  return OkStatus();
}

int32_t ArgMax(std::span<const float> logits) {
  PD_CHECK(!logits.empty());
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

float LogSoftmaxAt(std::span<const float> logits, int32_t id) {
  PD_CHECK(id >= 0 && static_cast<size_t>(id) < logits.size());
  return static_cast<float>(logits[id] - LogSumExp(logits));
}

std::vector<std::pair<int32_t, float>> TopLogprobs(std::span<const float> logits, int n) {
  n = std::min<int>(n, static_cast<int>(logits.size()));
  if (n <= 0) return {};
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), better);
  double lse = LogSumExp(logits);
  std::vector<std::pair<int32_t, float>> top(n);
  for (int i = 0; i < n; ++i) top[i] = {ids[i], static_cast<float>(logits[ids[i]] - lse)};
  return top;
}

RequestSampler::RequestSampler(const SamplingParams& params, uint64_t default_seed,
                               int32_t eos_token_id)
    : params_(params), rng_(params.seed.value_or(default_seed)) {
  if (params_.constraint == nullptr) return;
  constraint_ = params_.constraint->Start();
  end_ids_ = params_.stop_token_ids;
  if (!params_.ignore_eos && eos_token_id >= 0) end_ids_.push_back(eos_token_id);
  const size_t need = constraint_->CompletionBytesAfter("");
  close_in_time_ = need != ConstraintState::kNever &&
                   need + (end_ids_.empty() ? 0 : 1) <= static_cast<size_t>(params_.max_tokens);
}

double RequestSampler::NextUniform() {
  return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

SampleResult RequestSampler::Sample(std::span<const float> logits) {
  SampleResult r;
  if (constraint_ != nullptr && !released_) {
    r.token_id = SampleConstrained(logits);
  } else {
    r.token_id = params_.temperature == 0.0f ? ArgMax(logits) : SampleFrom(logits, {});
  }
  ++num_sampled_;
  r.logprob = LogSoftmaxAt(logits, r.token_id);
  if (params_.logprobs > 0) r.top = TopLogprobs(logits, params_.logprobs);
  return r;
}

bool RequestSampler::AllowedIn(const ConstraintState& state, const TokenMask* mask, int32_t id,
                               int num_sampled) const {
  const bool ends = std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
  if (state.complete()) return ends || end_ids_.empty();  // nothing ends it: free again
  if (ends) return state.accepting();
  const TokenTexts& texts = params_.constraint->texts();
  if (id < 0 || id >= texts.size() || !texts.writes[id] || texts.bytes[id].empty()) return false;
  if (mask != nullptr && !mask->Has(id)) return false;
  if (mask != nullptr && !close_in_time_) return true;
  const size_t need = state.CompletionBytesAfter(texts.bytes[id]);
  if (need == ConstraintState::kNever) return false;
  if (!close_in_time_) return true;
  // Tokens left after this one: enough for the shortest completion (a byte each) and the end.
  const int64_t left = int64_t{params_.max_tokens} - num_sampled - 1;
  return int64_t(need) + (end_ids_.empty() ? 0 : 1) <= left;
}

int RequestSampler::NumAllowedDrafts(std::span<const int32_t> drafts) const {
  const int n = static_cast<int>(drafts.size());
  if (constraint_ == nullptr || released_) return n;
  std::unique_ptr<ConstraintState> state = constraint_->Clone();
  const TokenTexts& texts = params_.constraint->texts();
  for (int j = 0; j < n; ++j) {
    const int32_t id = drafts[j];
    const TokenMask* mask = state->complete() ? nullptr : state->AllowedTokens();
    if (!AllowedIn(*state, mask, id, num_sampled_ + j)) return j;
    if (std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end()) return j + 1;
    if (!state->complete()) state->Advance(texts.bytes[id]);
  }
  return n;
}

// Greedy: the first allowed token in descending-logit order (lower id first on ties) is the argmax
// of the masked logits, so trying candidates best first gives exactly what masking the whole
// vocabulary would. The argmax is tried first (a model that follows the format rarely needs more);
// then a heap yields the rest in order, each checked only when reached.
int32_t RequestSampler::GreedyConstrained(std::span<const float> logits) {
  const int32_t best = ArgMax(logits);
  if (Allowed(best)) return best;
  auto worse = [&](int32_t a, int32_t b) {
    return logits[a] < logits[b] || (logits[a] == logits[b] && a > b);
  };
  std::vector<int32_t> heap;
  if (mask_ != nullptr) {  // only the mask's tokens and the ends can be allowed
    // Usually the best of them is allowed: one pass over the mask's bits finds it.
    const auto vocab = static_cast<int32_t>(logits.size());
    int32_t top = -1;
    for (size_t w = 0; w < mask_->bits.size(); ++w) {
      for (uint64_t bits = mask_->bits[w]; bits != 0; bits &= bits - 1) {
        const auto id = static_cast<int32_t>(w * 64 + std::countr_zero(bits));
        if (id < vocab && (top < 0 || worse(top, id))) top = id;
      }
    }
    for (int32_t id : end_ids_) {
      if (id < vocab && (top < 0 || worse(top, id))) top = id;
    }
    if (top < 0 || Allowed(top)) return top;
    heap = MaskCandidates(vocab);
  } else {
    heap.reserve(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) {
      if (static_cast<int32_t>(i) != best) heap.push_back(static_cast<int32_t>(i));
    }
  }
  std::make_heap(heap.begin(), heap.end(), worse);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const int32_t id = heap.back();
    heap.pop_back();
    if (Allowed(id)) return id;
  }
  return -1;
}

std::vector<int32_t> RequestSampler::MaskCandidates(int vocab) const {
  std::vector<int32_t> ids;
  for (size_t w = 0; w < mask_->bits.size(); ++w) {
    for (uint64_t bits = mask_->bits[w]; bits != 0; bits &= bits - 1) {
      const auto id = static_cast<int32_t>(w * 64 + std::countr_zero(bits));
      if (id < vocab) ids.push_back(id);
    }
  }
  for (int32_t id : end_ids_) {
    if (id < vocab && !mask_->Has(id)) ids.push_back(id);
  }
  return ids;
}

// Sampling means "mask, then sample": the distribution is softmax(logits / T) over the allowed
// tokens, cut to top-k / top-p among them. Without top-k and top-p, rejection is exact and lazy: a
// token drawn from the unmasked distribution and accepted when allowed is distributed exactly as
// the masked one (used without a mask only: with one, each refused draw would cost a softmax over
// the whole vocabulary, so the draw is made among the mask's tokens at once). After kMaxRejections
// refusals (the model puts little mass on allowed tokens), and always under top-k or top-p (whose
// cut depends on which tokens are allowed), every token is checked once and the draw is made among
// the allowed ones. Either way the token follows the
// masked distribution: the fallback is a fresh draw from it, whatever the refusals were.
int32_t RequestSampler::SampleConstrained(std::span<const float> logits) {
  // The mask of the state, when it computes one (null once complete: few tokens matter then).
  mask_ = constraint_->complete() ? nullptr : constraint_->AllowedTokens();
  int32_t id = -1;
  if (params_.temperature == 0.0f) {
    id = GreedyConstrained(logits);
  } else {
    constexpr int kMaxRejections = 8;
    const int vocab = static_cast<int>(logits.size());
    if (mask_ == nullptr && (params_.top_k <= 0 || params_.top_k >= vocab) &&
        params_.top_p >= 1.0f) {
      for (int i = 0; i < kMaxRejections && id < 0; ++i) {
        const int32_t drawn = SampleFrom(logits, {});
        if (Allowed(drawn)) id = drawn;
      }
    }
    if (id < 0) {
      std::vector<int32_t> allowed;
      if (mask_ != nullptr) {
        for (int32_t t : MaskCandidates(vocab)) {
          if (Allowed(t)) allowed.push_back(t);
        }
      } else {
        for (int32_t t = 0; t < vocab; ++t) {
          if (Allowed(t)) allowed.push_back(t);
        }
      }
      if (!allowed.empty()) id = SampleFrom(logits, allowed);
    }
  }
  if (id < 0) {  // no token of the vocabulary continues the text: let the constraint go
    released_ = true;
    return params_.temperature == 0.0f ? ArgMax(logits) : SampleFrom(logits, {});
  }
  if (!constraint_->complete()) constraint_->Advance(params_.constraint->texts().bytes[id]);
  return id;
}

// Softmax over logits/temperature restricted to `ids` (all when empty) and to the top-k, then to
// the smallest prefix (best first) whose mass reaches top_p: scratch_[0, n) holds the kept
// (scaled logit, id) and probs_[0, n) their unnormalised probabilities; returns n, sets *sum.
int RequestSampler::KeepTokens(std::span<const float> logits, std::span<const int32_t> ids,
                               double* sum_out) {
  const float inv_t = 1.0f / params_.temperature;
  const int vocab = ids.empty() ? static_cast<int>(logits.size()) : static_cast<int>(ids.size());
  scratch_.resize(vocab);
  for (int i = 0; i < vocab; ++i) {
    const int32_t id = ids.empty() ? i : ids[i];
    scratch_[i] = {logits[id] * inv_t, id};
  }
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int n = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) {
    n = params_.top_k;
    std::partial_sort(scratch_.begin(), scratch_.begin() + n, scratch_.end(), better);
  } else if (params_.top_p < 1.0f) {
    std::sort(scratch_.begin(), scratch_.end(), better);
  }
  float max = scratch_[0].first;
  for (int i = 1; i < n; ++i) max = std::max(max, scratch_[i].first);
  std::vector<double>& probs = probs_;
  probs.resize(n);
  double sum = 0.0;
  for (int i = 0; i < n; ++i)
    sum += probs[i] = std::exp(static_cast<double>(scratch_[i].first) - max);
  if (params_.top_p < 1.0f) {  // scratch_[0, n) is sorted best first here
    double keep = params_.top_p * sum, cum = 0.0;
    int m = 0;
    while (m < n && cum < keep) cum += probs[m++];
    n = std::max(m, 1);
    sum = 0.0;
    for (int i = 0; i < n; ++i) sum += probs[i];
  }
  *sum_out = sum;
  return n;
}

// One uniform draw picks a kept token by inverse CDF.
int32_t RequestSampler::SampleFrom(std::span<const float> logits, std::span<const int32_t> ids) {
  const double u = NextUniform();  // always exactly one draw per call
  double sum = 0.0;
  const int n = KeepTokens(logits, ids, &sum);
  double target = u * sum, cum = 0.0;
  for (int i = 0; i < n; ++i) {
    cum += probs_[i];
    if (target < cum) return scratch_[i].second;
  }
  return scratch_[n - 1].second;  // rounding: the last kept token
}

void RequestSampler::Distribution(std::span<const float> logits, std::vector<double>* probs) {
  PD_CHECK(params_.temperature > 0.0f) << "Distribution needs temperature > 0";
  probs->assign(logits.size(), 0.0);
  double sum = 0.0;
  const int n = KeepTokens(logits, {}, &sum);
  for (int i = 0; i < n; ++i) (*probs)[scratch_[i].second] = probs_[i] / sum;
}

StopCheck CheckStop(const SamplingParams& params, const StopContext& ctx, int32_t token,
                    int num_generated, int context_len) {
  StopCheck check;
  if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
          params.stop_token_ids.end() ||
      (!params.ignore_eos && ctx.eos_token_id >= 0 && token == ctx.eos_token_id)) {
    check.reason = FinishReason::kStop;
    check.stop_token_id = token;
  } else if (num_generated >= params.max_tokens ||
             (ctx.max_model_len > 0 && context_len >= ctx.max_model_len)) {
    check.reason = FinishReason::kLength;
  }
  return check;
}

}  // namespace pd::engine
