// The parser's expressions, by Jinja's precedence: conditional, or, and, not, comparison,
// + -, ~, * / // %, **, unary, postfix (. [] ()), filters and tests.
#include <cstdlib>

#include "template/builtins.h"
#include "template/parser_impl.h"

namespace pd::template_engine::internal {

ExprPtr Parser::Make(Expr::Kind kind, const SourcePos& pos, std::string name) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  e->name = std::move(name);
  return e;
}

ExprPtr Parser::MakeBinary(Expr::Kind kind, const SourcePos& pos, std::string op, ExprPtr l,
                           ExprPtr r) {
  ExprPtr e = Make(kind, pos, std::move(op));
  e->args.push_back(std::move(l));
  e->args.push_back(std::move(r));
  return e;
}

Result<ExprPtr> Parser::ParseTuple(bool with_condexpr) {
  const SourcePos pos = Cur().pos;
  ASSIGN_OR_RETURN(ExprPtr first, with_condexpr ? ParseExpression() : ParseOr());
  if (!IsOp(",")) return first;
  ExprPtr tuple = Make(Expr::Kind::kTuple, pos);
  tuple->args.push_back(std::move(first));
  while (AcceptOp(",")) {
    if (Cur().kind == TK::kBlockEnd || Cur().kind == TK::kVarEnd || IsOp(")")) break;
    ASSIGN_OR_RETURN(ExprPtr item, with_condexpr ? ParseExpression() : ParseOr());
    tuple->args.push_back(std::move(item));
  }
  return tuple;
}

Result<ExprPtr> Parser::ParseExpression() {
  const NestingGuard guard(&expression_depth_);
  if (guard.too_deep()) {
    return Error(Cur().pos, "expression nested deeper than " + std::to_string(kMaxNesting));
  }
  ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
  while (IsName("if")) {
    const SourcePos pos = Cur().pos;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
    ExprPtr otherwise;
    if (AcceptName("else")) {
      ASSIGN_OR_RETURN(otherwise, ParseExpression());
    }
    ExprPtr e = Make(Expr::Kind::kCondition, pos);
    e->args.push_back(std::move(expr));
    e->args.push_back(std::move(cond));
    e->args.push_back(std::move(otherwise));
    expr = std::move(e);
  }
  return expr;
}

Result<ExprPtr> Parser::ParseOr() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
  while (IsName("or")) {
    const SourcePos pos = Cur().pos;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
    left = MakeBinary(Expr::Kind::kOr, pos, "or", std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::ParseAnd() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
  while (IsName("and")) {
    const SourcePos pos = Cur().pos;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
    left = MakeBinary(Expr::Kind::kAnd, pos, "and", std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::ParseNot() {
  const NestingGuard guard(&expression_depth_);
  if (guard.too_deep()) {
    return Error(Cur().pos, "expression nested deeper than " + std::to_string(kMaxNesting));
  }
  if (IsName("not")) {
    const SourcePos pos = Cur().pos;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    ExprPtr e = Make(Expr::Kind::kNot, pos);
    e->args.push_back(std::move(operand));
    return e;
  }
  return ParseCompare();
}

Result<ExprPtr> Parser::ParseCompare() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseMath1());
  while (true) {
    const SourcePos pos = Cur().pos;
    std::string op;
    if (Cur().kind == TK::kOperator &&
        (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
         Cur().text == ">" || Cur().text == ">=")) {
      op = Cur().text;
      Advance();
    } else if (IsName("in")) {
      op = "in";
      Advance();
    } else if (IsName("not") && Peek().kind == TK::kName && Peek().text == "in") {
      op = "not in";
      Advance();
      Advance();
    } else {
      return left;
    }
    ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
    left = MakeBinary(Expr::Kind::kBinary, pos, op, std::move(left), std::move(right));
  }
}

Result<ExprPtr> Parser::ParseMath1() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
  while (IsOp("+") || IsOp("-")) {
    const SourcePos pos = Cur().pos;
    std::string op = Cur().text;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
    left = MakeBinary(Expr::Kind::kBinary, pos, op, std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::ParseConcat() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
  while (IsOp("~")) {
    const SourcePos pos = Cur().pos;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
    left = MakeBinary(Expr::Kind::kBinary, pos, "~", std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::ParseMath2() {
  ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
  while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
    const SourcePos pos = Cur().pos;
    std::string op = Cur().text;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
    left = MakeBinary(Expr::Kind::kBinary, pos, op, std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::ParsePow() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
  while (IsOp("**")) {
    const SourcePos pos = Cur().pos;
    Advance();
    ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
    left = MakeBinary(Expr::Kind::kBinary, pos, "**", std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::ParseUnary(bool with_filter) {
  const NestingGuard guard(&expression_depth_);
  if (guard.too_deep()) {
    return Error(Cur().pos, "expression nested deeper than " + std::to_string(kMaxNesting));
  }
  const SourcePos pos = Cur().pos;
  ExprPtr node;
  if (IsOp("-") || IsOp("+")) {
    const bool negate = IsOp("-");
    Advance();
    ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
    node = Make(negate ? Expr::Kind::kNegate : Expr::Kind::kPlus, pos);
    node->args.push_back(std::move(operand));
  } else {
    ASSIGN_OR_RETURN(node, ParsePrimary());
  }
  ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
  if (with_filter) {
    ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
  }
  return node;
}

Result<ExprPtr> Parser::ParsePrimary() {
  const Token t = Cur();
  switch (t.kind) {
    case TK::kName: {
      Advance();
      ExprPtr e = Make(Expr::Kind::kLiteral, t.pos);
      if (t.text == "true" || t.text == "True") {
        e->literal = Value(true);
      } else if (t.text == "false" || t.text == "False") {
        e->literal = Value(false);
      } else if (t.text == "none" || t.text == "None") {
        e->literal = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      return e;
    }
    case TK::kString: {
      std::string s;
      while (Cur().kind == TK::kString) {  // adjacent literals concatenate
        s += Cur().text;
        Advance();
      }
      ExprPtr e = Make(Expr::Kind::kLiteral, t.pos);
      e->literal = Value(std::move(s));
      return e;
    }
    case TK::kInt:
    case TK::kFloat: {
      Advance();
      ExprPtr e = Make(Expr::Kind::kLiteral, t.pos);
      if (t.kind == TK::kInt) {
        e->literal = Value(static_cast<int64_t>(std::strtoll(t.text.c_str(), nullptr, 10)));
      } else {
        e->literal = Value(std::strtod(t.text.c_str(), nullptr));
      }
      return e;
    }
    default:
      break;
  }
  if (AcceptOp("(")) {
    if (AcceptOp(")")) return Make(Expr::Kind::kTuple, t.pos);
    ASSIGN_OR_RETURN(ExprPtr inner, ParseTuple());
    RETURN_IF_ERROR(ExpectOp(")"));
    return inner;
  }
  if (AcceptOp("[")) {
    ExprPtr list = Make(Expr::Kind::kList, t.pos);
    while (!AcceptOp("]")) {
      if (!list->args.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (AcceptOp("]")) break;
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
      list->args.push_back(std::move(item));
    }
    return list;
  }
  if (AcceptOp("{")) {
    ExprPtr dict = Make(Expr::Kind::kDict, t.pos);
    while (!AcceptOp("}")) {
      if (!dict->dict_items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (AcceptOp("}")) break;
      ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
      RETURN_IF_ERROR(ExpectOp(":"));
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      dict->dict_items.emplace_back(std::move(key), std::move(value));
    }
    return dict;
  }
  return Expected("an expression");
}

Status Parser::ParseCallArgs(Expr* call) {
  bool first = true;
  while (!AcceptOp(")")) {
    if (!first) {
      RETURN_IF_ERROR(ExpectOp(","));
      if (AcceptOp(")")) break;
    }
    first = false;
    if (Cur().kind == TK::kName && Peek().kind == TK::kOperator && Peek().text == "=") {
      std::string key = Cur().text;
      Advance();
      Advance();
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      call->kwargs.emplace_back(std::move(key), std::move(value));
    } else {
      if (!call->kwargs.empty()) {
        return Error(Cur().pos, "positional argument after keyword argument");
      }
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      call->args.push_back(std::move(value));
    }
  }
  return OkStatus();
}

Result<ExprPtr> Parser::ParsePostfix(ExprPtr node) {
  while (true) {
    const SourcePos pos = Cur().pos;
    if (AcceptOp(".")) {
      if (Cur().kind != TK::kName && Cur().kind != TK::kInt) return Expected("an attribute name");
      ExprPtr e = Make(Cur().kind == TK::kName ? Expr::Kind::kGetAttr : Expr::Kind::kGetItem, pos,
                       Cur().text);
      e->args.push_back(std::move(node));
      if (e->kind == Expr::Kind::kGetItem) {
        ExprPtr index = Make(Expr::Kind::kLiteral, pos);
        index->literal = Value(static_cast<int64_t>(std::strtoll(Cur().text.c_str(), nullptr, 10)));
        e->args.push_back(std::move(index));
      }
      Advance();
      node = std::move(e);
    } else if (AcceptOp("[")) {
      ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node), pos));
    } else if (AcceptOp("(")) {
      ExprPtr call = Make(Expr::Kind::kCall, pos);
      call->args.push_back(std::move(node));
      RETURN_IF_ERROR(ParseCallArgs(call.get()));
      node = std::move(call);
    } else {
      return node;
    }
  }
}

Result<ExprPtr> Parser::ParseSubscript(ExprPtr target, const SourcePos& pos) {
  ExprPtr parts[3];
  int colons = 0;
  while (!IsOp("]")) {
    if (AcceptOp(":")) {
      if (++colons > 2) return Expected("']'");
      continue;
    }
    if (parts[colons]) return Expected("':' or ']'");
    ASSIGN_OR_RETURN(parts[colons], ParseExpression());
  }
  Advance();
  if (colons == 0) {
    if (!parts[0]) return Expected("a subscript");
    ExprPtr e = Make(Expr::Kind::kGetItem, pos);
    e->args.push_back(std::move(target));
    e->args.push_back(std::move(parts[0]));
    return e;
  }
  ExprPtr e = Make(Expr::Kind::kSlice, pos);
  e->args.push_back(std::move(target));
  for (ExprPtr& p : parts) e->args.push_back(std::move(p));
  return e;
}

Result<ExprPtr> Parser::ParseFilterChain(ExprPtr target) {
  do {
    const SourcePos pos = Cur().pos;
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (AcceptOp(".")) {
      ASSIGN_OR_RETURN(std::string part, ExpectName());
      name += "." + part;
    }
    if (!IsKnownFilter(name)) return Error(pos, "unknown filter '" + name + "'");
    ExprPtr f = Make(Expr::Kind::kFilter, pos, name);
    f->args.push_back(std::move(target));
    if (AcceptOp("(")) RETURN_IF_ERROR(ParseCallArgs(f.get()));
    target = std::move(f);
  } while (AcceptOp("|"));
  return target;
}

Result<ExprPtr> Parser::ParseFilterExpr(ExprPtr node) {
  while (true) {
    if (AcceptOp("|")) {
      ASSIGN_OR_RETURN(node, ParseFilterChain(std::move(node)));
    } else if (IsName("is")) {
      ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
    } else {
      return node;
    }
  }
}

Result<ExprPtr> Parser::ParseTest(ExprPtr target) {
  const SourcePos pos = Cur().pos;
  Advance();  // is
  const bool negated = AcceptName("not");
  const SourcePos name_pos = Cur().pos;
  ASSIGN_OR_RETURN(std::string name, ExpectName());
  if (!IsKnownTest(name)) return Error(name_pos, "unknown test '" + name + "'");
  ExprPtr test = Make(Expr::Kind::kTest, pos, name);
  test->args.push_back(std::move(target));
  if (AcceptOp("(")) {
    RETURN_IF_ERROR(ParseCallArgs(test.get()));
  } else if ((Cur().kind == TK::kName || Cur().kind == TK::kString || Cur().kind == TK::kInt ||
              Cur().kind == TK::kFloat || IsOp("[") || IsOp("{")) &&
             !IsName("else") && !IsName("or") && !IsName("and") && !IsName("is") && !IsName("if") &&
             !IsName("in") && !IsName("not")) {
    ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
    ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
    test->args.push_back(std::move(arg));
  }
  if (!negated) return test;
  ExprPtr e = Make(Expr::Kind::kNot, pos);
  e->args.push_back(std::move(test));
  return e;
}

}  // namespace pd::template_engine::internal
