#include "template/parser.h"

#include <cstdlib>
#include <initializer_list>
#include <string_view>

#include "template/builtins.h"
#include "template/parser_impl.h"

namespace pd::template_engine {
namespace internal {

Status Parser::ParseBody(std::initializer_list<std::string_view> end_tags, Body* body,
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
    if (open_blocks_.size() >= static_cast<size_t>(kMaxNesting)) {
      return Error(Cur().pos, "blocks nested deeper than " + std::to_string(kMaxNesting));
    }
    open_blocks_.push_back(Cur().pos);
    Result<NodePtr> node = ParseStatement();
    open_blocks_.pop_back();
    if (!node.ok()) return node.status();
    body->push_back(std::move(node).value());
  }
}

Result<NodePtr> Parser::ParseStatement() {
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

Status Parser::ParseEnd(std::initializer_list<std::string_view> end_tags, Body* body) {
  std::string end_tag;
  RETURN_IF_ERROR(ParseBody(end_tags, body, &end_tag));
  return ExpectBlockEnd();
}

Result<NodePtr> Parser::ParseIf(NodePtr node) {
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

Status Parser::ParseTargets(std::vector<std::string>* targets) {
  do {
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    targets->push_back(std::move(name));
  } while (AcceptOp(","));
  return OkStatus();
}

Result<NodePtr> Parser::ParseFor(NodePtr node) {
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

Result<NodePtr> Parser::ParseSet(NodePtr node) {
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

Status Parser::ParseParams(std::vector<MacroParam>* params) {
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

Result<NodePtr> Parser::ParseMacro(NodePtr node) {
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

Result<NodePtr> Parser::ParseCallBlock(NodePtr node) {
  node->kind = Node::Kind::kCallBlock;
  if (IsOp("(")) RETURN_IF_ERROR(ParseParams(&node->params));
  ASSIGN_OR_RETURN(node->expr, ParseExpression());
  if (node->expr->kind != Expr::Kind::kCall) return Error(node->pos, "expected a macro call");
  RETURN_IF_ERROR(ExpectBlockEnd());
  RETURN_IF_ERROR(ParseEnd({"endcall"}, &node->body));
  return node;
}

Result<NodePtr> Parser::ParseFilterBlock(NodePtr node) {
  node->kind = Node::Kind::kFilterBlock;
  ASSIGN_OR_RETURN(node->expr, ParseFilterChain(nullptr));
  RETURN_IF_ERROR(ExpectBlockEnd());
  RETURN_IF_ERROR(ParseEnd({"endfilter"}, &node->body));
  return node;
}

}  // namespace internal

Result<Body> Parse(std::vector<Token> tokens) {
  return internal::Parser(std::move(tokens)).ParseTemplate();
}

}  // namespace pd::template_engine
