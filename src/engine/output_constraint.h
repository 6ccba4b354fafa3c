// Constrained decoding: a request may carry an OutputConstraint, a language its output text must
// stay inside (tool_choice "required" or a named function: "a fixed prefix, one JSON object, a
// fixed suffix"; JSON-schema constraints can implement the same interface). The sampler asks the
// constraint's state about candidate tokens by the bytes each would add to the text, and advances
// it with the token it picks.
//
// Token bytes come from TokenTexts, built once per tokenizer by whoever owns the tokenizer (the
// HTTP server) and shared by every constrained request: the engine itself only knows ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pd::engine {

// What each token id writes into the output text. Thread safety: immutable once built.
struct TokenTexts {
  std::vector<std::string> bytes;  // (vocab) the token's bytes
  std::vector<bool> writes;        // (vocab) false: the token writes no text (a special token)
  int size() const { return static_cast<int>(bytes.size()); }
};

// The tokens a constraint state allows at once, one bit per token id: bit (id % 64) of word
// (id / 64). Only tokens that write text are ever set; end-of-sequence tokens are the sampler's.
struct TokenMask {
  std::vector<uint64_t> bits;  // (ceil(vocab / 64))
  bool Has(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id / 64) < bits.size() &&
           ((bits[id / 64] >> (id % 64)) & 1) != 0;
  }
};

// One request's position inside the constrained language.
//
// Speculative decoding checks drafted tokens position by position: Clone the state, then for each
// draft token ask Allows / AllowedTokens and Advance the clone; the sampler's own state advances
// only by the tokens accepted.
// Thread safety: not thread-safe; the request's sampler owns it.
class ConstraintState {
 public:
  virtual ~ConstraintState() = default;
  virtual std::unique_ptr<ConstraintState> Clone() const = 0;
  // Whether the text so far followed by `bytes` is still a prefix of some sentence of the language.
  // Empty bytes: true.
  virtual bool Allows(std::string_view bytes) const = 0;
  // The length of the shortest text that would complete the sentence after `bytes` is appended;
  // kNever when `bytes` cannot follow. A sampler that knows how many tokens are left keeps this
  // within reach, so that the output completes before max_tokens.
  static constexpr size_t kNever = static_cast<size_t>(-1);
  virtual size_t CompletionBytesAfter(std::string_view bytes) const = 0;
  // Appends bytes that Allows accepted.
  virtual void Advance(std::string_view bytes) = 0;
  // The text so far is a whole sentence: only an end-of-sequence token may follow.
  virtual bool complete() const = 0;
  // The text so far is a whole sentence, which may also go on (a regex's "[0-9]+" after "12"): an
  // end-of-sequence token may follow, and so may the tokens Allows accepts.
  virtual bool accepting() const { return complete(); }
  // A fast path: the tokens whose bytes Allows accepts, all at once; null when this state does not
  // compute them (the sampler then asks Allows token by token). Valid while the constraint lives.
  virtual const TokenMask* AllowedTokens() const { return nullptr; }
};

// Thread safety: immutable; shared by the requests that use it.
class OutputConstraint {
 public:
  explicit OutputConstraint(std::shared_ptr<const TokenTexts> texts) : texts_(std::move(texts)) {}
  virtual ~OutputConstraint() = default;
  virtual std::unique_ptr<ConstraintState> Start() const = 0;
  const TokenTexts& texts() const { return *texts_; }

 private:
  std::shared_ptr<const TokenTexts> texts_;
};

// The constraint of a tool call: the text is one of `prefixes`, then one JSON object (any
// syntactically valid object, whitespace runs between tokens at most kMaxWhitespaceRun long), then
// `suffix`. The prefixes must be prefix-free (none is a proper prefix of another).
class JsonCallConstraint : public OutputConstraint {
 public:
  static constexpr int kMaxWhitespaceRun = 64;
  JsonCallConstraint(std::shared_ptr<const TokenTexts> texts, std::vector<std::string> prefixes,
                     std::string suffix)
      : OutputConstraint(std::move(texts)),
        prefixes_(std::move(prefixes)),
        suffix_(std::move(suffix)) {}
  std::unique_ptr<ConstraintState> Start() const override;

 private:
  std::vector<std::string> prefixes_;
  std::string suffix_;
};

// A character-level recogniser of one JSON object (RFC 8259 syntax; strings must be valid
// UTF-8). Push returns false, leaving the scanner unchanged in meaning, for a byte that cannot
// continue any valid object. Copyable: a candidate token is tried on a copy.
class JsonObjectScanner {
 public:
  bool Push(unsigned char c);
  bool done() const { return mode_ == Mode::kDone; }
  // The length of the shortest text that closes the object from here ("0" for a value, a closing
  // quote, then one bracket per open container).
  size_t MinCompletionBytes() const;

 private:
  enum class Mode : uint8_t {
    kStart,            // before the top-level '{'
    kValue,            // a value is expected
    kKeyOrEnd,         // after '{': a key or '}'
    kKey,              // after ',' in an object: a key
    kColon,            // after a key
    kObjectNext,       // after a member: ',' or '}'
    kArrayValueOrEnd,  // after '[': a value or ']'
    kArrayNext,        // after an element: ',' or ']'
    kString,           // inside a string
    kEscape,           // after a backslash
    kUnicode,          // inside \uXXXX (hex_left_ digits to go)
    kNumber,           // inside a number (num_ says where)
    kLiteral,          // inside true/false/null
    kDone,             // the top-level object closed
  };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

  bool PushInString(unsigned char c);
  bool PushInNumber(unsigned char c);
  bool StartValue(unsigned char c);
  void EndValue();
  bool Whitespace(unsigned char c);

  Mode mode_ = Mode::kStart;
  std::string stack_;  // open containers, '{' or '['
  bool string_is_key_ = false;
  uint8_t utf8_left_ = 0;   // continuation bytes still expected in a string
  uint8_t utf8_lo_ = 0x80;  // the range of the next continuation byte (no overlongs, no
  uint8_t utf8_hi_ = 0xBF;  // surrogates, nothing above U+10FFFF)
  uint8_t hex_left_ = 0;
  Num num_ = Num::kInt;
  const char* literal_ = nullptr;  // the rest of true/false/null still to come
  int whitespace_run_ = 0;
};

}  // namespace pd::engine
