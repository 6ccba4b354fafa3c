#include "server/xml_call_constraint.h"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace pd::server {
namespace {

constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kEnd = "</function>\n</tool_call>";

// What comes after a fixed piece of text.
enum class Next { kParamOrEnd, kParamName, kValue, kDone };

// The shortest text from the start of `next` to the end of the call.
size_t RestBytes(Next next) {
  switch (next) {
    case Next::kParamOrEnd:
      return kEnd.size();
    case Next::kValue:
      return kParamClose.size() + 1 + kEnd.size();
    case Next::kParamName:
      return 1 + 2 + RestBytes(Next::kValue);  // a name character, ">\n"
    case Next::kDone:
      return 0;
  }
  return 0;
}

bool NameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
}

// Thread safety: not thread-safe; one request's sampler owns it.
class XmlCallState final : public engine::ConstraintState {
 public:
  explicit XmlCallState(const std::vector<std::string>* prefixes) {
    for (const std::string& p : *prefixes) alts_.push_back({p, Next::kParamOrEnd});
  }

  std::unique_ptr<engine::ConstraintState> Clone() const override {
    return std::make_unique<XmlCallState>(*this);
  }
  bool Allows(std::string_view bytes) const override {
    XmlCallState copy = *this;
    return copy.Push(bytes);
  }
  size_t CompletionBytesAfter(std::string_view bytes) const override {
    XmlCallState copy = *this;
    return copy.Push(bytes) ? copy.MinCompletionBytes() : kNever;
  }
  void Advance(std::string_view bytes) override { Push(bytes); }
  bool complete() const override { return state_ == State::kDone; }

 private:
  enum class State { kFixed, kParamName, kValue, kDone };
  struct Alt {
    std::string text;
    Next next;
  };

  void Expect(std::vector<Alt> alts) {
    alts_ = std::move(alts);
    matched_.clear();
    state_ = State::kFixed;
  }

  void Enter(Next next) {
    switch (next) {
      case Next::kParamOrEnd:
        Expect({{std::string(kParamOpen), Next::kParamName}, {std::string(kEnd), Next::kDone}});
        break;
      case Next::kParamName:
        name_len_ = 0;
        state_ = State::kParamName;
        break;
      case Next::kValue:
        tail_.clear();
        state_ = State::kValue;
        break;
      case Next::kDone:
        state_ = State::kDone;
        break;
    }
  }

  bool Push(std::string_view bytes) {
    for (char c : bytes) {
      if (!PushByte(c)) return false;
    }
    return true;
  }

  bool PushByte(char c) {
    switch (state_) {
      case State::kFixed: {
        matched_.push_back(c);
        const Alt* full = nullptr;
        bool any = false;
        for (const Alt& a : alts_) {
          if (!a.text.starts_with(matched_)) continue;
          any = true;
          if (a.text.size() == matched_.size()) full = &a;
        }
        if (full != nullptr) Enter(full->next);  // the alternatives are prefix-free
        return any;
      }
      case State::kParamName:
        if (c == '>' && name_len_ > 0) {
          Expect({{"\n", Next::kValue}});
          return true;
        }
        if (!NameChar(c)) return false;
        ++name_len_;
        return true;
      case State::kValue:
        tail_.push_back(c);
        if (tail_.size() > kParamClose.size()) tail_.erase(0, 1);
        if (std::string_view(tail_).ends_with(kCallClose)) return false;
        if (std::string_view(tail_).ends_with(kParamClose)) Expect({{"\n", Next::kParamOrEnd}});
        return true;
      case State::kDone:
        return false;
    }
    return false;
  }

  size_t MinCompletionBytes() const {
    switch (state_) {
      case State::kFixed: {
        size_t best = kNever;
        for (const Alt& a : alts_) {
          if (a.text.starts_with(matched_)) {
            best = std::min(best, a.text.size() - matched_.size() + RestBytes(a.next));
          }
        }
        return best;
      }
      case State::kParamName:
        return (name_len_ == 0 ? 1 : 0) + 2 + RestBytes(Next::kValue);
      case State::kValue: {
        // The longest end of the value that already begins "</parameter>".
        size_t have = 0;
        for (size_t n = std::min(tail_.size(), kParamClose.size() - 1); n > 0 && have == 0; --n) {
          if (std::string_view(tail_).substr(tail_.size() - n) == kParamClose.substr(0, n)) {
            have = n;
          }
        }
        return kParamClose.size() - have + 1 + kEnd.size();
      }
      case State::kDone:
        return 0;
    }
    return kNever;
  }

  State state_ = State::kFixed;
  std::vector<Alt> alts_;  // kFixed: the texts that may come, and what follows each
  std::string matched_;    // kFixed: matched so far
  int name_len_ = 0;       // kParamName
  std::string tail_;       // kValue: its last bytes, to see "</parameter>" arrive
};

}  // namespace

XmlCallConstraint::XmlCallConstraint(std::shared_ptr<const engine::TokenTexts> texts,
                                     const std::vector<std::string>& names)
    : OutputConstraint(std::move(texts)) {
  for (const std::string& name : names) {
    prefixes_.push_back("<tool_call>\n<function=" + name + ">\n");
  }
}

std::unique_ptr<engine::ConstraintState> XmlCallConstraint::Start() const {
  return std::make_unique<XmlCallState>(&prefixes_);
}

}  // namespace pd::server
