// A regular expression parser for structured outputs (guided_regex, JSON schema "pattern", and the
// regexes a JSON schema compiles to). The syntax is the common subset of Python's `re` and
// ECMAScript: literals (UTF-8), `.`, classes `[a-z]` `[^...]`, escapes (\d \w \s and their
// negations, \n \t \r \f \v \0, \xHH, \uHHHH, \u{H...}, escaped punctuation), groups `(...)`
// `(?:...)` `(?P<name>...)` `(?<name>...)`, alternation, and the quantifiers * + ? {n} {n,} {n,m}
// (a lazy `?` after one is accepted and means the same: the language is what matters). The whole
// output must match, so `^` at the very start and `$` at the very end are implicit and accepted;
// anywhere else they, back-references, look-arounds, word boundaries and inline flags are
// refused with an error naming them.
//
// The tree is over Unicode code points; nfa.h turns it into a byte-level automaton.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace pd::constrain {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;
inline constexpr int kMaxRepeat = 10000;  // the largest bound of {n,m}

struct RegexNode {
  enum class Kind { kEmpty, kClass, kConcat, kAlt, kRepeat };
  Kind kind = Kind::kEmpty;
  // kClass: sorted, disjoint, non-adjacent code point ranges [first, second]; never a surrogate.
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  std::vector<RegexNode> children;  // kConcat, kAlt: the parts; kRepeat: the one repeated
  int min = 0;                      // kRepeat
  int max = -1;                     // kRepeat: -1 unbounded
};

struct RegexOptions {
  // The pattern describes a JSON string's value written without escapes: every class (and `.`)
  // leaves out '"', '\' and U+0000..U+001F, which a JSON string cannot hold raw.
  bool json_string_chars = false;
};

// InvalidArgument names the problem and its offset ("regex: unsupported back-reference '\1' at
// offset 3").
Result<RegexNode> ParseRegex(std::string_view pattern, const RegexOptions& options = {});

// Escapes every regex metacharacter of `text`, so that the result matches exactly `text`.
std::string EscapeRegex(std::string_view text);

}  // namespace pd::constrain
