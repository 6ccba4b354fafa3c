// The values a Jinja template computes with: Python's None, bool, int, float, str, list and dict
// (insertion-ordered, as Python's), plus Jinja's undefined and callables (macros, namespace
// functions, globals such as raise_exception).
//
// Thread safety: a Value shares its list/dict/callable payload by shared_ptr; values handed to a
// render are only read, so one context may be rendered from several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pd::template_engine {

class Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, unique keys

// Arguments of a call: positional, then keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<Result<Value>(const CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kFunction };

  Value() = default;  // undefined
  static Value None();
  Value(bool b);                                        // NOLINT: implicit, as Python's literals
  Value(int64_t i);                                     // NOLINT
  Value(int i) : Value(static_cast<int64_t>(i)) {}      // NOLINT
  Value(double d);                                      // NOLINT
  Value(std::string s);                                 // NOLINT
  Value(std::string_view s) : Value(std::string(s)) {}  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}       // NOLINT
  Value(Array a);                                       // NOLINT
  Value(Object o);                                      // NOLINT
  static Value FromFunction(Function f);
  // A list that prints as Python's tuple: "(1, 2)" (dict items, tuple literals).
  static Value Tuple(Array a);
  // A name for errors ("undefined variable 'x'") carried by an undefined value.
  static Value Undefined(std::string hint);
  // nlohmann JSON (ordered or not) to a Value; object key order is kept as iterated.
  static Value FromJson(const nlohmann::ordered_json& j);
  static Value FromJson(const nlohmann::json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_tuple() const { return kind_ == Kind::kArray && tuple_; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : d_; }
  const std::string& as_string() const { return *s_; }
  const Array& as_array() const { return *a_; }
  Array& mutable_array() { return *a_; }
  const Object& as_object() const { return *o_; }
  // Shared with every copy of this value: how `set ns.attr = ...` changes a namespace.
  Object& mutable_object() { return *o_; }
  const Function& as_function() const { return *f_; }
  const std::string& undefined_hint() const { return hint_; }

  // Dict lookup; nullptr when absent (or not a dict).
  const Value* Find(std::string_view key) const;
  // Sets (replacing or appending) a key of a dict.
  void Set(const std::string& key, Value v);

  // Python truthiness.
  bool Truthy() const;
  // "NoneType", "str", "list", "dict", ... for errors.
  std::string TypeName() const;
  // Python's str(): strings as they are, None as "None", lists and dicts as their repr.
  std::string Str() const;
  // Python's repr().
  std::string Repr() const;
  // Python ==.
  bool Equals(const Value& other) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;  // an array that prints as a tuple
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
  std::shared_ptr<Function> f_;
  std::string hint_;
};

// Python's json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...) as HF's
// tojson filter calls it. indent < 0 is None. Undefined and functions are a TypeError.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;
  std::string item_separator;  // empty: Python's default for the indent
  std::string key_separator = ": ";
  bool sort_keys = false;
};
Result<std::string> DumpJson(const Value& v, const JsonDumpOptions& options);

// Python's repr() of a float ("1.0", "0.1", "1e+16", "inf").
std::string FloatRepr(double d);

}  // namespace pd::template_engine
