// A compiled split regex (PCRE2, UTF + UCP, JIT when available) as HF's Split pre-tokenizer
// with behavior "Isolated" uses it: the text is cut into the matches and the gaps between them.
//
// Thread safety: immutable after Create; Split may run on many threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pd::model::internal {

// GPT-2's split regex (HF ByteLevel pre-tokenizer with use_regex true).
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama-3's split regex (tokenizer.json of Meta-Llama-3).
inline constexpr std::string_view kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2's split regex (as Llama-3's but digits one at a time).
inline constexpr std::string_view kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class RegexSplitter {
 public:
  // InvalidArgument (with PCRE2's message and the offset) when the pattern does not compile.
  static Result<std::unique_ptr<RegexSplitter>> Create(std::string_view pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the non-empty pieces of `text` in order: each match and each gap between matches.
  // Their concatenation is `text`. Bytes that are not valid UTF-8 never match and so land in gaps.
  void Split(std::string_view text, std::vector<std::string_view>* pieces) const;

  const std::string& pattern() const { return pattern_; }

 private:
  RegexSplitter() = default;

  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*, kept opaque so pcre2.h stays out of this header
};

}  // namespace pd::model::internal
