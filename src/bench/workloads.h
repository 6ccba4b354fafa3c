// Workloads that repeat themselves, for measuring prefix caching with `pdserve bench`:
//  - prefix_repetition (vLLM's dataset and flag names): num_prefixes random prefixes of
//    prefix_len tokens; each request is one of them (each prefix used equally often, the requests
//    shuffled) followed by suffix_len random tokens of its own; output_len tokens out.
//  - multi_turn: conversations of num_turns turns; each turn's request resends the conversation
//    so far (every earlier user message and the server's reply to it) and adds a user message of
//    user_len tokens; output_len tokens out. A conversation's turns run one after another;
//    conversations arrive at the request rate.
// Completions requests carry token ids (prefix_repetition) or text (multi_turn: the turns joined
// by newlines); chat requests carry text of about the token counts asked.
#pragma once

#include <cstdint>
#include <vector>

#include "bench/client.h"
#include "common/status.h"

namespace pd::bench {

struct PrefixRepetitionSpec {
  int prefix_len = 256;  // vLLM's defaults
  int suffix_len = 256;
  int num_prefixes = 10;
  int output_len = 128;
};

struct MultiTurnSpec {
  int num_turns = 4;
  int user_len = 128;  // tokens of each new user message
  int output_len = 64;
};

// num_prompts requests like `base` (path, model, ignore_eos), deterministic for a seed.
// InvalidArgument naming the flag when a length is out of range or a request (for multi_turn, a
// conversation's last turn) would not fit max_total_len tokens.
Result<std::vector<GenerationRequest>> PrefixRepetitionRequests(const PrefixRepetitionSpec& spec,
                                                                int num_prompts, uint64_t seed,
                                                                int max_total_len,
                                                                const GenerationRequest& base);
// num_prompts requests in all: conversations of spec.num_turns (the last one may be shorter),
// request i of conversation c has conversation = c, turn = i.
Result<std::vector<GenerationRequest>> MultiTurnRequests(const MultiTurnSpec& spec, int num_prompts,
                                                         uint64_t seed, int max_total_len,
                                                         const GenerationRequest& base);

}  // namespace pd::bench
