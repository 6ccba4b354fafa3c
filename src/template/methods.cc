// The methods of str and dict that chat templates call (`content.split('</think>')`,
// `message.get('tool_calls')`), with Python's semantics.
#include <algorithm>

#include "template/builtins.h"
#include "template/text_util.h"

namespace pd::template_engine {
namespace {

Result<Value> AffixMethod(const std::string& s, std::string_view name, const ArgReader& r) {
  const Value* arg = r.Get(0, "prefix");
  if (arg == nullptr) return r.Error("takes at least 1 argument");
  std::vector<std::string> affixes;
  if (arg->is_string()) {
    affixes.push_back(arg->as_string());
  } else if (arg->is_array()) {
    for (const Value& v : arg->as_array()) {
      if (!v.is_string()) return r.Error("the tuple must hold strings");
      affixes.push_back(v.as_string());
    }
  } else {
    return r.Error("argument must be str or a tuple of str, not " + arg->TypeName());
  }
  for (const std::string& a : affixes) {
    if (name == "startswith" ? s.starts_with(a) : s.ends_with(a)) return Value(true);
  }
  return Value(false);
}

Result<Value> StringMethod(const std::string& s, std::string_view name, const CallArgs& args) {
  const ArgReader r("str." + std::string(name) + "()", args);
  if (name == "startswith" || name == "endswith") return AffixMethod(s, name, r);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = r.Get(0, "chars");
    if (chars != nullptr && !chars->is_none() && !chars->is_string()) {
      return r.Error("arg must be None or str");
    }
    const std::string* set = chars != nullptr && chars->is_string() ? &chars->as_string() : nullptr;
    return Value(PyStrip(s, set, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const Value* sep = r.Get(0, "sep");
    ASSIGN_OR_RETURN(int64_t maxsplit, r.Int(1, "maxsplit", -1));
    if (name == "rsplit" && maxsplit >= 0) return r.Error("maxsplit is not supported");
    const std::string* sep_str = nullptr;
    if (sep != nullptr && !sep->is_none()) {
      if (!sep->is_string()) return r.Error("must be str or None, not " + sep->TypeName());
      if (sep->as_string().empty()) return r.Error("empty separator");
      sep_str = &sep->as_string();
    }
    Array parts;
    for (std::string& p : PySplit(s, sep_str, maxsplit)) parts.emplace_back(std::move(p));
    return Value(std::move(parts));
  }
  if (name == "lower") return Value(PyLower(s));
  if (name == "upper") return Value(PyUpper(s));
  if (name == "title") return Value(PyTitle(s));
  if (name == "capitalize") return Value(PyCapitalize(s));
  if (name == "replace") {
    ASSIGN_OR_RETURN(std::string from, r.String(0, "old", ""));
    ASSIGN_OR_RETURN(std::string to, r.String(1, "new", ""));
    ASSIGN_OR_RETURN(int64_t count, r.Int(2, "count", -1));
    return Value(PyReplace(s, from, to, count));
  }
  if (name == "find" || name == "count") {
    ASSIGN_OR_RETURN(std::string sub, r.String(0, "sub", ""));
    if (name == "find") {
      const size_t at = s.find(sub);
      if (at == std::string::npos) return Value(int64_t{-1});
      return Value(static_cast<int64_t>(CodePointCount(s.substr(0, at))));
    }
    if (sub.empty()) return Value(static_cast<int64_t>(CodePointCount(s) + 1));
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value(n);
  }
  if (name == "join") {
    const Value* items = r.Get(0, "iterable");
    if (items == nullptr) return r.Error("takes exactly one argument");
    ASSIGN_OR_RETURN(Array parts, Iterate(*items));
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!parts[i].is_string()) {
        return r.Error("sequence item " + std::to_string(i) + ": expected str instance, " +
                       parts[i].TypeName() + " found");
      }
      if (i) out += s;
      out += parts[i].as_string();
    }
    return Value(out);
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha") {
    if (s.empty()) return Value(false);
    return Value(std::all_of(s.begin(), s.end(), [&](char c) {
      if (name == "isdigit") return c >= '0' && c <= '9';
      if (name == "isspace") return c == ' ' || (c >= '\t' && c <= '\r');
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    }));
  }
  return NotFound("'str' object has no attribute '" + std::string(name) + "'");
}

Result<Value> DictMethod(const Value& d, std::string_view name, const CallArgs& args) {
  const ArgReader r("dict." + std::string(name) + "()", args);
  if (name == "items" || name == "keys" || name == "values") {
    Array out;
    for (const auto& [k, v] : d.as_object()) {
      if (name == "items") {
        out.push_back(Value::Tuple(Array{Value(k), v}));
      } else {
        out.push_back(name == "keys" ? Value(k) : v);
      }
    }
    return Value(std::move(out));
  }
  if (name == "get") {
    const Value* key = r.Get(0, "key");
    if (key == nullptr) return r.Error("expected at least 1 argument");
    const Value* fallback = r.Get(1, "default");
    const Value* found = key->is_string() ? d.Find(key->as_string()) : nullptr;
    if (found != nullptr) return *found;
    return fallback != nullptr ? *fallback : Value::None();
  }
  return NotFound("'dict' object has no attribute '" + std::string(name) + "'");
}

}  // namespace

Result<Value> CallMethod(const Value& target, std::string_view name, const CallArgs& args) {
  if (target.is_string()) return StringMethod(target.as_string(), name, args);
  if (target.is_object()) return DictMethod(target, name, args);
  return NotFound("'" + target.TypeName() + "' object has no attribute '" + std::string(name) +
                  "'");
}

}  // namespace pd::template_engine
