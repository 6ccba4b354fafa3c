#include "template/lexer.h"

#include <algorithm>
#include <cstring>

#include "template/text_util.h"

namespace pd::template_engine {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  Lexer(std::string_view src, const LexerOptions& options) : src_(src), options_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t at = FindTagStart(pos);
      std::string_view text = src_.substr(pos, at - pos);
      if (at == src_.size()) {
        Emit(Token::Kind::kText, std::string(text), pos);
        break;
      }
      const char kind = src_[at + 1];  // '{', '%' or '#'
      const char marker = at + 2 < src_.size() ? src_[at + 2] : '\0';
      text = StripBefore(text, kind, marker, line_starting);
      if (!text.empty()) Emit(Token::Kind::kText, std::string(text), pos);
      size_t p = at + 2 + ((marker == '-' || marker == '+') ? 1 : 0);
      if (kind == '#') {
        ASSIGN_OR_RETURN(p, SkipComment(at, p));
      } else {
        Emit(kind == '{' ? Token::Kind::kVarBegin : Token::Kind::kBlockBegin, "", at);
        ASSIGN_OR_RETURN(p, LexTag(at, p, kind == '{' ? '}' : '%'));
      }
      pos = p;
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    Emit(Token::Kind::kEnd, "", src_.size());
    return std::move(tokens_);
  }

 private:
  SourcePos PosOf(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }
  void Emit(Token::Kind kind, std::string text, size_t offset) {
    tokens_.push_back({kind, std::move(text), PosOf(offset)});
  }
  Status Error(size_t offset, const std::string& what) const {
    return InvalidArgument("template " + PosOf(offset).ToString() + ": " + what);
  }

  size_t FindTagStart(size_t pos) const {
    while (true) {
      const size_t at = src_.find('{', pos);
      if (at == std::string_view::npos || at + 1 >= src_.size()) return src_.size();
      const char c = src_[at + 1];
      if (c == '{' || c == '%' || c == '#') return at;
      pos = at + 1;
    }
  }

  std::string_view StripBefore(std::string_view text, char kind, char marker,
                               bool line_starting) const {
    if (marker == '-') {
      size_t end = text.size();
      while (end > 0 && IsSpace(text[end - 1])) --end;
      return text.substr(0, end);
    }
    if (marker == '+' || !options_.lstrip_blocks || kind == '{') return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return text;
    if (l_pos == text.size()) return text;
    for (size_t i = l_pos; i < text.size(); ++i) {
      if (!IsSpace(text[i])) return text;
    }
    return text.substr(0, l_pos);
  }

  // After a tag's closing delimiter at `end` (one past it): `-` strips all whitespace, else
  // trim_blocks drops one newline after block and comment tags.
  size_t AfterTag(size_t end, char strip, bool is_block) const {
    if (strip == '-') {
      while (end < src_.size() && IsSpace(src_[end])) ++end;
    } else if (is_block && strip != '+' && options_.trim_blocks && end < src_.size() &&
               src_[end] == '\n') {
      ++end;
    }
    return end;
  }

  Result<size_t> SkipComment(size_t at, size_t p) const {
    const size_t close = src_.find("#}", p);
    if (close == std::string_view::npos) return Error(at, "unclosed comment '{#'");
    const char strip =
        close > p && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : '\0';
    return AfterTag(close + 2, strip, /*is_block=*/true);
  }

  Result<size_t> LexTag(size_t at, size_t p, char close) {
    while (true) {
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      if (p >= src_.size()) {
        return Error(at, std::string("unclosed tag '") + (close == '}' ? "{{" : "{%") + "'");
      }
      const char c = src_[p];
      if ((c == '-' || c == '+') && p + 2 < src_.size() + 0 && src_[p + 1] == close &&
          src_[p + 2] == '}') {
        Emit(close == '}' ? Token::Kind::kVarEnd : Token::Kind::kBlockEnd, "", p);
        return AfterTag(p + 3, c, close == '%');
      }
      if (c == close && p + 1 < src_.size() && src_[p + 1] == '}') {
        Emit(close == '}' ? Token::Kind::kVarEnd : Token::Kind::kBlockEnd, "", p);
        return AfterTag(p + 2, '\0', close == '%');
      }
      ASSIGN_OR_RETURN(p, LexExpressionToken(p));
    }
  }

  Result<size_t> LexExpressionToken(size_t p) {
    const char c = src_[p];
    if (IsNameStart(c)) {
      size_t e = p;
      while (e < src_.size() && (IsNameStart(src_[e]) || IsDigit(src_[e]))) ++e;
      Emit(Token::Kind::kName, std::string(src_.substr(p, e - p)), p);
      return e;
    }
    if (IsDigit(c)) return LexNumber(p);
    if (c == '\'' || c == '"') return LexString(p);
    static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                       "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                       "]",  "{",  "}",  ",",  ".",  ":",  "|"};
    for (const char* op : kOps) {
      const size_t n = std::strlen(op);
      if (src_.substr(p, n) == op) {
        Emit(Token::Kind::kOperator, op, p);
        return p + n;
      }
    }
    return Error(p, std::string("unexpected character '") + c + "'");
  }

  Result<size_t> LexNumber(size_t p) {
    size_t e = p;
    while (e < src_.size() && (IsDigit(src_[e]) || src_[e] == '_')) ++e;
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && IsDigit(src_[e + 1])) {
      is_float = true;
      ++e;
      while (e < src_.size() && (IsDigit(src_[e]) || src_[e] == '_')) ++e;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t f = e + 1;
      if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
      if (f < src_.size() && IsDigit(src_[f])) {
        is_float = true;
        e = f;
        while (e < src_.size() && IsDigit(src_[e])) ++e;
      }
    }
    std::string text;
    for (char ch : src_.substr(p, e - p)) {
      if (ch != '_') text += ch;
    }
    Emit(is_float ? Token::Kind::kFloat : Token::Kind::kInt, text, p);
    return e;
  }

  // Python's string escapes, as Jinja's lexer decodes them (unicode-escape).
  Result<size_t> LexString(size_t p) {
    const char quote = src_[p];
    std::string value;
    size_t i = p + 1;
    while (true) {
      if (i >= src_.size()) return Error(p, "unclosed string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\' || i + 1 >= src_.size()) {
        value += c;
        ++i;
        continue;
      }
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case 'a':
          value += '\a';
          break;
        case '0':
          value += '\0';
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + n > src_.size())
            return Error(i - 2, "truncated \\" + std::string(1, e) + " escape");
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const char h = src_[i + k];
            const int d = IsDigit(h)               ? h - '0'
                          : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                          : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                   : -1;
            if (d < 0) return Error(i - 2, "malformed \\" + std::string(1, e) + " escape");
            cp = cp * 16 + static_cast<uint32_t>(d);
          }
          i += n;
          AppendUtf8(cp, &value);
          break;
        }
        default:
          value += '\\';
          value += e;
      }
    }
    Emit(Token::Kind::kString, std::move(value), p);
    return i + 1;
  }

  std::string_view src_;
  LexerOptions options_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> Tokenize(std::string_view source, const LexerOptions& options) {
  // As Jinja (keep_trailing_newline=False): newlines normalised to \n, one at the end dropped.
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(normalized, options).Run();
}

}  // namespace pd::template_engine
