#include "server/tool_call_formats.h"

#include <cstdlib>

namespace pd::server {
namespace {

using ojson = nlohmann::ordered_json;

std::string_view Trim(std::string_view s) {
  const char* ws = " \n\r\t";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

Result<ojson> ParseJson(std::string_view text) {
  try {
    return ojson::parse(text);
  } catch (const ojson::exception& e) {
    return InvalidArgument(std::string("not JSON: ") + e.what());
  }
}

std::string Dump(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// The arguments of a call as a JSON object's text: an object, a string holding one, or absent.
Result<std::string> ArgumentsText(const ojson& call, const char* field) {
  const auto it = call.find(field);
  if (it == call.end()) return std::string("{}");
  if (it->is_object()) return Dump(*it);
  if (it->is_string()) {
    ASSIGN_OR_RETURN(ojson inner, ParseJson(it->get<std::string>()));
    if (inner.is_object()) return Dump(inner);
  }
  return InvalidArgument(std::string("'") + field + "' is not a JSON object");
}

Result<ParsedCall> CallFromObject(const ojson& obj, const char* args_field,
                                  const char* alt_args_field) {
  if (!obj.is_object()) return InvalidArgument("a call is not a JSON object");
  const auto name = obj.find("name");
  if (name == obj.end() || !name->is_string() || name->get<std::string>().empty()) {
    return InvalidArgument("a call has no name");
  }
  const char* field =
      alt_args_field != nullptr && !obj.contains(args_field) ? alt_args_field : args_field;
  ASSIGN_OR_RETURN(std::string args, ArgumentsText(obj, field));
  return ParsedCall{name->get<std::string>(), std::move(args)};
}

// The JSON Schema type a tool gives one of its parameters ("" when none is given).
std::string ParameterType(const ojson& tools, std::string_view function, std::string_view param) {
  if (!tools.is_array()) return "";
  for (const ojson& t : tools) {
    const ojson& fn = t.value("function", ojson::object());
    if (!fn.is_object() || fn.value("name", "") != function) continue;
    const ojson& params = fn.value("parameters", ojson::object());
    if (!params.is_object() || !params.contains("properties")) return "";
    const ojson& props = params["properties"];
    if (!props.is_object() || !props.contains(std::string(param))) return "";
    const ojson& type = props[std::string(param)].value("type", ojson());
    if (type.is_string()) return type.get<std::string>();
    if (type.is_array()) {  // ["integer", "null"]: the first non-null type
      for (const ojson& each : type) {
        if (each.is_string() && each != "null") return each.get<std::string>();
      }
    }
    return "";
  }
  return "";
}

ojson ConvertParameter(const std::string& value, const std::string& type) {
  if (type == "string" || type.empty()) return value;
  if (type == "boolean") {
    if (value == "true" || value == "True") return true;
    if (value == "false" || value == "False") return false;
    return value;
  }
  if (type == "null" && value == "null") return nullptr;
  auto parsed = ParseJson(value);
  if (!parsed.ok()) return value;
  if ((type == "integer" && parsed->is_number_integer()) ||
      (type == "number" && parsed->is_number()) || (type == "object" && parsed->is_object()) ||
      (type == "array" && parsed->is_array())) {
    return *parsed;
  }
  return value;
}

// The text between `open` (e.g. "<parameter=") and the next '>', then past it.
bool TakeTag(std::string_view* s, std::string_view open, std::string* name) {
  *s = Trim(*s);
  if (!s->starts_with(open)) return false;
  const size_t close = s->find('>');
  if (close == std::string_view::npos) return false;
  *name = std::string(Trim(s->substr(open.size(), close - open.size())));
  s->remove_prefix(close + 1);
  return !name->empty();
}

}  // namespace

Result<ParsedCall> ParseHermesCall(std::string_view body) {
  ASSIGN_OR_RETURN(ojson obj, ParseJson(Trim(body)));
  return CallFromObject(obj, "arguments", nullptr);
}

Result<ParsedCall> ParseQwen3CoderCall(std::string_view body, const ojson& tools) {
  std::string_view s = body;
  ParsedCall call;
  if (!TakeTag(&s, "<function=", &call.name)) return InvalidArgument("no <function=NAME>");
  ojson args = ojson::object();
  std::string param;
  while (TakeTag(&s, "<parameter=", &param)) {
    const size_t end = s.find("</parameter>");
    if (end == std::string_view::npos) return InvalidArgument("no </parameter>");
    std::string_view value = s.substr(0, end);
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    args[param] = ConvertParameter(std::string(value), ParameterType(tools, call.name, param));
    s.remove_prefix(end + std::string_view("</parameter>").size());
  }
  s = Trim(s);
  if (s != "</function>") return InvalidArgument("no </function>");
  call.arguments = Dump(args);
  return call;
}

Result<ParsedCall> ParseDeepSeekCall(std::string_view body) {
  const size_t sep = body.find(kDeepSeekSep);
  if (sep == std::string_view::npos) return InvalidArgument("no tool separator");
  std::string_view rest = body.substr(sep + kDeepSeekSep.size());
  const size_t newline = rest.find('\n');
  if (newline == std::string_view::npos) return InvalidArgument("no newline after the name");
  ParsedCall call;
  call.name = std::string(Trim(rest.substr(0, newline)));
  if (call.name.empty()) return InvalidArgument("no name");
  std::string_view block = Trim(rest.substr(newline + 1));
  if (!block.starts_with("```json") || !block.ends_with("```") || block.size() < 10) {
    return InvalidArgument("the arguments are not in a ```json block");
  }
  block = block.substr(7, block.size() - 10);
  ASSIGN_OR_RETURN(ojson args, ParseJson(Trim(block)));
  if (!args.is_object()) return InvalidArgument("the arguments are not a JSON object");
  call.arguments = Dump(args);
  return call;
}

Result<std::vector<ParsedCall>> ParseLlama3Calls(std::string_view text) {
  std::string_view s = Trim(text);
  if (s.starts_with(kLlamaPythonTag)) s = Trim(s.substr(kLlamaPythonTag.size()));
  std::vector<ParsedCall> calls;
  while (!s.empty()) {
    // One object: its extent by brace depth outside strings.
    if (s.front() != '{') return InvalidArgument("a call does not start with '{'");
    size_t end = 0;
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < s.size() && end == 0; ++i) {
      const char c = s[i];
      if (in_string) {
        if (c == '\\') {
          ++i;
        } else if (c == '"') {
          in_string = false;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{') {
        ++depth;
      } else if (c == '}' && --depth == 0) {
        end = i + 1;
      }
    }
    if (end == 0) return InvalidArgument("an unterminated call");
    ASSIGN_OR_RETURN(ojson obj, ParseJson(s.substr(0, end)));
    ASSIGN_OR_RETURN(ParsedCall call, CallFromObject(obj, "parameters", "arguments"));
    calls.push_back(std::move(call));
    s = Trim(s.substr(end));
    if (s.starts_with(';')) s = Trim(s.substr(1));
  }
  if (calls.empty()) return InvalidArgument("no call");
  return calls;
}

}  // namespace pd::server
