// The syntax tree a template parses to once, at load.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/lexer.h"
#include "template/value.h"

namespace pd::template_engine {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args
    kTuple,     // args
    kDict,      // kwargs-like pairs in dict_items
    kGetAttr,   // args[0] . name
    kGetItem,   // args[0] [ args[1] ]
    kSlice,     // args[0] [ args[1] : args[2] : args[3] ] (null parts absent)
    kCall,      // args[0] ( args[1..], kwargs )
    kFilter,    // args[0] | name ( args[1..], kwargs ); args[0] null in a filter block
    kTest,      // args[0] is name ( args[1..] )
    kNegate,    // - args[0]
    kPlus,      // + args[0]
    kNot,       // not args[0]
    kBinary,    // args[0] name args[1]: + - * / // % ** ~ == != < <= > >= in "not in"
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCondition  // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  SourcePos pos;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;  // may hold nulls (slice parts, missing else)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::pair<ExprPtr, ExprPtr>> dict_items;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (condition, body) ..., else_body
    kFor,          // targets in expr [if condition] body [else else_body]
    kSet,          // targets (or ns_name.attr) = expr
    kSetBlock,     // set targets[0] [| filter] body endset
    kMacro,        // macro name(params) body
    kCallBlock,    // call(params) expr body
    kFilterBlock,  // filter expr body (expr: a kFilter with a null target, possibly chained)
    kBreak,
    kContinue,
    kGeneration,  // HF's {% generation %} body {% endgeneration %}: renders its body
  };
  Kind kind = Kind::kText;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attr;  // set ns.attr: targets[0] is ns
  std::string name;  // macro name
  std::vector<MacroParam> params;
  Body body;
  Body else_body;
};

}  // namespace pd::template_engine
