// `pdserve bench-engine --phase spec`: what speculative decoding costs and gives on this machine.
//   1. The verification step: one sequence running its last token and K drafts (K + 1 query
//      tokens, logits at each) against one decode step (K = 0), at batch 1, K = 1..max_k.
//   2. TPOT at batch 1, greedy, on a prompt-copying workload (a block of tokens repeated), with
//      n-gram drafts beside no speculation, and the mean acceptance length measured; with a
//      draft model (--draft-model DIR, or --draft-layers N: the target's own first N layers)
//      also a draft_model row, with its acceptance rate; for a deepseek_v3 checkpoint with its
//      MTP layer an mtp row (K = draft_k), with its acceptance rate.
#pragma once

#include <string>

#include "common/status.h"
#include "model/weights.h"

namespace pd::apps {

struct SpecBenchOptions {
  int threads = 2;
  double seconds = 3.0;  // least time measured per verification row
  int context = 128;     // tokens before the verified ones
  int max_k = 4;
  int num_requests = 4;  // TPOT: requests run one after another
  int max_tokens = 64;   // TPOT: tokens generated per request
  bool json = false;
  std::string draft_model_dir;  // draft_model row: a checkpoint ("": none) ...
  int draft_layers = 0;         // ... or the target's first N layers (0: none)
  int draft_k = 3;              // its (and the mtp row's) num_speculative_tokens
};

Status RunSpecBench(const std::string& name, const model::ModelWeights& weights,
                    const SpecBenchOptions& options);

}  // namespace pd::apps
