// The parser's class, shared by parser.cc (statements) and parser_expr.cc (expressions).
// Private to src/template.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "template/ast.h"
#include "template/lexer.h"

namespace pd::template_engine::internal {

using TK = Token::Kind;

// Deeper nesting is a load-time error, not a stack overflow.
constexpr int kMaxNesting = 256;

// Counts one level of expression nesting for as long as it lives.
class NestingGuard {
 public:
  explicit NestingGuard(int* depth) : depth_(depth) { ++*depth_; }
  ~NestingGuard() { --*depth_; }
  bool too_deep() const { return *depth_ > kMaxNesting; }

 private:
  int* depth_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Result<Body> ParseTemplate() {
    Body body;
    std::string end_tag;
    RETURN_IF_ERROR(ParseBody({}, &body, &end_tag));
    return body;
  }

 private:
  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void Advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const { return Cur().kind == TK::kOperator && Cur().text == op; }
  bool IsName(std::string_view name) const { return Cur().kind == TK::kName && Cur().text == name; }
  bool AcceptOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Advance();
    return true;
  }
  bool AcceptName(std::string_view name) {
    if (!IsName(name)) return false;
    Advance();
    return true;
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case TK::kText:
        return "template text";
      case TK::kVarBegin:
        return "'{{'";
      case TK::kVarEnd:
        return "'}}'";
      case TK::kBlockBegin:
        return "'{%'";
      case TK::kBlockEnd:
        return "'%}'";
      case TK::kString:
        return "string literal";
      case TK::kEnd:
        return "end of template";
      default:
        return "'" + t.text + "'";
    }
  }
  Status Error(const SourcePos& pos, const std::string& what) const {
    return InvalidArgument("template " + pos.ToString() + ": " + what);
  }
  Status Expected(const std::string& what) const {
    return Error(Cur().pos, "expected " + what + ", got " + Describe(Cur()));
  }
  Status ExpectOp(std::string_view op) {
    if (!AcceptOp(op)) return Expected("'" + std::string(op) + "'");
    return OkStatus();
  }
  Result<std::string> ExpectName() {
    if (Cur().kind != TK::kName) return Expected("a name");
    std::string name = Cur().text;
    Advance();
    return name;
  }
  Status ExpectBlockEnd() {
    if (Cur().kind != TK::kBlockEnd) return Expected("'%}'");
    Advance();
    return OkStatus();
  }

  // Parses nodes until `{% <one of end_tags> ...`; leaves the position after the end tag's name
  // and stores it in *end_tag. With no end tags, parses to the end of the template.
  Status ParseBody(std::initializer_list<std::string_view> end_tags, Body* body,
                   std::string* end_tag);
  Result<NodePtr> ParseStatement();
  // Parses a body up to the end tag (one of end_tags) and its '%}'.
  Status ParseEnd(std::initializer_list<std::string_view> end_tags, Body* body);
  Result<NodePtr> ParseIf(NodePtr node);
  Status ParseTargets(std::vector<std::string>* targets);
  Result<NodePtr> ParseFor(NodePtr node);
  Result<NodePtr> ParseSet(NodePtr node);
  Status ParseParams(std::vector<MacroParam>* params);
  Result<NodePtr> ParseMacro(NodePtr node);
  Result<NodePtr> ParseCallBlock(NodePtr node);
  Result<NodePtr> ParseFilterBlock(NodePtr node);
  ExprPtr Make(Expr::Kind kind, const SourcePos& pos, std::string name = {});
  ExprPtr MakeBinary(Expr::Kind kind, const SourcePos& pos, std::string op, ExprPtr l, ExprPtr r);
  // An expression, or a tuple of them without parentheses (`a, b`).
  Result<ExprPtr> ParseTuple(bool with_condexpr = true);
  Result<ExprPtr> ParseExpression();
  Result<ExprPtr> ParseOr();
  Result<ExprPtr> ParseAnd();
  Result<ExprPtr> ParseNot();
  Result<ExprPtr> ParseCompare();
  Result<ExprPtr> ParseMath1();
  Result<ExprPtr> ParseConcat();
  Result<ExprPtr> ParseMath2();
  Result<ExprPtr> ParsePow();
  Result<ExprPtr> ParseUnary(bool with_filter);
  Result<ExprPtr> ParsePrimary();
  // Arguments after an already consumed '(' up to ')', appended to call->args / kwargs.
  Status ParseCallArgs(Expr* call);
  Result<ExprPtr> ParsePostfix(ExprPtr node);
  Result<ExprPtr> ParseSubscript(ExprPtr target, const SourcePos& pos);
  // `| name(args)` chains; target may be null (filter blocks, set blocks).
  Result<ExprPtr> ParseFilterChain(ExprPtr target);
  Result<ExprPtr> ParseFilterExpr(ExprPtr node);
  Result<ExprPtr> ParseTest(ExprPtr target);

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  std::vector<SourcePos> open_blocks_;
  int expression_depth_ =
      0;  // nesting of the expression being parsed  // where each statement being parsed starts
};

}  // namespace pd::template_engine::internal
