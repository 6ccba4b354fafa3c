// Evaluates a parsed template over a context: one Renderer per render call.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "template/ast.h"
#include "template/template.h"
#include "template/value.h"

namespace pd::template_engine {

class Renderer {
 public:
  Renderer(const TemplateOptions& options, const Value& context);
  Result<std::string> Run(const Body& body);

 private:
  enum class Signal { kNone, kBreak, kContinue };

  Status RenderBody(const Body& body, std::string* out, Signal* signal);
  Status RenderNode(const Node& node, std::string* out, Signal* signal);
  Status RenderIf(const Node& node, std::string* out, Signal* signal);
  Status RenderFor(const Node& node, std::string* out, Signal* signal);
  Status RenderSet(const Node& node);
  Status RenderCallBlock(const Node& node, std::string* out);

  Result<Value> Eval(const Expr& e);
  Result<Value> EvalFilter(const Expr& e, const Value* input);
  Result<Value> EvalCall(const Expr& e);
  Result<Value> EvalBinary(const Expr& e);
  Result<Value> EvalGetAttr(const Expr& e);
  Result<Value> EvalGetItem(const Expr& e);
  Result<Value> EvalSlice(const Expr& e);
  Result<CallArgs> EvalArgs(const Expr& e, size_t first);

  Value Lookup(const std::string& name) const;
  void Assign(const std::string& name, Value v);
  Value MakeMacro(const Node& node, std::vector<Object> frames);
  Result<Value> CallMacro(const Node& node, const std::vector<Object>& frames, const CallArgs& args,
                          const Value& caller);
  void AddGlobals();

  const TemplateOptions& options_;
  std::vector<Object> frames_;  // frames_[0]: globals and the context; the last is innermost
  std::vector<const Object*> namespaces_;  // dicts that `set ns.attr = ...` may change
  int macro_depth_ = 0;
};

// Prefixes a status with the template position it arose at (unless it already has one).
Status AtPos(const SourcePos& pos, const Status& status);

}  // namespace pd::template_engine
