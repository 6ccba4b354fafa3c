#include "engine/output_constraint.h"

namespace pd::engine {
namespace {

bool IsWhitespace(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsHex(unsigned char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

bool JsonObjectScanner::Whitespace(unsigned char c) {
  if (!IsWhitespace(c) || whitespace_run_ >= JsonCallConstraint::kMaxWhitespaceRun) return false;
  ++whitespace_run_;
  return true;
}

// After a complete value: where the enclosing container (or the top level) goes on.
void JsonObjectScanner::EndValue() {
  if (stack_.empty()) {
    mode_ = Mode::kDone;
  } else {
    mode_ = stack_.back() == '{' ? Mode::kObjectNext : Mode::kArrayNext;
  }
}

bool JsonObjectScanner::StartValue(unsigned char c) {
  switch (c) {
    case '{':
      stack_.push_back('{');
      mode_ = Mode::kKeyOrEnd;
      return true;
    case '[':
      stack_.push_back('[');
      mode_ = Mode::kArrayValueOrEnd;
      return true;
    case '"':
      string_is_key_ = false;
      mode_ = Mode::kString;
      return true;
    case 't':
      literal_ = "rue";
      mode_ = Mode::kLiteral;
      return true;
    case 'f':
      literal_ = "alse";
      mode_ = Mode::kLiteral;
      return true;
    case 'n':
      literal_ = "ull";
      mode_ = Mode::kLiteral;
      return true;
    case '-':
      num_ = Num::kMinus;
      mode_ = Mode::kNumber;
      return true;
    default:
      if (!IsDigit(c)) return false;
      num_ = c == '0' ? Num::kZero : Num::kInt;
      mode_ = Mode::kNumber;
      return true;
  }
}

bool JsonObjectScanner::PushInString(unsigned char c) {
  if (utf8_left_ > 0) {
    if (c < utf8_lo_ || c > utf8_hi_) return false;
    --utf8_left_;
    utf8_lo_ = 0x80;
    utf8_hi_ = 0xBF;
    return true;
  }
  if (c == '"') {
    if (string_is_key_) {
      mode_ = Mode::kColon;
    } else {
      EndValue();
    }
    return true;
  }
  if (c == '\\') {
    mode_ = Mode::kEscape;
    return true;
  }
  if (c < 0x20) return false;  // control characters must be escaped
  if (c < 0x80) return true;
  // A UTF-8 lead byte: how many continuation bytes follow, and the range of the first one.
  if (c >= 0xC2 && c <= 0xDF) {
    utf8_left_ = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    utf8_left_ = 2;
    if (c == 0xE0) utf8_lo_ = 0xA0;  // no overlong forms
    if (c == 0xED) utf8_hi_ = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    utf8_left_ = 3;
    if (c == 0xF0) utf8_lo_ = 0x90;
    if (c == 0xF4) utf8_hi_ = 0x8F;  // nothing above U+10FFFF
  } else {
    return false;
  }
  return true;
}

// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? ; a byte that cannot extend the number ends it
// (when it may end there) and is then read as what follows the value.
bool JsonObjectScanner::PushInNumber(unsigned char c) {
  switch (num_) {
    case Num::kMinus:
      if (!IsDigit(c)) return false;
      num_ = c == '0' ? Num::kZero : Num::kInt;
      return true;
    case Num::kZero:
    case Num::kInt:
      if (IsDigit(c) && num_ == Num::kInt) return true;
      if (c == '.') {
        num_ = Num::kDot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        num_ = Num::kExp;
        return true;
      }
      break;
    case Num::kDot:
      if (!IsDigit(c)) return false;
      num_ = Num::kFrac;
      return true;
    case Num::kFrac:
      if (IsDigit(c)) return true;
      if (c == 'e' || c == 'E') {
        num_ = Num::kExp;
        return true;
      }
      break;
    case Num::kExp:
      if (c == '+' || c == '-') {
        num_ = Num::kExpSign;
        return true;
      }
      [[fallthrough]];
    case Num::kExpSign:
      if (!IsDigit(c)) return false;
      num_ = Num::kExpDigits;
      return true;
    case Num::kExpDigits:
      if (IsDigit(c)) return true;
      break;
  }
  // The number may end here: c belongs to what follows it.
  JsonObjectScanner saved = *this;
  EndValue();
  if (Push(c)) return true;
  *this = saved;
  return false;
}

bool JsonObjectScanner::Push(unsigned char c) {
  if (!IsWhitespace(c)) whitespace_run_ = 0;
  switch (mode_) {
    case Mode::kStart:
      if (c != '{') return false;
      stack_.push_back('{');
      mode_ = Mode::kKeyOrEnd;
      return true;
    case Mode::kValue:
      return Whitespace(c) || StartValue(c);
    case Mode::kKeyOrEnd:
    case Mode::kKey:
      if (Whitespace(c)) return true;
      if (c == '"') {
        string_is_key_ = true;
        mode_ = Mode::kString;
        return true;
      }
      if (c != '}' || mode_ == Mode::kKey) return false;
      stack_.pop_back();
      EndValue();
      return true;
    case Mode::kColon:
      if (Whitespace(c)) return true;
      if (c != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kObjectNext:
    case Mode::kArrayNext: {
      if (Whitespace(c)) return true;
      const bool object = mode_ == Mode::kObjectNext;
      if (c == ',') {
        mode_ = object ? Mode::kKey : Mode::kValue;
        return true;
      }
      if (c != (object ? '}' : ']')) return false;
      stack_.pop_back();
      EndValue();
      return true;
    }
    case Mode::kArrayValueOrEnd:
      if (Whitespace(c)) return true;
      if (c == ']') {
        stack_.pop_back();
        EndValue();
        return true;
      }
      return StartValue(c);
    case Mode::kString:
      return PushInString(c);
    case Mode::kEscape:
      if (c == 'u') {
        hex_left_ = 4;
        mode_ = Mode::kUnicode;
        return true;
      }
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' &&
          c != 't') {
        return false;
      }
      mode_ = Mode::kString;
      return true;
    case Mode::kUnicode:
      if (!IsHex(c)) return false;
      if (--hex_left_ == 0) mode_ = Mode::kString;
      return true;
    case Mode::kNumber:
      return PushInNumber(c);
    case Mode::kLiteral:
      if (c != static_cast<unsigned char>(*literal_)) return false;
      if (*++literal_ == '\0') EndValue();
      return true;
    case Mode::kDone:
      return false;
  }
  return false;
}

size_t JsonObjectScanner::MinCompletionBytes() const {
  const size_t closers = stack_.size();
  const size_t after_key = string_is_key_ ? 2 : 0;  // ":0"
  switch (mode_) {
    case Mode::kStart:
      return 2;  // "{}"
    case Mode::kValue:
      return 1 + closers;
    case Mode::kKeyOrEnd:
    case Mode::kObjectNext:
    case Mode::kArrayValueOrEnd:
    case Mode::kArrayNext:
      return closers;
    case Mode::kKey:
      return 4 + closers;  // "\"\":0"
    case Mode::kColon:
      return 2 + closers;
    case Mode::kString:
      return utf8_left_ + 1 + after_key + closers;
    case Mode::kEscape:
      return 2 + after_key + closers;
    case Mode::kUnicode:
      return hex_left_ + 1 + after_key + closers;
    case Mode::kNumber: {
      const bool needs_digit =
          num_ == Num::kMinus || num_ == Num::kDot || num_ == Num::kExp || num_ == Num::kExpSign;
      return (needs_digit ? 1 : 0) + closers;
    }
    case Mode::kLiteral:
      return std::string_view(literal_).size() + closers;
    case Mode::kDone:
      return 0;
  }
  return 0;
}

namespace {

// Prefix (one of several), JSON object, suffix: a byte at a time.
class JsonCallState final : public ConstraintState {
 public:
  JsonCallState(const std::vector<std::string>* prefixes, const std::string* suffix)
      : prefixes_(prefixes), suffix_(suffix) {
    for (const std::string& p : *prefixes_) {
      if (p.empty()) phase_ = Phase::kJson;
    }
  }

  std::unique_ptr<ConstraintState> Clone() const override {
    return std::make_unique<JsonCallState>(*this);
  }
  bool Allows(std::string_view bytes) const override {
    JsonCallState copy = *this;
    return copy.Push(bytes);
  }
  size_t CompletionBytesAfter(std::string_view bytes) const override {
    JsonCallState copy = *this;
    return copy.Push(bytes) ? copy.MinCompletionBytes() : kNever;
  }
  void Advance(std::string_view bytes) override { Push(bytes); }
  bool complete() const override {
    return phase_ == Phase::kSuffix && suffix_pos_ == suffix_->size();
  }

 private:
  enum class Phase { kPrefix, kJson, kSuffix };

  size_t MinCompletionBytes() const {
    switch (phase_) {
      case Phase::kPrefix: {
        size_t best = kNever;
        for (const std::string& p : *prefixes_) {
          if (p.starts_with(matched_)) best = std::min(best, p.size() - matched_.size());
        }
        return best == kNever ? kNever : best + 2 + suffix_->size();
      }
      case Phase::kJson:
        return json_.MinCompletionBytes() + suffix_->size();
      case Phase::kSuffix:
        return suffix_->size() - suffix_pos_;
    }
    return kNever;
  }

  bool Push(std::string_view bytes) {
    for (char ch : bytes) {
      if (!PushByte(ch)) return false;
    }
    return true;
  }

  bool PushByte(char ch) {
    switch (phase_) {
      case Phase::kPrefix: {
        matched_.push_back(ch);
        bool any = false;
        for (const std::string& p : *prefixes_) {
          if (!p.starts_with(matched_)) continue;
          any = true;
          if (p.size() == matched_.size()) phase_ = Phase::kJson;  // prefix-free: the only one
        }
        return any;
      }
      case Phase::kJson:
        if (!json_.Push(static_cast<unsigned char>(ch))) return false;
        if (json_.done()) phase_ = Phase::kSuffix;
        return true;
      case Phase::kSuffix:
        if (suffix_pos_ >= suffix_->size() || (*suffix_)[suffix_pos_] != ch) return false;
        ++suffix_pos_;
        return true;
    }
    return false;
  }

  const std::vector<std::string>* prefixes_;
  const std::string* suffix_;
  Phase phase_ = Phase::kPrefix;
  std::string matched_;  // the prefix so far
  JsonObjectScanner json_;
  size_t suffix_pos_ = 0;
};

}  // namespace

std::unique_ptr<ConstraintState> JsonCallConstraint::Start() const {
  return std::make_unique<JsonCallState>(&prefixes_, &suffix_);
}

}  // namespace pd::engine
