#include "template/builtins.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "template/text_util.h"

namespace pd::template_engine {

const Value* ArgReader::Get(size_t index, std::string_view name) const {
  if (index < args_.positional.size()) return &args_.positional[index];
  for (const auto& [k, v] : args_.keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

Result<std::string> ArgReader::String(size_t index, std::string_view name,
                                      std::string fallback) const {
  const Value* v = Get(index, name);
  if (v == nullptr || v->is_none()) return fallback;
  if (!v->is_string()) {
    return Error("argument '" + std::string(name) + "' must be a string, not " + v->TypeName());
  }
  return v->as_string();
}

Result<int64_t> ArgReader::Int(size_t index, std::string_view name, int64_t fallback) const {
  const Value* v = Get(index, name);
  if (v == nullptr || v->is_none()) return fallback;
  if (v->is_bool()) return static_cast<int64_t>(v->as_bool());
  if (!v->is_int()) {
    return Error("argument '" + std::string(name) + "' must be an integer, not " + v->TypeName());
  }
  return v->as_int();
}

bool ArgReader::Bool(size_t index, std::string_view name, bool fallback) const {
  const Value* v = Get(index, name);
  return v == nullptr ? fallback : v->Truthy();
}

Status ArgReader::Error(const std::string& message) const {
  return InvalidArgument(what_ + ": " + message);
}

Result<bool> LessThan(const Value& a, const Value& b) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    auto num = [](const Value& v) {
      return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_double();
    };
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int();
    return num(a) < num(b);
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_array() && b.is_array()) {
    const Array& x = a.as_array();
    const Array& y = b.as_array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i].Equals(y[i])) continue;
      return LessThan(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return InvalidArgument("'<' not supported between instances of '" + a.TypeName() + "' and '" +
                         b.TypeName() + "'");
}

Result<bool> Contains(const Value& haystack, const Value& needle) {
  if (haystack.is_string()) {
    if (!needle.is_string()) {
      return InvalidArgument("'in <string>' requires string as left operand, not " +
                             needle.TypeName());
    }
    return haystack.as_string().find(needle.as_string()) != std::string::npos;
  }
  if (haystack.is_array()) {
    for (const Value& v : haystack.as_array()) {
      if (v.Equals(needle)) return true;
    }
    return false;
  }
  if (haystack.is_object())
    return needle.is_string() && haystack.Find(needle.as_string()) != nullptr;
  if (haystack.is_undefined()) return false;
  return InvalidArgument("argument of type '" + haystack.TypeName() + "' is not iterable");
}

Result<Array> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Array();
    case Value::Kind::kArray:
      return v.as_array();
    case Value::Kind::kObject: {
      Array keys;
      for (const auto& kv : v.as_object()) keys.emplace_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      Array chars;
      const std::string& s = v.as_string();
      const std::vector<size_t> offsets = CodePointOffsets(s);
      for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        chars.emplace_back(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
      }
      return chars;
    }
    default:
      return InvalidArgument("'" + v.TypeName() + "' object is not iterable");
  }
}

namespace {
constexpr std::array<std::string_view, 39> kFilters = {
    "abs",     "capitalize", "count",  "d",      "default", "dictsort",   "e",      "escape",
    "first",   "float",      "format", "indent", "int",     "items",      "join",   "last",
    "length",  "list",       "lower",  "map",    "max",     "min",        "reject", "rejectattr",
    "replace", "reverse",    "round",  "safe",   "select",  "selectattr", "sort",   "string",
    "sum",     "title",      "tojson", "trim",   "unique",  "upper",      "attr"};
constexpr std::array<std::string_view, 32> kTests = {
    "defined", "undefined",   "none",  "string",   "mapping", "iterable", "number",  "sequence",
    "boolean", "true",        "false", "equalto",  "eq",      "==",       "ne",      "!=",
    "sameas",  "integer",     "float", "callable", "lower",   "upper",    "in",      "odd",
    "even",    "divisibleby", "lt",    "gt",       "le",      "ge",       "escaped", "filter"};
}  // namespace

bool IsKnownFilter(std::string_view name) {
  return std::find(kFilters.begin(), kFilters.end(), name) != kFilters.end();
}

bool IsKnownTest(std::string_view name) {
  return name != "filter" && std::find(kTests.begin(), kTests.end(), name) != kTests.end();
}

Result<bool> ApplyTest(std::string_view name, const Value& v, const CallArgs& args) {
  const ArgReader r("test '" + std::string(name) + "'", args);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "iterable") return v.is_string() || v.is_array() || v.is_object();
  if (name == "sequence") return v.is_string() || v.is_array() || v.is_object();
  if (name == "number") return v.is_number() || v.is_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_function();
  if (name == "lower") return v.is_string() && PyLower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && PyUpper(v.as_string()) == v.as_string();
  if (name == "escaped") return false;
  const Value* other = r.Get(0, "other");
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int()) return r.Error("expected an integer, not " + v.TypeName());
    if (name == "divisibleby") {
      ASSIGN_OR_RETURN(int64_t n, r.Int(0, "num", 1));
      if (n == 0) return r.Error("division by zero");
      return v.as_int() % n == 0;
    }
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (other == nullptr) return r.Error("expects an argument");
  if (name == "equalto" || name == "eq" || name == "==") return v.Equals(*other);
  if (name == "ne" || name == "!=") return !v.Equals(*other);
  if (name == "sameas") {
    return v.Equals(*other) && v.kind() == other->kind() &&
           (v.is_none() || v.is_bool() || v.is_undefined());
  }
  if (name == "in") return Contains(*other, v);
  if (name == "lt") return LessThan(v, *other);
  if (name == "gt") return LessThan(*other, v);
  if (name == "le") {
    ASSIGN_OR_RETURN(bool gt, LessThan(*other, v));
    return !gt;
  }
  if (name == "ge") {
    ASSIGN_OR_RETURN(bool lt, LessThan(v, *other));
    return !lt;
  }
  return r.Error("unknown test");
}

}  // namespace pd::template_engine
