// Jinja's parser: tokens to a syntax tree. Unknown statements, filters and tests are load-time
// errors naming the construct and its line:column.
#pragma once

#include <vector>

#include "common/status.h"
#include "template/ast.h"
#include "template/lexer.h"

namespace pd::template_engine {

Result<Body> Parse(std::vector<Token> tokens);

}  // namespace pd::template_engine
