#include "template/renderer.h"

#include <cmath>
#include <ctime>

#include "template/builtins.h"
#include "template/text_util.h"

namespace pd::template_engine {

Status AtPos(const SourcePos& pos, const Status& status) {
  if (status.ok() || status.message().starts_with("template ")) return status;
  return Status(status.code(), "template " + pos.ToString() + ": " + status.message());
}

#define RETURN_AT(pos, expr)                             \
  do {                                                   \
    ::pd::Status pd_s_ = ::pd::internal::AsStatus(expr); \
    if (!pd_s_.ok()) return AtPos(pos, pd_s_);           \
  } while (0)

Renderer::Renderer(const TemplateOptions& options, const Value& context) : options_(options) {
  frames_.emplace_back();
  AddGlobals();
  for (const auto& [k, v] : context.as_object()) Assign(k, v);
}

Result<std::string> Renderer::Run(const Body& body) {
  std::string out;
  Signal signal = Signal::kNone;
  RETURN_IF_ERROR(RenderBody(body, &out, &signal));
  return out;
}

void Renderer::AddGlobals() {
  Assign("raise_exception", Value::FromFunction([](const CallArgs& args) -> Result<Value> {
           const std::string message =
               args.positional.empty() ? std::string() : args.positional[0].Str();
           return InvalidArgument("raise_exception: " + message);
         }));
  Assign("strftime_now", Value::FromFunction([](const CallArgs& args) -> Result<Value> {
           if (args.positional.empty() || !args.positional[0].is_string()) {
             return InvalidArgument("strftime_now: expects a format string");
           }
           const std::time_t now = std::time(nullptr);
           std::tm tm{};
           localtime_r(&now, &tm);
           char buf[256];
           const size_t n =
               std::strftime(buf, sizeof(buf), args.positional[0].as_string().c_str(), &tm);
           return Value(std::string(buf, n));
         }));
  Assign("namespace", Value::FromFunction([this](const CallArgs& args) -> Result<Value> {
           Value ns{Object()};
           for (const Value& p : args.positional) {
             if (!p.is_object())
               return InvalidArgument("namespace: positional arguments must be dicts");
             for (const auto& [k, v] : p.as_object()) ns.Set(k, v);
           }
           for (const auto& [k, v] : args.keyword) ns.Set(k, v);
           namespaces_.push_back(&ns.as_object());
           return ns;
         }));
  Assign("dict", Value::FromFunction([](const CallArgs& args) -> Result<Value> {
           Value d{Object()};
           for (const Value& p : args.positional) {
             if (!p.is_object()) return InvalidArgument("dict: positional arguments must be dicts");
             for (const auto& [k, v] : p.as_object()) d.Set(k, v);
           }
           for (const auto& [k, v] : args.keyword) d.Set(k, v);
           return d;
         }));
  Assign("range", Value::FromFunction([](const CallArgs& args) -> Result<Value> {
           int64_t bounds[3] = {0, 0, 1};
           const size_t n = args.positional.size();
           if (n < 1 || n > 3) return InvalidArgument("range: expects 1 to 3 integers");
           for (size_t i = 0; i < n; ++i) {
             if (!args.positional[i].is_int()) return InvalidArgument("range: expects integers");
           }
           if (n == 1) {
             bounds[1] = args.positional[0].as_int();
           } else {
             bounds[0] = args.positional[0].as_int();
             bounds[1] = args.positional[1].as_int();
             if (n == 3) bounds[2] = args.positional[2].as_int();
           }
           if (bounds[2] == 0) return InvalidArgument("range: step must not be zero");
           Array out;
           for (int64_t i = bounds[0]; bounds[2] > 0 ? i < bounds[1] : i > bounds[1];
                i += bounds[2]) {
             if (out.size() >= 1000000) return InvalidArgument("range: more than 1000000 items");
             out.emplace_back(i);
           }
           return Value(std::move(out));
         }));
}

Value Renderer::Lookup(const std::string& name) const {
  for (auto frame = frames_.rbegin(); frame != frames_.rend(); ++frame) {
    for (const auto& [k, v] : *frame) {
      if (k == name) return v;
    }
  }
  return Value::Undefined(name);
}

void Renderer::Assign(const std::string& name, Value v) {
  Object& frame = frames_.back();
  for (auto& [k, old] : frame) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  frame.emplace_back(name, std::move(v));
}

Status Renderer::RenderBody(const Body& body, std::string* out, Signal* signal) {
  for (const NodePtr& node : body) {
    RETURN_IF_ERROR(RenderNode(*node, out, signal));
    if (*signal != Signal::kNone) return OkStatus();
  }
  return OkStatus();
}

Status Renderer::RenderNode(const Node& node, std::string* out, Signal* signal) {
  switch (node.kind) {
    case Node::Kind::kText:
      *out += node.text;
      return OkStatus();
    case Node::Kind::kOutput: {
      ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
      *out += v.Str();
      return OkStatus();
    }
    case Node::Kind::kIf:
      return RenderIf(node, out, signal);
    case Node::Kind::kFor:
      return RenderFor(node, out, signal);
    case Node::Kind::kSet:
      return RenderSet(node);
    case Node::Kind::kSetBlock: {
      std::string captured;
      Signal inner = Signal::kNone;
      RETURN_IF_ERROR(RenderBody(node.body, &captured, &inner));
      Value v(std::move(captured));
      if (node.expr) {
        ASSIGN_OR_RETURN(v, EvalFilter(*node.expr, &v));
      }
      Assign(node.targets[0], std::move(v));
      return OkStatus();
    }
    case Node::Kind::kMacro:
      Assign(node.name, MakeMacro(node, {}));
      return OkStatus();
    case Node::Kind::kCallBlock:
      return RenderCallBlock(node, out);
    case Node::Kind::kFilterBlock: {
      std::string captured;
      Signal inner = Signal::kNone;
      RETURN_IF_ERROR(RenderBody(node.body, &captured, &inner));
      const Value input(std::move(captured));
      ASSIGN_OR_RETURN(Value v, EvalFilter(*node.expr, &input));
      *out += v.Str();
      return OkStatus();
    }
    case Node::Kind::kBreak:
      *signal = Signal::kBreak;
      return OkStatus();
    case Node::Kind::kContinue:
      *signal = Signal::kContinue;
      return OkStatus();
    case Node::Kind::kGeneration:
      return RenderBody(node.body, out, signal);
  }
  return OkStatus();
}

Status Renderer::RenderIf(const Node& node, std::string* out, Signal* signal) {
  for (const auto& [cond, body] : node.branches) {
    ASSIGN_OR_RETURN(Value v, Eval(*cond));
    if (v.Truthy()) return RenderBody(body, out, signal);
  }
  return RenderBody(node.else_body, out, signal);
}

Status Renderer::RenderFor(const Node& node, std::string* out, Signal* signal) {
  ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr));
  Result<Array> listed = Iterate(iterable);
  RETURN_AT(node.expr->pos, listed);
  Array items = std::move(listed).value();
  frames_.emplace_back();
  auto bind = [&](const Value& item) -> Status {
    if (node.targets.size() == 1) {
      Assign(node.targets[0], item);
      return OkStatus();
    }
    if (!item.is_array() || item.as_array().size() != node.targets.size()) {
      return AtPos(node.pos, InvalidArgument("cannot unpack " + item.TypeName() + " into " +
                                             std::to_string(node.targets.size()) + " names"));
    }
    for (size_t k = 0; k < node.targets.size(); ++k) Assign(node.targets[k], item.as_array()[k]);
    return OkStatus();
  };
  Status status;
  if (node.condition) {  // `for x in xs if cond` filters before the loop counts
    Array kept;
    for (const Value& item : items) {
      status = bind(item);
      if (!status.ok()) break;
      Result<Value> keep = Eval(*node.condition);
      if (!keep.ok()) {
        status = keep.status();
        break;
      }
      if (keep->Truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; status.ok() && i < n; ++i) {
    Value loop{Object{{"index", Value(i + 1)},
                      {"index0", Value(i)},
                      {"revindex", Value(n - i)},
                      {"revindex0", Value(n - i - 1)},
                      {"first", Value(i == 0)},
                      {"last", Value(i == n - 1)},
                      {"length", Value(n)},
                      {"previtem", i > 0 ? items[i - 1] : Value::Undefined("previtem")},
                      {"nextitem", i + 1 < n ? items[i + 1] : Value::Undefined("nextitem")}}};
    loop.Set("cycle", Value::FromFunction([i](const CallArgs& args) -> Result<Value> {
               if (args.positional.empty()) return InvalidArgument("loop.cycle: no items");
               return args.positional[static_cast<size_t>(i) % args.positional.size()];
             }));
    Assign("loop", std::move(loop));
    status = bind(items[i]);
    if (!status.ok()) break;
    Signal inner = Signal::kNone;
    status = RenderBody(node.body, out, &inner);
    if (inner == Signal::kBreak) break;
  }
  frames_.pop_back();
  RETURN_IF_ERROR(status);
  if (n == 0) return RenderBody(node.else_body, out, signal);
  return OkStatus();
}

Status Renderer::RenderSet(const Node& node) {
  ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
  if (!node.attr.empty()) {
    Value ns = Lookup(node.targets[0]);
    if (!ns.is_object() ||
        std::find(namespaces_.begin(), namespaces_.end(), &ns.as_object()) == namespaces_.end()) {
      return AtPos(node.pos, InvalidArgument("cannot assign attribute on non-namespace object '" +
                                             node.targets[0] + "'"));
    }
    ns.Set(node.attr, std::move(v));
    return OkStatus();
  }
  if (node.targets.size() == 1) {
    Assign(node.targets[0], std::move(v));
    return OkStatus();
  }
  if (!v.is_array() || v.as_array().size() != node.targets.size()) {
    return AtPos(node.pos, InvalidArgument("cannot unpack " + v.TypeName() + " into " +
                                           std::to_string(node.targets.size()) + " names"));
  }
  for (size_t k = 0; k < node.targets.size(); ++k) Assign(node.targets[k], v.as_array()[k]);
  return OkStatus();
}

Value Renderer::MakeMacro(const Node& node, std::vector<Object> frames) {
  return Value::FromFunction([this, &node, frames = std::move(frames)](const CallArgs& args) {
    return CallMacro(node, frames, args, Value::Undefined("caller"));
  });
}

Result<Value> Renderer::CallMacro(const Node& node, const std::vector<Object>& frames,
                                  const CallArgs& args, const Value& caller) {
  if (macro_depth_ >= options_.max_macro_depth) {
    return AtPos(node.pos, InvalidArgument("macro calls nested more than " +
                                           std::to_string(options_.max_macro_depth) + " deep"));
  }
  if (args.positional.size() > node.params.size()) {
    return AtPos(node.pos, InvalidArgument("macro '" + node.name + "' takes " +
                                           std::to_string(node.params.size()) + " arguments, got " +
                                           std::to_string(args.positional.size())));
  }
  // The macro sees the template's top level (frames_[0]) plus its own arguments; a caller's
  // body sees the frames captured where the call block stood.
  std::vector<Object> saved = std::move(frames_);
  frames_ = frames.empty() ? std::vector<Object>{saved[0]} : frames;
  frames_.emplace_back();
  Status status;
  for (size_t k = 0; k < node.params.size() && status.ok(); ++k) {
    const MacroParam& p = node.params[k];
    Value v;
    bool found = k < args.positional.size();
    if (found) v = args.positional[k];
    for (const auto& [key, value] : args.keyword) {
      if (key == p.name) {
        v = value;
        found = true;
      }
    }
    if (!found && p.default_value) {
      Result<Value> d = Eval(*p.default_value);
      if (!d.ok())
        status = d.status();
      else
        v = *d;
    }
    if (!found && !p.default_value) v = Value::Undefined(p.name);
    Assign(p.name, std::move(v));
  }
  for (const auto& [key, value] : args.keyword) {
    if (key == "caller") Assign("caller", value);
  }
  if (!caller.is_undefined()) Assign("caller", caller);
  std::string out;
  ++macro_depth_;
  Signal signal = Signal::kNone;
  if (status.ok()) status = RenderBody(node.body, &out, &signal);
  --macro_depth_;
  // Top-level assignments made inside the macro stay there; frames_[0] of the template is kept.
  if (frames.empty()) saved[0] = std::move(frames_[0]);
  frames_ = std::move(saved);
  RETURN_IF_ERROR(status);
  return Value(std::move(out));
}

Status Renderer::RenderCallBlock(const Node& node, std::string* out) {
  // caller(...) renders this block's body with the call block's params, in the scope here.
  const std::vector<Object> scope = frames_;
  Value caller = Value::FromFunction([this, &node, scope](const CallArgs& args) {
    return CallMacro(node, scope, args, Value::Undefined("caller"));
  });
  const Expr& call = *node.expr;
  ASSIGN_OR_RETURN(Value callee, Eval(*call.args[0]));
  ASSIGN_OR_RETURN(CallArgs args, EvalArgs(call, 1));
  args.keyword.emplace_back("caller", caller);
  if (!callee.is_function()) {
    return AtPos(call.pos, InvalidArgument("'" + callee.TypeName() + "' object is not callable"));
  }
  Result<Value> v = callee.as_function()(args);
  RETURN_AT(call.pos, v);
  *out += v->Str();
  return OkStatus();
}

}  // namespace pd::template_engine
