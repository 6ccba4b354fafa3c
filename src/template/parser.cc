#include "template/parser.h"

#include <cstdlib>
#include <initializer_list>
#include <string_view>

#include "template/builtins.h"

namespace pd::template_engine {
namespace {

using TK = Token::Kind;

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
                   std::string* end_tag) {
    const SourcePos start = open_blocks_.empty() ? Cur().pos : open_blocks_.back();
    while (true) {
      const Token& t = Cur();
      if (t.kind == TK::kEnd) {
        if (end_tags.size() == 0) return OkStatus();
        return Error(start, "missing '{% " + std::string(*end_tags.begin()) +
                                " %}' for the block that starts here");
      }
      if (t.kind == TK::kText) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kText;
        node->pos = t.pos;
        node->text = t.text;
        body->push_back(std::move(node));
        Advance();
        continue;
      }
      if (t.kind == TK::kVarBegin) {
        Advance();
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kOutput;
        node->pos = t.pos;
        ASSIGN_OR_RETURN(node->expr, ParseTuple());
        if (Cur().kind != TK::kVarEnd) return Expected("'}}'");
        Advance();
        body->push_back(std::move(node));
        continue;
      }
      if (t.kind != TK::kBlockBegin) return Expected("template text or a tag");
      Advance();
      if (Cur().kind != TK::kName) return Expected("a statement name");
      const std::string name = Cur().text;
      for (std::string_view end : end_tags) {
        if (name == end) {
          *end_tag = name;
          Advance();
          return OkStatus();
        }
      }
      open_blocks_.push_back(Cur().pos);
      Result<NodePtr> node = ParseStatement();
      open_blocks_.pop_back();
      if (!node.ok()) return node.status();
      body->push_back(std::move(node).value());
    }
  }

  Result<NodePtr> ParseStatement() {
    const Token t = Cur();
    Advance();
    auto node = std::make_unique<Node>();
    node->pos = t.pos;
    const std::string& s = t.text;
    if (s == "if") return ParseIf(std::move(node));
    if (s == "for") return ParseFor(std::move(node));
    if (s == "set") return ParseSet(std::move(node));
    if (s == "macro") return ParseMacro(std::move(node));
    if (s == "call") return ParseCallBlock(std::move(node));
    if (s == "filter") return ParseFilterBlock(std::move(node));
    if (s == "break" || s == "continue") {
      node->kind = s == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      if (loop_depth_ == 0) return Error(t.pos, "'" + s + "' outside of a for loop");
      RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (s == "generation") {
      node->kind = Node::Kind::kGeneration;
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseEnd({"endgeneration"}, &node->body));
      return node;
    }
    return Error(t.pos, "unsupported statement '" + s + "'");
  }

  // Parses a body up to the end tag (one of end_tags) and its '%}'.
  Status ParseEnd(std::initializer_list<std::string_view> end_tags, Body* body) {
    std::string end_tag;
    RETURN_IF_ERROR(ParseBody(end_tags, body, &end_tag));
    return ExpectBlockEnd();
  }

  Result<NodePtr> ParseIf(NodePtr node) {
    node->kind = Node::Kind::kIf;
    while (true) {
      ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple());
      RETURN_IF_ERROR(ExpectBlockEnd());
      Body body;
      std::string end_tag;
      RETURN_IF_ERROR(ParseBody({"endif", "elif", "else"}, &body, &end_tag));
      node->branches.emplace_back(std::move(cond), std::move(body));
      if (end_tag == "elif") continue;
      RETURN_IF_ERROR(ExpectBlockEnd());
      if (end_tag == "else") RETURN_IF_ERROR(ParseEnd({"endif"}, &node->else_body));
      return node;
    }
  }

  Status ParseTargets(std::vector<std::string>* targets) {
    do {
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      targets->push_back(std::move(name));
    } while (AcceptOp(","));
    return OkStatus();
  }

  Result<NodePtr> ParseFor(NodePtr node) {
    node->kind = Node::Kind::kFor;
    RETURN_IF_ERROR(ParseTargets(&node->targets));
    if (!AcceptName("in")) return Expected("'in'");
    ASSIGN_OR_RETURN(node->expr, ParseTuple(/*with_condexpr=*/false));
    if (AcceptName("if")) {
      ASSIGN_OR_RETURN(node->condition, ParseExpression());
    }
    if (AcceptName("recursive")) return Error(node->pos, "unsupported 'recursive' for loop");
    RETURN_IF_ERROR(ExpectBlockEnd());
    ++loop_depth_;
    std::string end_tag;
    Status st = ParseBody({"endfor", "else"}, &node->body, &end_tag);
    --loop_depth_;
    RETURN_IF_ERROR(st);
    RETURN_IF_ERROR(ExpectBlockEnd());
    if (end_tag == "else") RETURN_IF_ERROR(ParseEnd({"endfor"}, &node->else_body));
    return node;
  }

  Result<NodePtr> ParseSet(NodePtr node) {
    node->kind = Node::Kind::kSet;
    ASSIGN_OR_RETURN(std::string first, ExpectName());
    node->targets.push_back(first);
    if (AcceptOp(".")) {
      ASSIGN_OR_RETURN(node->attr, ExpectName());
    } else {
      while (AcceptOp(",")) {
        ASSIGN_OR_RETURN(std::string name, ExpectName());
        node->targets.push_back(std::move(name));
      }
    }
    if (AcceptOp("=")) {
      ASSIGN_OR_RETURN(node->expr, ParseTuple());
      RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (node->targets.size() != 1 || !node->attr.empty()) return Expected("'='");
    node->kind = Node::Kind::kSetBlock;
    if (AcceptOp("|")) {
      ASSIGN_OR_RETURN(node->expr, ParseFilterChain(nullptr));
    }
    RETURN_IF_ERROR(ExpectBlockEnd());
    RETURN_IF_ERROR(ParseEnd({"endset"}, &node->body));
    return node;
  }

  Status ParseParams(std::vector<MacroParam>* params) {
    RETURN_IF_ERROR(ExpectOp("("));
    while (!AcceptOp(")")) {
      if (!params->empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (AcceptOp(")")) break;
      MacroParam param;
      ASSIGN_OR_RETURN(param.name, ExpectName());
      if (AcceptOp("=")) {
        ASSIGN_OR_RETURN(param.default_value, ParseExpression());
      }
      params->push_back(std::move(param));
    }
    return OkStatus();
  }

  Result<NodePtr> ParseMacro(NodePtr node) {
    node->kind = Node::Kind::kMacro;
    ASSIGN_OR_RETURN(node->name, ExpectName());
    RETURN_IF_ERROR(ParseParams(&node->params));
    RETURN_IF_ERROR(ExpectBlockEnd());
    const int saved = loop_depth_;
    loop_depth_ = 0;
    Status st = ParseEnd({"endmacro"}, &node->body);
    loop_depth_ = saved;
    RETURN_IF_ERROR(st);
    return node;
  }

  Result<NodePtr> ParseCallBlock(NodePtr node) {
    node->kind = Node::Kind::kCallBlock;
    if (IsOp("(")) RETURN_IF_ERROR(ParseParams(&node->params));
    ASSIGN_OR_RETURN(node->expr, ParseExpression());
    if (node->expr->kind != Expr::Kind::kCall) return Error(node->pos, "expected a macro call");
    RETURN_IF_ERROR(ExpectBlockEnd());
    RETURN_IF_ERROR(ParseEnd({"endcall"}, &node->body));
    return node;
  }

  Result<NodePtr> ParseFilterBlock(NodePtr node) {
    node->kind = Node::Kind::kFilterBlock;
    ASSIGN_OR_RETURN(node->expr, ParseFilterChain(nullptr));
    RETURN_IF_ERROR(ExpectBlockEnd());
    RETURN_IF_ERROR(ParseEnd({"endfilter"}, &node->body));
    return node;
  }

  // ---- expressions, by Jinja's precedence ----

  ExprPtr Make(Expr::Kind kind, const SourcePos& pos, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    e->name = std::move(name);
    return e;
  }
  ExprPtr MakeBinary(Expr::Kind kind, const SourcePos& pos, std::string op, ExprPtr l, ExprPtr r) {
    ExprPtr e = Make(kind, pos, std::move(op));
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  // An expression, or a tuple of them without parentheses (`a, b`).
  Result<ExprPtr> ParseTuple(bool with_condexpr = true) {
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

  Result<ExprPtr> ParseExpression() {
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

  Result<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const SourcePos pos = Cur().pos;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = MakeBinary(Expr::Kind::kOr, pos, "or", std::move(left), std::move(right));
    }
    return left;
  }

  Result<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const SourcePos pos = Cur().pos;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = MakeBinary(Expr::Kind::kAnd, pos, "and", std::move(left), std::move(right));
    }
    return left;
  }

  Result<ExprPtr> ParseNot() {
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

  Result<ExprPtr> ParseCompare() {
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

  Result<ExprPtr> ParseMath1() {
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

  Result<ExprPtr> ParseConcat() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    while (IsOp("~")) {
      const SourcePos pos = Cur().pos;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      left = MakeBinary(Expr::Kind::kBinary, pos, "~", std::move(left), std::move(right));
    }
    return left;
  }

  Result<ExprPtr> ParseMath2() {
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

  Result<ExprPtr> ParsePow() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      const SourcePos pos = Cur().pos;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      left = MakeBinary(Expr::Kind::kBinary, pos, "**", std::move(left), std::move(right));
    }
    return left;
  }

  Result<ExprPtr> ParseUnary(bool with_filter) {
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

  Result<ExprPtr> ParsePrimary() {
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

  // Arguments after an already consumed '(' up to ')', appended to call->args / kwargs.
  Status ParseCallArgs(Expr* call) {
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

  Result<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      const SourcePos pos = Cur().pos;
      if (AcceptOp(".")) {
        if (Cur().kind != TK::kName && Cur().kind != TK::kInt) return Expected("an attribute name");
        ExprPtr e = Make(Cur().kind == TK::kName ? Expr::Kind::kGetAttr : Expr::Kind::kGetItem, pos,
                         Cur().text);
        e->args.push_back(std::move(node));
        if (e->kind == Expr::Kind::kGetItem) {
          ExprPtr index = Make(Expr::Kind::kLiteral, pos);
          index->literal =
              Value(static_cast<int64_t>(std::strtoll(Cur().text.c_str(), nullptr, 10)));
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

  Result<ExprPtr> ParseSubscript(ExprPtr target, const SourcePos& pos) {
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

  // `| name(args)` chains; target may be null (filter blocks, set blocks).
  Result<ExprPtr> ParseFilterChain(ExprPtr target) {
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

  Result<ExprPtr> ParseFilterExpr(ExprPtr node) {
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

  Result<ExprPtr> ParseTest(ExprPtr target) {
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
               !IsName("else") && !IsName("or") && !IsName("and") && !IsName("is") &&
               !IsName("if") && !IsName("in") && !IsName("not")) {
      ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      test->args.push_back(std::move(arg));
    }
    if (!negated) return test;
    ExprPtr e = Make(Expr::Kind::kNot, pos);
    e->args.push_back(std::move(test));
    return e;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  std::vector<SourcePos> open_blocks_;  // where each statement being parsed starts
};

}  // namespace

Result<Body> Parse(std::vector<Token> tokens) { return Parser(std::move(tokens)).ParseTemplate(); }

}  // namespace pd::template_engine
