#include "template/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "template/text_util.h"

namespace pd::template_engine {

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double d) : kind_(Kind::kFloat), d_(d) {}
Value::Value(std::string s)
    : kind_(Kind::kString), s_(std::make_shared<std::string>(std::move(s))) {}
Value::Value(Array a) : kind_(Kind::kArray), a_(std::make_shared<Array>(std::move(a))) {}
Value::Value(Object o) : kind_(Kind::kObject), o_(std::make_shared<Object>(std::move(o))) {}

Value Value::Tuple(Array a) {
  Value v(std::move(a));
  v.tuple_ = true;
  return v;
}

Value Value::FromFunction(Function f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.f_ = std::make_shared<Function>(std::move(f));
  return v;
}

Value Value::Undefined(std::string hint) {
  Value v;
  v.hint_ = std::move(hint);
  return v;
}

namespace {
template <typename J>
Value FromAnyJson(const J& j) {
  switch (j.type()) {
    case J::value_t::null:
      return Value::None();
    case J::value_t::boolean:
      return Value(j.template get<bool>());
    case J::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case J::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case J::value_t::number_float:
      return Value(j.template get<double>());
    case J::value_t::string:
      return Value(j.template get<std::string>());
    case J::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(FromAnyJson(e));
      return Value(std::move(a));
    }
    case J::value_t::object: {
      Object o;
      o.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) o.emplace_back(it.key(), FromAnyJson(*it));
      return Value(std::move(o));
    }
    default:
      return Value::None();  // binary / discarded: not produced by the JSON parser
  }
}
}  // namespace

Value Value::FromJson(const nlohmann::ordered_json& j) { return FromAnyJson(j); }
Value Value::FromJson(const nlohmann::json& j) { return FromAnyJson(j); }

const Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::kObject) return nullptr;
  for (const auto& [k, v] : *o_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::Set(const std::string& key, Value v) {
  PD_CHECK(kind_ == Kind::kObject) << "Value::Set on a " << TypeName();
  for (auto& [k, old] : *o_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  o_->emplace_back(key, std::move(v));
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kArray:
      return !a_->empty();
    case Kind::kObject:
      return !o_->empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kArray:
      return tuple_ ? "tuple" : "list";
    case Kind::kObject:
      return "dict";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Python's repr: the shortest digits that round-trip, positional when the exponent is in
  // [-4, 16), else d.ddde+XX.
  char buf[40];
  for (int precision = 0; precision <= 16; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  const size_t e = s.find('e');
  const int exponent = std::atoi(s.c_str() + e + 1);
  std::string sign = s[0] == '-' ? "-" : "";
  std::string digits;
  for (size_t i = sign.size(); i < e; ++i) {
    if (s[i] != '.') digits += s[i];
  }
  if (exponent < -4 || exponent >= 16) {
    std::string mantissa = digits.substr(0, 1);
    if (digits.size() > 1) mantissa += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+',
                  std::abs(exponent));
    return sign + mantissa + exp_buf;
  }
  if (exponent < 0) return sign + "0." + std::string(-exponent - 1, '0') + digits;
  const size_t int_len = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_len)
    return sign + digits + std::string(int_len - digits.size(), '0') + ".0";
  return sign + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

namespace {
std::string StringRepr(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = use_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}
}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return *s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return FloatRepr(d_);
    case Kind::kString:
      return StringRepr(*s_);
    case Kind::kArray: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < a_->size(); ++i) {
        if (i) out += ", ";
        out += (*a_)[i].Repr();
      }
      if (tuple_ && a_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::kObject: {
      std::string out = "{";
      for (size_t i = 0; i < o_->size(); ++i) {
        if (i) out += ", ";
        out += StringRepr((*o_)[i].first) + ": " + (*o_)[i].second.Repr();
      }
      return out + "}";
    }
    case Kind::kFunction:
      return "<function>";
  }
  return "";
}

bool Value::Equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_int() && other.is_int()) return i_ == other.i_;
    return as_double() == other.as_double();
  }
  if (is_bool() && other.is_number()) return Value(static_cast<int64_t>(b_)).Equals(other);
  if (is_number() && other.is_bool()) return other.Equals(*this);
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return b_ == other.b_;
    case Kind::kString:
      return *s_ == *other.s_;
    case Kind::kArray:
      return std::equal(a_->begin(), a_->end(), other.a_->begin(), other.a_->end(),
                        [](const Value& x, const Value& y) { return x.Equals(y); });
    case Kind::kObject: {
      if (o_->size() != other.o_->size()) return false;
      for (const auto& [k, v] : *o_) {
        const Value* w = other.Find(k);
        if (w == nullptr || !v.Equals(*w)) return false;
      }
      return true;
    }
    case Kind::kFunction:
      return f_ == other.f_;
    default:
      return false;
  }
}

namespace {

void DumpString(const std::string& s, bool ensure_ascii, std::string* out) {
  *out += '"';
  size_t pos = 0;
  while (pos < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[pos]);
    if (c < 0x80) {
      ++pos;
      switch (c) {
        case '"':
          *out += "\\\"";
          break;
        case '\\':
          *out += "\\\\";
          break;
        case '\n':
          *out += "\\n";
          break;
        case '\r':
          *out += "\\r";
          break;
        case '\t':
          *out += "\\t";
          break;
        case '\b':
          *out += "\\b";
          break;
        case '\f':
          *out += "\\f";
          break;
        default:
          if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            *out += buf;
          } else {
            *out += static_cast<char>(c);
          }
      }
      continue;
    }
    const size_t start = pos;
    uint32_t cp = 0;
    if (!DecodeUtf8(s, &pos, &cp)) {  // invalid byte: keep it as it is
      pos = start + 1;
      *out += static_cast<char>(c);
      continue;
    }
    if (!ensure_ascii) {
      out->append(s, start, pos - start);
      continue;
    }
    char buf[16];
    if (cp >= 0x10000) {
      const uint32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    } else {
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
    }
    *out += buf;
  }
  *out += '"';
}

Status DumpValue(const Value& v, const JsonDumpOptions& o, int depth, std::string* out) {
  const std::string item_sep =
      !o.item_separator.empty() ? o.item_separator : (o.indent >= 0 ? "," : ", ");
  auto newline = [&](int d) {
    if (o.indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(o.indent) * d, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return OkStatus();
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return OkStatus();
    case Value::Kind::kInt:
      *out += std::to_string(v.as_int());
      return OkStatus();
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : FloatRepr(d);
      return OkStatus();
    }
    case Value::Kind::kString:
      DumpString(v.as_string(), o.ensure_ascii, out);
      return OkStatus();
    case Value::Kind::kArray: {
      const Array& a = v.as_array();
      if (a.empty()) {
        *out += "[]";
        return OkStatus();
      }
      *out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        RETURN_IF_ERROR(DumpValue(a[i], o, depth + 1, out));
      }
      newline(depth);
      *out += ']';
      return OkStatus();
    }
    case Value::Kind::kObject: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_object()) items.push_back(&kv);
      if (items.empty()) {
        *out += "{}";
        return OkStatus();
      }
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* x, auto* y) { return x->first < y->first; });
      }
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        DumpString(items[i]->first, o.ensure_ascii, out);
        *out += o.key_separator;
        RETURN_IF_ERROR(DumpValue(items[i]->second, o, depth + 1, out));
      }
      newline(depth);
      *out += '}';
      return OkStatus();
    }
    case Value::Kind::kUndefined:
    case Value::Kind::kFunction:
      break;
  }
  return InvalidArgument("tojson: Object of type " + v.TypeName() + " is not JSON serializable");
}

}  // namespace

Result<std::string> DumpJson(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  RETURN_IF_ERROR(DumpValue(v, options, 0, &out));
  return out;
}

}  // namespace pd::template_engine
