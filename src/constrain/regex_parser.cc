#include "constrain/regex_parser.h"

#include <algorithm>

namespace pd::constrain {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;

// Sorts and merges overlapping or adjacent ranges, and drops the surrogates.
Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  Ranges split;
  for (auto [lo, hi] : out) {
    if (hi < kSurrogateLo || lo > kSurrogateHi) {
      split.push_back({lo, hi});
      continue;
    }
    if (lo < kSurrogateLo) split.push_back({lo, kSurrogateLo - 1});
    if (hi > kSurrogateHi) split.push_back({kSurrogateHi + 1, hi});
  }
  return split;
}

// Every code point not in r (r normalized).
Ranges Complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return Normalize(out);
}

Ranges Subtract(const Ranges& a, const Ranges& b) {
  Ranges keep;
  const Ranges not_b = Complement(Normalize(b));
  for (auto [lo, hi] : Normalize(a)) {
    for (auto [blo, bhi] : not_b) {
      const uint32_t l = std::max(lo, blo), h = std::min(hi, bhi);
      if (l <= h) keep.push_back({l, h});
    }
  }
  return Normalize(keep);
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

class Parser {
 public:
  Parser(std::string_view p, const RegexOptions& o) : p_(p), options_(o) {}

  Result<RegexNode> Parse() {
    if (pos_ < p_.size() && p_[pos_] == '^') ++pos_;  // implicit: the whole output matches
    ASSIGN_OR_RETURN(RegexNode node, ParseAlt(0));
    if (pos_ < p_.size()) return Error("unmatched ')'");
    return node;
  }

 private:
  Status Error(std::string_view what) const {
    return InvalidArgument("regex: " + std::string(what) + " at offset " + std::to_string(pos_) +
                           " of \"" + std::string(p_) + "\"");
  }
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return p_[pos_]; }

  Result<RegexNode> ParseAlt(int depth) {
    if (depth > 200) return Error("groups nested too deeply");
    RegexNode alt;
    alt.kind = RegexNode::Kind::kAlt;
    while (true) {
      ASSIGN_OR_RETURN(RegexNode c, ParseConcat(depth));
      alt.children.push_back(std::move(c));
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    if (alt.children.size() == 1) return std::move(alt.children[0]);
    return alt;
  }

  Result<RegexNode> ParseConcat(int depth) {
    RegexNode cat;
    cat.kind = RegexNode::Kind::kConcat;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$' && pos_ + 1 == p_.size()) {  // implicit at the very end
        ++pos_;
        break;
      }
      ASSIGN_OR_RETURN(RegexNode atom, ParseAtom(depth));
      ASSIGN_OR_RETURN(atom, ParseQuantifiers(std::move(atom)));
      cat.children.push_back(std::move(atom));
    }
    if (cat.children.empty()) return RegexNode{};
    if (cat.children.size() == 1) return std::move(cat.children[0]);
    return cat;
  }

  Result<int> ParseInt() {
    const size_t start = pos_;
    int64_t v = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      if (v > kMaxRepeat) return Error("repetition bound above " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    if (pos_ == start) return -1;
    return static_cast<int>(v);
  }

  Result<RegexNode> ParseQuantifiers(RegexNode atom) {
    while (!AtEnd()) {
      int lo = 0, hi = -1;
      const char c = Peek();
      if (c == '*' || c == '+' || c == '?') {
        lo = c == '+' ? 1 : 0;
        hi = c == '?' ? 1 : -1;
        ++pos_;
      } else if (c == '{') {
        ++pos_;
        ASSIGN_OR_RETURN(lo, ParseInt());
        if (lo < 0) return Error("'{' without a repetition count (write '\\{' for the brace)");
        hi = lo;
        if (!AtEnd() && Peek() == ',') {
          ++pos_;
          ASSIGN_OR_RETURN(hi, ParseInt());
        }
        if (AtEnd() || Peek() != '}') return Error("unterminated repetition '{'");
        ++pos_;
        if (hi >= 0 && hi < lo) return Error("repetition {n,m} with m < n");
      } else {
        break;
      }
      if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: the same language
      if (!AtEnd() && Peek() == '+') return Error("unsupported possessive quantifier");
      RegexNode rep;
      rep.kind = RegexNode::Kind::kRepeat;
      rep.min = lo;
      rep.max = hi;
      rep.children.push_back(std::move(atom));
      atom = std::move(rep);
    }
    return atom;
  }

  RegexNode Class(Ranges r) const {
    RegexNode n;
    n.kind = RegexNode::Kind::kClass;
    n.ranges = Normalize(std::move(r));
    if (options_.json_string_chars)
      n.ranges = Subtract(n.ranges, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
    return n;
  }

  // One UTF-8 encoded code point of the pattern.
  Result<uint32_t> ParseLiteral() {
    const auto b = static_cast<unsigned char>(p_[pos_]);
    int len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (len == 0 || pos_ + len > p_.size()) return Error("invalid UTF-8");
    uint32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const auto c = static_cast<unsigned char>(p_[pos_ + i]);
      if ((c & 0xC0) != 0x80) return Error("invalid UTF-8");
      cp = (cp << 6) | (c & 0x3F);
    }
    if (cp > kMaxCodePoint || (cp >= kSurrogateLo && cp <= kSurrogateHi))
      return Error("invalid UTF-8");
    pos_ += len;
    return cp;
  }

  Result<uint32_t> ParseHex(size_t digits) {
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      if (AtEnd()) return Error("truncated hexadecimal escape");
      const char c = Peek();
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) return Error("invalid hexadecimal digit");
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  // After a backslash: the escaped code point (a class escape like \d sets *ranges instead).
  Result<uint32_t> ParseEscape(Ranges* ranges) {
    if (AtEnd()) return Error("trailing backslash");
    const char c = Peek();
    ++pos_;
    switch (c) {
      case 'd':
        *ranges = kDigit;
        return 0;
      case 'D':
        *ranges = Complement(kDigit);
        return 0;
      case 'w':
        *ranges = kWord;
        return 0;
      case 'W':
        *ranges = Complement(kWord);
        return 0;
      case 's':
        *ranges = kSpace;
        return 0;
      case 'S':
        *ranges = Complement(kSpace);
        return 0;
      case 'n':
        return '\n';
      case 't':
        return '\t';
      case 'r':
        return '\r';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case '0':
        return 0;
      case 'x':
      case 'u': {
        uint32_t cp = 0;
        if (!AtEnd() && Peek() == '{') {
          ++pos_;
          const size_t close = p_.find('}', pos_);
          if (close == std::string_view::npos || close == pos_ || close - pos_ > 6)
            return Error("invalid '\\u{...}'");
          ASSIGN_OR_RETURN(cp, ParseHex(close - pos_));
          ++pos_;
        } else {
          ASSIGN_OR_RETURN(cp, ParseHex(c == 'x' ? 2 : 4));
        }
        if (cp > kMaxCodePoint || (cp >= kSurrogateLo && cp <= kSurrogateHi))
          return Error("escape outside Unicode scalar values");
        return cp;
      }
      case 'b':
      case 'B':
        --pos_;
        return Error("unsupported word boundary '\\" + std::string(1, c) + "'");
      default:
        break;
    }
    if (c >= '1' && c <= '9') {
      --pos_;
      return Error("unsupported back-reference '\\" + std::string(1, c) + "'");
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      --pos_;
      return Error("unsupported escape '\\" + std::string(1, c) + "'");
    }
    --pos_;
    return ParseLiteral();  // escaped punctuation (or any other character): itself
  }

  Result<RegexNode> ParseClass() {
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges r;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated character class '['");
      if (Peek() == ']' && !first) break;
      first = false;
      Ranges escaped;
      uint32_t lo = 0;
      if (Peek() == '\\') {
        ++pos_;
        ASSIGN_OR_RETURN(lo, ParseEscape(&escaped));
      } else {
        if (Peek() == '[' && pos_ + 1 < p_.size() && p_[pos_ + 1] == ':')
          return Error("unsupported POSIX class '[:'");
        ASSIGN_OR_RETURN(lo, ParseLiteral());
      }
      if (!escaped.empty()) {
        r.insert(r.end(), escaped.begin(), escaped.end());
        continue;
      }
      uint32_t hi = lo;
      if (pos_ + 1 < p_.size() && Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        if (Peek() == '\\') {
          ++pos_;
          ASSIGN_OR_RETURN(hi, ParseEscape(&escaped));
          if (!escaped.empty()) return Error("a class escape cannot end a range");
        } else {
          ASSIGN_OR_RETURN(hi, ParseLiteral());
        }
        if (hi < lo) return Error("character range out of order");
      }
      r.push_back({lo, hi});
    }
    ++pos_;  // ']'
    r = Normalize(r);
    return Class(negate ? Complement(r) : r);
  }

  Result<RegexNode> ParseGroup(int depth) {
    if (!AtEnd() && Peek() == '?') {
      ++pos_;
      if (!AtEnd() && Peek() == ':') {
        ++pos_;
      } else if (!AtEnd() && (Peek() == 'P' || Peek() == '<') && p_.substr(pos_, 2) != "<=" &&
                 p_.substr(pos_, 2) != "<!") {
        if (Peek() == 'P') ++pos_;
        if (AtEnd() || Peek() != '<') return Error("unsupported group '(?P'");
        const size_t close = p_.find('>', pos_);
        if (close == std::string_view::npos) return Error("unterminated group name");
        pos_ = close + 1;
      } else {
        return Error("unsupported group '(?" + std::string(p_.substr(pos_, 1)) +
                     "' (look-arounds and inline flags are not supported)");
      }
    }
    ASSIGN_OR_RETURN(RegexNode inner, ParseAlt(depth + 1));
    if (AtEnd() || Peek() != ')') return Error("unterminated group '('");
    ++pos_;
    return inner;
  }

  Result<RegexNode> ParseAtom(int depth) {
    const char c = Peek();
    switch (c) {
      case '(':
        ++pos_;
        return ParseGroup(depth);
      case '[':
        ++pos_;
        return ParseClass();
      case '.':
        ++pos_;
        return Class(Complement({{'\n', '\n'}}));
      case '*':
      case '+':
      case '?':
        return Error("nothing to repeat before '" + std::string(1, c) + "'");
      case '{':
        if (pos_ + 1 < p_.size() && p_[pos_ + 1] >= '0' && p_[pos_ + 1] <= '9')
          return Error("nothing to repeat before '{'");
        break;
      case '^':
        return Error("unsupported anchor '^' (only at the start)");
      case '$':
        return Error("unsupported anchor '$' (only at the end)");
      case '\\': {
        ++pos_;
        Ranges escaped;
        ASSIGN_OR_RETURN(uint32_t cp, ParseEscape(&escaped));
        return Class(escaped.empty() ? Ranges{{cp, cp}} : escaped);
      }
      default:
        break;
    }
    ASSIGN_OR_RETURN(uint32_t cp, ParseLiteral());
    return Class({{cp, cp}});
  }

  std::string_view p_;
  RegexOptions options_;
  size_t pos_ = 0;
};

}  // namespace

Result<RegexNode> ParseRegex(std::string_view pattern, const RegexOptions& options) {
  return Parser(pattern, options).Parse();
}

std::string EscapeRegex(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos)
      out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace pd::constrain
