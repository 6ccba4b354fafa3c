// Internal to synthetic_tokenizer*.cc: per-arch data too long to sit in synthetic_tokenizer.cc.
#pragma once

#include <cstddef>
#include <iterator>

namespace pd::model::internal {

// DeepSeek-V3's chat template and its special tokens, bos and eos first
// (synthetic_tokenizer_deepseek.cc).
extern const char kDeepseekV3ChatTemplate[];
extern const char* const kDeepseekV3SpecialTokens[];
extern const size_t kNumDeepseekV3SpecialTokens;

}  // namespace pd::model::internal
