// The cost of structured outputs per token, beside a decode step: the constrained sampler's time
// per token (its state's token mask, computed on first visit and cached, then the choice among
// the allowed tokens) against the same sampler unconstrained, on random logits over a real
// tokenizer's vocabulary (the mask's work does not depend on the logits' source); and the decode
// step time of a model at batch 1.
#pragma once

#include <string>

#include "common/status.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace pd::constrain {

struct MaskBenchOptions {
  std::string schema;    // JSON schema text
  int max_tokens = 256;  // per request
  int num_requests = 4;  // the first runs with a fresh automaton (cold), the rest reuse it
  float temperature = 0.0f;
  uint64_t seed = 1;
};

struct MaskBenchResult {
  double compile_ms = 0.0;
  double cold_us_per_token = 0.0;   // constrained Sample, first request
  double warm_us_per_token = 0.0;   // constrained Sample, later requests
  double plain_us_per_token = 0.0;  // unconstrained Sample, same logits
  int tokens = 0;                   // sampled over all requests
  int dfa_states = 0;
};

Result<MaskBenchResult> BenchMask(const model::Tokenizer& tokenizer, const MaskBenchOptions& o);

// Mean milliseconds per decode step of one greedy request of `tokens` tokens at batch 1.
Result<double> DecodeStepMs(const model::ModelWeights& weights, int tokens, int num_threads);

}  // namespace pd::constrain
