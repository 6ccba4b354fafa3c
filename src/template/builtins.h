// Jinja's built-in filters and tests, and the methods of str, dict and list that templates call,
// with Python's semantics.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "template/value.h"

namespace pd::template_engine {

bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

// `target | name(args)`. Errors name the filter and what was wrong with its input.
Result<Value> ApplyFilter(std::string_view name, const Value& target, const CallArgs& args);
// `target is name(args)`.
Result<bool> ApplyTest(std::string_view name, const Value& target, const CallArgs& args);
// `target.name(args)`; NotFound when the type has no such method.
Result<Value> CallMethod(const Value& target, std::string_view name, const CallArgs& args);

// Python's `a < b` for numbers, strings and lists; InvalidArgument for other types.
Result<bool> LessThan(const Value& a, const Value& b);
// Python's `needle in haystack`.
Result<bool> Contains(const Value& haystack, const Value& needle);
// The items a `for` iterates: a list's elements, a dict's keys, a string's characters;
// undefined iterates as empty.
Result<Array> Iterate(const Value& v);

// Reads call arguments by position or keyword, as Python binds them.
class ArgReader {
 public:
  ArgReader(std::string_view what, const CallArgs& args) : what_(what), args_(args) {}
  // Argument at `index` (after the bound target) or keyword `name`; nullptr when absent.
  const Value* Get(size_t index, std::string_view name) const;
  Result<std::string> String(size_t index, std::string_view name, std::string fallback) const;
  Result<int64_t> Int(size_t index, std::string_view name, int64_t fallback) const;
  bool Bool(size_t index, std::string_view name, bool fallback) const;
  Status Error(const std::string& message) const;

 private:
  std::string what_;
  const CallArgs& args_;
};

}  // namespace pd::template_engine
