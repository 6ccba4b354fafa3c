// A byte-level Thompson NFA compiled from a RegexNode: each code point class becomes the UTF-8
// byte sequences that encode it (no overlong forms, no surrogates), so the automaton reads the
// output's bytes directly, a token's bytes at a time, even when a token ends inside a character.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"
#include "constrain/regex_parser.h"

namespace pd::constrain {

struct NfaState {
  enum class Kind : uint8_t { kByte, kSplit, kMatch };
  Kind kind = Kind::kMatch;
  uint8_t lo = 0;     // kByte: the byte range read
  uint8_t hi = 0;     //
  int32_t next = -1;  // kByte: after the byte; kSplit: the first branch (an empty move)
  int32_t alt = -1;   // kSplit: the second branch, -1 none
};

inline constexpr int kMaxNfaStates = 1 << 21;
inline constexpr uint32_t kUnreachable = UINT32_MAX;

struct Nfa {
  std::vector<NfaState> states;
  int32_t start = 0;
  int32_t match = 0;
  // (states) the fewest bytes from each state to the match state; kUnreachable when none.
  std::vector<uint32_t> distance;
};

// InvalidArgument when the automaton would exceed kMaxNfaStates ("regex: too large ...").
Result<Nfa> CompileNfa(const RegexNode& root);

// The UTF-8 encodings of the code points [lo, hi] (no surrogates inside) as sequences of byte
// ranges: a byte string encodes a code point of [lo, hi] exactly when it matches one sequence.
using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;
std::vector<ByteRangeSeq> Utf8Sequences(uint32_t lo, uint32_t hi);

}  // namespace pd::constrain
