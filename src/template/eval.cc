// Renderer's expression evaluation, with Python's operators.
#include <cmath>

#include "template/builtins.h"
#include "template/renderer.h"
#include "template/text_util.h"

namespace pd::template_engine {
namespace {

Status Undefined(const Value& v) {
  return InvalidArgument("'" +
                         (v.undefined_hint().empty() ? std::string("value") : v.undefined_hint()) +
                         "' is undefined");
}

Status Unsupported(const std::string& op, const Value& a, const Value& b) {
  return InvalidArgument("unsupported operand type(s) for " + op + ": '" + a.TypeName() +
                         "' and '" + b.TypeName() + "'");
}

bool IsNumeric(const Value& v) { return v.is_number() || v.is_bool(); }
Value AsNumber(const Value& v) {
  return v.is_bool() ? Value(static_cast<int64_t>(v.as_bool())) : v;
}

Result<Value> Repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    if (seq.as_string().size() * static_cast<size_t>(n) > (64u << 20)) {
      return InvalidArgument("string repetition beyond 64 MiB");
    }
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(std::move(out));
  }
  Array out;
  for (int64_t i = 0; i < n; ++i) {
    out.insert(out.end(), seq.as_array().begin(), seq.as_array().end());
  }
  return Value(std::move(out));
}

Result<Value> Arithmetic(const std::string& op, const Value& a0, const Value& b0) {
  if (a0.is_undefined()) return Undefined(a0);
  if (b0.is_undefined()) return Undefined(b0);
  if (op == "+") {
    if (a0.is_string() && b0.is_string()) return Value(a0.as_string() + b0.as_string());
    if (a0.is_array() && b0.is_array()) {
      Array out = a0.as_array();
      out.insert(out.end(), b0.as_array().begin(), b0.as_array().end());
      return Value(std::move(out));
    }
  }
  if (op == "*") {
    if ((a0.is_string() || a0.is_array()) && (b0.is_int() || b0.is_bool())) {
      return Repeat(a0, AsNumber(b0).as_int());
    }
    if ((b0.is_string() || b0.is_array()) && (a0.is_int() || a0.is_bool())) {
      return Repeat(b0, AsNumber(a0).as_int());
    }
  }
  if (!IsNumeric(a0) || !IsNumeric(b0)) return Unsupported(op, a0, b0);
  const Value a = AsNumber(a0);
  const Value b = AsNumber(b0);
  const bool ints = a.is_int() && b.is_int();
  const double x = a.as_double();
  const double y = b.as_double();
  if (ints && (op == "+" || op == "-" || op == "*" || (op == "**" && b.as_int() >= 0))) {
    // Python's ints do not overflow; beyond 64 bits is an error rather than a wrong number.
    int64_t r = 0;
    bool overflow = false;
    if (op == "+") {
      overflow = __builtin_add_overflow(a.as_int(), b.as_int(), &r);
    } else if (op == "-") {
      overflow = __builtin_sub_overflow(a.as_int(), b.as_int(), &r);
    } else if (op == "*") {
      overflow = __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
    } else if (a.as_int() >= -1 && a.as_int() <= 1) {  // no overflow, however large b is
      r = b.as_int() == 0 ? 1 : (a.as_int() == -1 && b.as_int() % 2 == 0) ? 1 : a.as_int();
    } else {
      r = 1;
      for (int64_t i = 0; i < b.as_int() && !overflow; ++i) {
        overflow = __builtin_mul_overflow(r, a.as_int(), &r);
      }
    }
    if (overflow) return InvalidArgument("integer overflow in '" + op + "' (beyond 64 bits)");
    return Value(r);
  }
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "**") return Value(std::pow(x, y));
  if (y == 0) return InvalidArgument("division by zero");
  if (op == "/") return Value(x / y);
  if (op == "//") {
    if (ints) {
      int64_t q = a.as_int() / b.as_int();
      if ((a.as_int() % b.as_int() != 0) && ((a.as_int() < 0) != (b.as_int() < 0))) --q;
      return Value(q);
    }
    return Value(std::floor(x / y));
  }
  if (op == "%") {
    if (ints) {
      int64_t m = a.as_int() % b.as_int();
      if (m != 0 && ((m < 0) != (b.as_int() < 0))) m += b.as_int();
      return Value(m);
    }
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value(m);
  }
  return InvalidArgument("unknown operator '" + op + "'");
}

// Python slice bounds for a sequence of length n.
void SliceIndices(int64_t n, const Value* start, const Value* stop, int64_t step, int64_t* lo,
                  int64_t* hi) {
  auto clamp = [&](const Value* v, int64_t fallback) {
    if (v == nullptr || v->is_none()) return fallback;
    int64_t i = v->as_int();
    if (i < 0) i += n;
    if (step > 0) return std::min(std::max<int64_t>(i, 0), n);
    return std::min(std::max<int64_t>(i, -1), n - 1);
  };
  *lo = clamp(start, step > 0 ? 0 : n - 1);
  *hi = clamp(stop, step > 0 ? n : -1);
}

}  // namespace

Result<CallArgs> Renderer::EvalArgs(const Expr& e, size_t first) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [k, expr] : e.kwargs) {
    ASSIGN_OR_RETURN(Value v, Eval(*expr));
    args.keyword.emplace_back(k, std::move(v));
  }
  return args;
}

Result<Value> Renderer::Eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName:
      return Lookup(e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      ASSIGN_OR_RETURN(CallArgs items, EvalArgs(e, 0));
      if (e.kind == Expr::Kind::kTuple) return Value::Tuple(std::move(items.positional));
      return Value(std::move(items.positional));
    }
    case Expr::Kind::kDict: {
      Value d{Object()};
      for (const auto& [k, v] : e.dict_items) {
        ASSIGN_OR_RETURN(Value key, Eval(*k));
        if (!key.is_string()) {
          return AtPos(k->pos, InvalidArgument("dict keys must be strings, not " + key.TypeName()));
        }
        ASSIGN_OR_RETURN(Value value, Eval(*v));
        d.Set(key.as_string(), std::move(value));
      }
      return d;
    }
    case Expr::Kind::kGetAttr:
      return EvalGetAttr(e);
    case Expr::Kind::kGetItem:
      return EvalGetItem(e);
    case Expr::Kind::kSlice:
      return EvalSlice(e);
    case Expr::Kind::kCall:
      return EvalCall(e);
    case Expr::Kind::kFilter:
      return EvalFilter(e, nullptr);
    case Expr::Kind::kTest: {
      ASSIGN_OR_RETURN(Value target, Eval(*e.args[0]));
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
      Result<bool> r = ApplyTest(e.name, target, args);
      if (!r.ok()) return AtPos(e.pos, r.status());
      return Value(*r);
    }
    case Expr::Kind::kNegate:
    case Expr::Kind::kPlus: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      if (!IsNumeric(v)) {
        return AtPos(e.pos, InvalidArgument("bad operand type for unary " +
                                            std::string(e.kind == Expr::Kind::kNegate ? "-" : "+") +
                                            ": '" + v.TypeName() + "'"));
      }
      v = AsNumber(v);
      if (e.kind == Expr::Kind::kPlus) return v;
      return v.is_int() ? Value(-v.as_int()) : Value(-v.as_double());
    }
    case Expr::Kind::kNot: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      return Value(!v.Truthy());
    }
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {
      ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
      if (left.Truthy() == (e.kind == Expr::Kind::kOr)) return left;
      return Eval(*e.args[1]);
    }
    case Expr::Kind::kCondition: {
      ASSIGN_OR_RETURN(Value cond, Eval(*e.args[1]));
      if (cond.Truthy()) return Eval(*e.args[0]);
      if (e.args[2]) return Eval(*e.args[2]);
      return Value::Undefined("conditional expression without else");
    }
    case Expr::Kind::kBinary:
      return EvalBinary(e);
  }
  return AtPos(e.pos, Internal("unknown expression"));
}

Result<Value> Renderer::EvalBinary(const Expr& e) {
  ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
  ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
  const std::string& op = e.name;
  if (op == "~") return Value(a.Str() + b.Str());
  if (op == "==") return Value(a.Equals(b));
  if (op == "!=") return Value(!a.Equals(b));
  Result<bool> r = false;
  if (op == "<") {
    r = LessThan(a, b);
  } else if (op == ">") {
    r = LessThan(b, a);
  } else if (op == "<=" || op == ">=") {
    r = op == "<=" ? LessThan(b, a) : LessThan(a, b);
    if (r.ok()) r = !*r;
  } else if (op == "in" || op == "not in") {
    r = Contains(b, a);
    if (r.ok() && op == "not in") r = !*r;
  } else if (op == "%" && a.is_string()) {
    Result<Value> v =
        ApplyFilter("format", a, CallArgs{b.is_array() ? b.as_array() : Array{b}, {}});
    if (!v.ok()) return AtPos(e.pos, v.status());
    return v;
  } else {
    Result<Value> v = Arithmetic(op, a, b);
    if (!v.ok()) return AtPos(e.pos, v.status());
    return v;
  }
  if (!r.ok()) return AtPos(e.pos, r.status());
  return Value(*r);
}

Result<Value> Renderer::EvalGetAttr(const Expr& e) {
  ASSIGN_OR_RETURN(Value target, Eval(*e.args[0]));
  if (target.is_undefined()) return AtPos(e.pos, Undefined(target));
  const Value* v = target.Find(e.name);
  if (v != nullptr) return *v;
  return Value::Undefined(target.TypeName() + " has no attribute '" + e.name + "'");
}

Result<Value> Renderer::EvalGetItem(const Expr& e) {
  ASSIGN_OR_RETURN(Value target, Eval(*e.args[0]));
  ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
  if (target.is_undefined()) return AtPos(e.pos, Undefined(target));
  const std::string missing = target.TypeName() + " has no item " + key.Repr();
  if (target.is_object()) {
    const Value* v = key.is_string() ? target.Find(key.as_string()) : nullptr;
    return v != nullptr ? *v : Value::Undefined(missing);
  }
  if ((target.is_array() || target.is_string()) && (key.is_int() || key.is_bool())) {
    ASSIGN_OR_RETURN(Array items, Iterate(target));
    int64_t i = AsNumber(key).as_int();
    if (i < 0) i += static_cast<int64_t>(items.size());
    if (i < 0 || i >= static_cast<int64_t>(items.size())) return Value::Undefined(missing);
    return items[static_cast<size_t>(i)];
  }
  return Value::Undefined(missing);
}

Result<Value> Renderer::EvalSlice(const Expr& e) {
  ASSIGN_OR_RETURN(Value target, Eval(*e.args[0]));
  Value parts[3];
  for (int k = 0; k < 3; ++k) {
    if (!e.args[k + 1]) continue;
    ASSIGN_OR_RETURN(parts[k], Eval(*e.args[k + 1]));
    if (!parts[k].is_int() && !parts[k].is_none()) {
      return AtPos(e.pos, InvalidArgument("slice indices must be integers or None"));
    }
  }
  if (!target.is_array() && !target.is_string()) {
    if (target.is_undefined()) return AtPos(e.pos, Undefined(target));
    return AtPos(e.pos, InvalidArgument("'" + target.TypeName() + "' object is not subscriptable"));
  }
  const int64_t step = parts[2].is_int() ? parts[2].as_int() : 1;
  if (step == 0) return AtPos(e.pos, InvalidArgument("slice step cannot be zero"));
  ASSIGN_OR_RETURN(Array items, Iterate(target));
  int64_t lo = 0;
  int64_t hi = 0;
  SliceIndices(static_cast<int64_t>(items.size()), e.args[1] ? &parts[0] : nullptr,
               e.args[2] ? &parts[1] : nullptr, step, &lo, &hi);
  Array out;
  for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) out.push_back(items[i]);
  if (target.is_array()) return Value(std::move(out));
  std::string s;
  for (const Value& c : out) s += c.as_string();
  return Value(std::move(s));
}

Result<Value> Renderer::EvalCall(const Expr& e) {
  const Expr& callee = *e.args[0];
  ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
  if (callee.kind == Expr::Kind::kGetAttr) {
    ASSIGN_OR_RETURN(Value target, Eval(*callee.args[0]));
    if (target.is_undefined()) return AtPos(callee.pos, Undefined(target));
    const Value* member = target.Find(callee.name);
    if (member == nullptr || !member->is_function()) {
      Result<Value> r = CallMethod(target, callee.name, args);
      if (!r.ok()) return AtPos(callee.pos, r.status());
      return r;
    }
    Result<Value> r = member->as_function()(args);
    if (!r.ok()) return AtPos(callee.pos, r.status());
    return r;
  }
  ASSIGN_OR_RETURN(Value f, Eval(callee));
  if (!f.is_function()) {
    if (f.is_undefined()) return AtPos(callee.pos, Undefined(f));
    return AtPos(callee.pos, InvalidArgument("'" + f.TypeName() + "' object is not callable"));
  }
  Result<Value> r = f.as_function()(args);
  if (!r.ok()) return AtPos(callee.pos, r.status());
  return r;
}

Result<Value> Renderer::EvalFilter(const Expr& e, const Value* input) {
  Value target;
  if (!e.args[0]) {
    target = *input;
  } else if (e.args[0]->kind == Expr::Kind::kFilter) {
    ASSIGN_OR_RETURN(target, EvalFilter(*e.args[0], input));
  } else {
    ASSIGN_OR_RETURN(target, Eval(*e.args[0]));
  }
  ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
  Result<Value> r = ApplyFilter(e.name, target, args);
  if (!r.ok()) return AtPos(e.pos, r.status());
  return r;
}

}  // namespace pd::template_engine
