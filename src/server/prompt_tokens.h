// A generation request's prompt as token ids, exactly as an instance computes them (the router
// computes the same ids to find where a prompt's KV pages are cached), and a fingerprint of a
// tokenizer's behaviour so that the router can tell whether it tokenizes as an instance does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/tokenizer.h"
#include "server/openai_protocol.h"

namespace pd::server {

// Text to ids as HF tokenizers do: bos prepended when the tokenizer adds one (and the text does
// not already start with it).
std::vector<int32_t> EncodePromptText(const model::Tokenizer& tokenizer, const std::string& text,
                                      bool add_special_tokens);
// The prompt of a parsed completion or chat request (chat: through the chat template).
Result<std::vector<int32_t>> PromptTokens(const model::Tokenizer& tokenizer,
                                          const GenerateRequest& request);
// A hash of how `tokenizer` turns probe texts and a probe chat into ids (vocabulary, merges,
// special tokens, bos handling and chat template all show). Two tokenizers with equal
// fingerprints tokenize the probes alike (up to a 64-bit hash collision); different ones differ
// somewhere.
uint64_t TokenizerFingerprint(const model::Tokenizer& tokenizer);

}  // namespace pd::server
