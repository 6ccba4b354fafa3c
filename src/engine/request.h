// What a request asks of the engine and what the engine gives back.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace pd::engine {

class OutputConstraint;

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 or -1: off
  std::optional<uint64_t> seed;
  int max_tokens = 16;  // generated tokens, >= 1
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = -1;  // -1: none; 0: the chosen token's; N: also the top N
  // Null: none. Otherwise the output text must stay inside this language (output_constraint.h);
  // once it is complete only an end-of-sequence token (EOS unless ignore_eos, stop_token_ids) may
  // follow.
  std::shared_ptr<const OutputConstraint> constraint;
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
std::string_view FinishReasonName(FinishReason reason);  // "", "stop", "length", "abort", "error"

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), best first
};

struct Request {
  int64_t id = 0;
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  double arrival_time = 0.0;  // Clock seconds
};

// A prefill-only request ran its last chunk (disaggregation, prefill side). The engine keeps one
// reference on each page for the receiver, who gives them back with ReleasePages when done.
struct PrefillResult {
  std::vector<int32_t> page_table;  // covers num_tokens tokens
  int num_tokens = 0;
  std::vector<float> last_hidden;  // (hidden) final-norm hidden state of the last token
};

// One step's news for one request: tokens generated this step and whether it finished.
struct RequestOutput {
  int64_t request_id = 0;
  std::vector<int32_t> new_token_ids;
  std::vector<TokenLogprob> logprobs;  // one per new token when sampling.logprobs >= 0
  FinishReason finish_reason = FinishReason::kNone;
  int32_t stop_token_id = -1;  // the token that stopped it, when kStop by a token
  Status error;                // set when finish_reason == kError
  int num_prompt_tokens = 0;
  int num_generated_tokens = 0;       // total so far
  int num_cached_tokens = 0;          // prompt tokens found in the prefix cache at admission
  double first_scheduled_time = 0.0;  // Clock seconds (queue time = this - arrival)
  // Set on the final (kStop) output of a prefill-only request.
  std::shared_ptr<const PrefillResult> prefill_result;
  bool finished() const { return finish_reason != FinishReason::kNone; }
};

}  // namespace pd::engine
