// Jinja's built-in filters (ApplyFilter), with Python's semantics.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "template/builtins.h"
#include "template/text_util.h"

namespace pd::template_engine {
namespace {

// Jinja's attribute lookup for filters' attribute= ("a.b", "0").
Value GetPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    if (dot == std::string::npos) dot = path.size();
    const std::string part = path.substr(start, dot - start);
    if (cur.is_object()) {
      const Value* next = cur.Find(part);
      cur = next != nullptr ? *next : Value::Undefined(part);
    } else if (cur.is_array() && !part.empty() &&
               std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      const size_t i = std::stoul(part);
      cur = i < cur.as_array().size() ? cur.as_array()[i] : Value::Undefined(part);
    } else {
      return Value::Undefined(part);
    }
    start = dot + 1;
  }
  return cur;
}

Result<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return static_cast<int64_t>(CodePointCount(v.as_string()));
    case Value::Kind::kArray:
      return static_cast<int64_t>(v.as_array().size());
    case Value::Kind::kObject:
      return static_cast<int64_t>(v.as_object().size());
    case Value::Kind::kUndefined:
      return 0;
    default:
      return InvalidArgument("object of type '" + v.TypeName() + "' has no len()");
  }
}

// Sort key: strings lowered unless case_sensitive.
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(PyLower(v.as_string()));
  return v;
}

Result<Value> SortValues(Array items, const ArgReader& r, bool by_attribute) {
  const bool reverse = r.Bool(0, "reverse", false);
  const bool case_sensitive = r.Bool(1, "case_sensitive", false);
  std::string attribute;
  if (by_attribute) {
    ASSIGN_OR_RETURN(attribute, r.String(2, "attribute", ""));
  }
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& v : items) {
    Value key = attribute.empty() ? v : GetPath(v, attribute);
    keyed.emplace_back(SortKey(key, case_sensitive), std::move(v));
  }
  Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    auto less = reverse ? LessThan(y.first, x.first) : LessThan(x.first, y.first);
    if (!less.ok()) {
      if (error.ok()) error = less.status();
      return false;
    }
    return *less;
  });
  RETURN_IF_ERROR(error);
  Array out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value(std::move(out));
}

std::vector<std::string> SplitLines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      lines.push_back(s.substr(start, i - start));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return lines;
}

Result<Value> Indent(const Value& target, const ArgReader& r) {
  const Value* width = r.Get(0, "width");
  std::string indention(4, ' ');
  if (width != nullptr && width->is_string()) {
    indention = width->as_string();
  } else {
    ASSIGN_OR_RETURN(int64_t n, r.Int(0, "width", 4));
    indention = std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
  }
  const bool first = r.Bool(1, "first", false);
  const bool blank = r.Bool(2, "blank", false);
  std::vector<std::string> lines = SplitLines(target.Str() + "\n");
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) rv += "\n" + ((blank || !lines[i].empty()) ? indention : std::string());
    rv += lines[i];
  }
  if (first) rv = indention + rv;
  return Value(rv);
}

// printf-style `fmt % args` for %s %r %d %i %f %%.
Result<Value> PercentFormat(const std::string& fmt, const Array& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) return InvalidArgument("format: incomplete format");
    const char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size())
      return InvalidArgument("format: not enough arguments for format string");
    const Value& a = args[next++];
    if (c == 's') {
      out += a.Str();
    } else if (c == 'r') {
      out += a.Repr();
    } else if (c == 'd' || c == 'i') {
      if (!a.is_number() && !a.is_bool()) return InvalidArgument("format: %d needs a number");
      out += std::to_string(a.is_int() ? a.as_int() : static_cast<int64_t>(a.as_double()));
    } else if (c == 'f') {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%f", a.as_double());
      out += buf;
    } else {
      return InvalidArgument(std::string("format: unsupported format character '") + c + "'");
    }
  }
  if (next < args.size()) return InvalidArgument("format: not all arguments converted");
  return Value(out);
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Result<Value> ToJson(const Value& target, const ArgReader& r) {
  JsonDumpOptions o;
  o.ensure_ascii = r.Bool(0, "ensure_ascii", false);
  const Value* indent = r.Get(1, "indent");
  if (indent != nullptr && !indent->is_none()) {
    if (!indent->is_int()) return r.Error("indent must be an integer");
    o.indent = static_cast<int>(std::max<int64_t>(indent->as_int(), 0));
  }
  const Value* sep = r.Get(2, "separators");
  if (sep != nullptr && !sep->is_none()) {
    if (!sep->is_array() || sep->as_array().size() != 2 || !sep->as_array()[0].is_string() ||
        !sep->as_array()[1].is_string()) {
      return r.Error("separators must be a pair of strings");
    }
    o.item_separator = sep->as_array()[0].as_string();
    o.key_separator = sep->as_array()[1].as_string();
  }
  o.sort_keys = r.Bool(3, "sort_keys", false);
  ASSIGN_OR_RETURN(std::string text, DumpJson(target, o));
  return Value(std::move(text));
}

Result<Value> SelectAttr(const Value& target, const ArgReader& r, const CallArgs& args,
                         bool select) {
  ASSIGN_OR_RETURN(std::string attribute, r.String(0, "attribute", ""));
  ASSIGN_OR_RETURN(Array items, Iterate(target));
  std::string test;
  CallArgs test_args;
  if (args.positional.size() > 1) {
    if (!args.positional[1].is_string()) return r.Error("the test name must be a string");
    test = args.positional[1].as_string();
    if (!IsKnownTest(test)) return r.Error("unknown test '" + test + "'");
    test_args.positional.assign(args.positional.begin() + 2, args.positional.end());
  }
  Array out;
  for (const Value& item : items) {
    const Value attr = GetPath(item, attribute);
    bool pass = attr.Truthy();
    if (!test.empty()) {
      ASSIGN_OR_RETURN(pass, ApplyTest(test, attr, test_args));
    }
    if (pass == select) out.push_back(item);
  }
  return Value(std::move(out));
}

Result<Value> Map(const Value& target, const ArgReader& r, const CallArgs& args) {
  ASSIGN_OR_RETURN(Array items, Iterate(target));
  Array out;
  if (const Value* attribute = r.Get(99, "attribute"); attribute != nullptr) {
    if (!attribute->is_string()) return r.Error("attribute must be a string");
    const Value* fallback = r.Get(99, "default");
    for (const Value& item : items) {
      Value v = GetPath(item, attribute->as_string());
      out.push_back(v.is_undefined() && fallback != nullptr ? *fallback : v);
    }
    return Value(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return r.Error("expected a filter name or attribute=");
  }
  const std::string& filter = args.positional[0].as_string();
  if (!IsKnownFilter(filter)) return r.Error("unknown filter '" + filter + "'");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value v, ApplyFilter(filter, item, rest));
    out.push_back(std::move(v));
  }
  return Value(std::move(out));
}

Result<Value> Unique(const Value& target, const ArgReader& r) {
  ASSIGN_OR_RETURN(Array items, Iterate(target));
  const bool case_sensitive = r.Bool(0, "case_sensitive", false);
  ASSIGN_OR_RETURN(std::string attribute, r.String(1, "attribute", ""));
  Array out;
  Array seen;
  for (const Value& item : items) {
    Value key = SortKey(attribute.empty() ? item : GetPath(item, attribute), case_sensitive);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return s.Equals(key); })) {
      continue;
    }
    seen.push_back(key);
    out.push_back(item);
  }
  return Value(std::move(out));
}

Result<Value> Join(const Value& target, const ArgReader& r) {
  ASSIGN_OR_RETURN(std::string sep, r.String(0, "d", ""));
  ASSIGN_OR_RETURN(std::string attribute, r.String(1, "attribute", ""));
  ASSIGN_OR_RETURN(Array items, Iterate(target));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += (attribute.empty() ? items[i] : GetPath(items[i], attribute)).Str();
  }
  return Value(std::move(out));
}

Result<Value> ToInt(const Value& target, const ArgReader& r) {
  ASSIGN_OR_RETURN(int64_t fallback, r.Int(0, "default", 0));
  if (target.is_int()) return target;
  if (target.is_bool()) return Value(static_cast<int64_t>(target.as_bool()));
  if (target.is_float()) return Value(static_cast<int64_t>(target.as_double()));
  if (target.is_string()) {
    const std::string s = PyStrip(target.as_string(), nullptr, true, true);
    char* end = nullptr;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && *end == '\0') return Value(static_cast<int64_t>(i));
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value(static_cast<int64_t>(d));
  }
  return Value(fallback);
}

Result<Value> ToFloat(const Value& target, const ArgReader& r) {
  const Value* fallback = r.Get(0, "default");
  if (target.is_number()) return Value(target.as_double());
  if (target.is_bool()) return Value(target.as_bool() ? 1.0 : 0.0);
  if (target.is_string()) {
    const std::string s = PyStrip(target.as_string(), nullptr, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value(d);
  }
  return fallback != nullptr ? *fallback : Value(0.0);
}

Result<Value> Round(const Value& target, const ArgReader& r) {
  ASSIGN_OR_RETURN(int64_t precision, r.Int(0, "precision", 0));
  ASSIGN_OR_RETURN(std::string method, r.String(1, "method", "common"));
  if (!target.is_number()) return r.Error("expected a number, not " + target.TypeName());
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = target.as_double() * scale;
  double y = 0;
  if (method == "common") {
    y = std::nearbyint(x);  // Python's round: halves to even
  } else if (method == "ceil") {
    y = std::ceil(x);
  } else if (method == "floor") {
    y = std::floor(x);
  } else {
    return r.Error("method must be common, ceil or floor");
  }
  return Value(y / scale);
}

Result<Value> FirstOrLast(const Value& target, bool first) {
  ASSIGN_OR_RETURN(Array items, Iterate(target));
  if (items.empty()) return Value::Undefined(first ? "first" : "last");
  return first ? items.front() : items.back();
}

Result<Value> StringFilter(std::string_view name, const Value& target, const ArgReader& r) {
  const std::string s = target.Str();
  if (name == "trim") {
    const Value* chars = r.Get(0, "chars");
    const std::string* set = chars != nullptr && chars->is_string() ? &chars->as_string() : nullptr;
    return Value(PyStrip(s, set, true, true));
  }
  if (name == "lower") return Value(PyLower(s));
  if (name == "upper") return Value(PyUpper(s));
  if (name == "title") return Value(PyTitle(s));
  if (name == "capitalize") return Value(PyCapitalize(s));
  if (name == "escape" || name == "e") return Value(HtmlEscape(s));
  if (name == "string") return Value(s);
  if (name == "replace") {
    ASSIGN_OR_RETURN(std::string from, r.String(0, "old", ""));
    ASSIGN_OR_RETURN(std::string to, r.String(1, "new", ""));
    ASSIGN_OR_RETURN(int64_t count, r.Int(2, "count", -1));
    return Value(PyReplace(s, from, to, count));
  }
  return r.Error("not a string filter");
}

// Filters over lists and dicts (and strings as sequences); NotFound for other names.
Result<Value> SequenceFilter(std::string_view name, const Value& target, const ArgReader& r,
                             const CallArgs& args) {
  if (name == "join") return Join(target, r);
  if (name == "first" || name == "last") return FirstOrLast(target, name == "first");
  if (name == "list") {
    ASSIGN_OR_RETURN(Array items, Iterate(target));
    return Value(std::move(items));
  }
  if (name == "items") {
    if (target.is_undefined()) return Value(Array());
    if (!target.is_object()) return r.Error("expected a dict, not " + target.TypeName());
    Array out;
    for (const auto& [k, v] : target.as_object()) out.push_back(Value::Tuple(Array{Value(k), v}));
    return Value(std::move(out));
  }
  if (name == "dictsort") {
    if (!target.is_object()) return r.Error("expected a dict, not " + target.TypeName());
    const bool case_sensitive = r.Bool(0, "case_sensitive", false);
    ASSIGN_OR_RETURN(std::string by, r.String(1, "by", "key"));
    const bool reverse = r.Bool(2, "reverse", false);
    Array pairs;
    for (const auto& [k, v] : target.as_object()) pairs.push_back(Value::Tuple(Array{Value(k), v}));
    CallArgs sort_args;
    sort_args.positional = {Value(reverse), Value(case_sensitive),
                            Value(by == "value" ? "1" : "0")};
    return SortValues(std::move(pairs), ArgReader("filter 'dictsort'", sort_args), true);
  }
  if (name == "sort") {
    ASSIGN_OR_RETURN(Array items, Iterate(target));
    return SortValues(std::move(items), r, true);
  }
  if (name == "reverse") {
    if (target.is_string()) {
      ASSIGN_OR_RETURN(Array chars, Iterate(target));
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->as_string();
      return Value(out);
    }
    ASSIGN_OR_RETURN(Array items, Iterate(target));
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "unique") return Unique(target, r);
  if (name == "selectattr" || name == "rejectattr") {
    return SelectAttr(target, r, args, name == "selectattr");
  }
  if (name == "select" || name == "reject") {
    ASSIGN_OR_RETURN(Array items, Iterate(target));
    ASSIGN_OR_RETURN(std::string test, r.String(0, "test", ""));
    if (!test.empty() && !IsKnownTest(test)) return r.Error("unknown test '" + test + "'");
    CallArgs test_args;
    if (!args.positional.empty()) {
      test_args.positional.assign(args.positional.begin() + 1, args.positional.end());
    }
    Array out;
    for (const Value& item : items) {
      bool pass = item.Truthy();
      if (!test.empty()) {
        ASSIGN_OR_RETURN(pass, ApplyTest(test, item, test_args));
      }
      if (pass == (name == "select")) out.push_back(item);
    }
    return Value(std::move(out));
  }
  if (name == "map") return Map(target, r, args);
  if (name == "attr") {
    ASSIGN_OR_RETURN(std::string attribute, r.String(0, "name", ""));
    const Value* v = target.Find(attribute);
    return v != nullptr ? *v : Value::Undefined(attribute);
  }
  return NotFound("");
}

// Filters over numbers, and formatting; NotFound for other names.
Result<Value> NumberFilter(std::string_view name, const Value& target, const ArgReader& r,
                           const CallArgs& args) {
  if (name == "int") return ToInt(target, r);
  if (name == "float") return ToFloat(target, r);
  if (name == "abs") {
    if (target.is_int()) return Value(target.as_int() < 0 ? -target.as_int() : target.as_int());
    if (target.is_float()) return Value(std::fabs(target.as_double()));
    return r.Error("bad operand type for abs(): '" + target.TypeName() + "'");
  }
  if (name == "round") return Round(target, r);
  if (name == "indent") return Indent(target, r);
  if (name == "format") {
    if (!target.is_string()) return r.Error("expected a format string");
    return PercentFormat(target.as_string(), args.positional);
  }
  if (name == "sum" || name == "min" || name == "max") {
    ASSIGN_OR_RETURN(Array items, Iterate(target));
    ASSIGN_OR_RETURN(std::string attribute, r.String(name == "sum" ? 0 : 1, "attribute", ""));
    if (!attribute.empty()) {
      for (Value& v : items) v = GetPath(v, attribute);
    }
    if (name == "sum") {
      Value total = r.Get(1, "start") != nullptr ? *r.Get(1, "start") : Value(int64_t{0});
      for (const Value& v : items) {
        if (!v.is_number() || !total.is_number()) return r.Error("can only sum numbers");
        total = total.is_int() && v.is_int() ? Value(total.as_int() + v.as_int())
                                             : Value(total.as_double() + v.as_double());
      }
      return total;
    }
    if (items.empty()) return Value::Undefined(std::string(name));
    Value best = items[0];
    for (const Value& v : items) {
      ASSIGN_OR_RETURN(bool less, LessThan(SortKey(v, false), SortKey(best, false)));
      if (less == (name == "min") && !v.Equals(best)) best = v;
    }
    return best;
  }
  return NotFound("");
}

}  // namespace

Result<Value> ApplyFilter(std::string_view name, const Value& target, const CallArgs& args) {
  const ArgReader r("filter '" + std::string(name) + "'", args);
  if (name == "default" || name == "d") {
    const bool boolean = r.Bool(1, "boolean", false);
    if (target.is_undefined() || (boolean && !target.Truthy())) {
      const Value* fallback = r.Get(0, "default_value");
      return fallback != nullptr ? *fallback : Value("");
    }
    return target;
  }
  if (target.is_undefined() && name != "length" && name != "count" && name != "list" &&
      name != "string" && name != "first" && name != "last" && name != "join" && name != "trim") {
    return r.Error("its input is undefined" + (target.undefined_hint().empty()
                                                   ? std::string()
                                                   : " ('" + target.undefined_hint() + "')"));
  }
  if (name == "trim" || name == "lower" || name == "upper" || name == "title" ||
      name == "capitalize" || name == "escape" || name == "e" || name == "string" ||
      name == "replace") {
    return StringFilter(name, target, r);
  }
  if (name == "safe") return target;
  if (name == "tojson") return ToJson(target, r);
  if (name == "length" || name == "count") {
    ASSIGN_OR_RETURN(int64_t n, Length(target));
    return Value(n);
  }
  for (auto* group : {&SequenceFilter, &NumberFilter}) {
    Result<Value> v = group(name, target, r, args);
    if (v.ok() || v.status().code() != StatusCode::kNotFound) return v;
  }
  return r.Error("unknown filter");
}

}  // namespace pd::template_engine
