// Jinja's lexer: template text to a token stream, with Jinja's whitespace control (`{%-`, `-%}`,
// `+`) and the trim_blocks / lstrip_blocks options as Jinja applies them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pd::template_engine {

struct SourcePos {
  int line = 1;
  int column = 1;
  std::string ToString() const { return std::to_string(line) + ":" + std::to_string(column); }
};

struct Token {
  enum class Kind {
    kText,        // template data between tags
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // text holds the unescaped value
    kInt,
    kFloat,
    kOperator,  // text holds it: "+", "//", "==", "(", ...
    kEnd,
  };
  Kind kind = Kind::kEnd;
  std::string text;
  SourcePos pos;
};

struct LexerOptions {
  bool trim_blocks = false;    // drop the first newline after a block or comment tag
  bool lstrip_blocks = false;  // strip spaces and tabs before a block or comment tag on its line
};

// Tokens of `source`, ending with kEnd. A malformed template (an unclosed tag, comment or string,
// a character no expression can hold) is an InvalidArgument naming line:column.
Result<std::vector<Token>> Tokenize(std::string_view source, const LexerOptions& options);

}  // namespace pd::template_engine
