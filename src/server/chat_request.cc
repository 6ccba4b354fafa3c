#include "server/chat_request.h"

#include <cctype>
#include <string>

namespace pd::server {
namespace {

using ojson = nlohmann::ordered_json;

std::string TypeOf(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

Status WrongType(const std::string& field, std::string_view expected, const ojson& v) {
  return InvalidArgument("'" + field + "' must be " + std::string(expected) + ", got " + TypeOf(v));
}

// A string, null, or a list of {"type": "text", "text": ...} parts (joined).
Result<ojson> MessageContent(const ojson& content, const std::string& field) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) return WrongType(field, "a string or a list of text parts", content);
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const ojson& part = content[j];
    const std::string pf = field + "[" + std::to_string(j) + "]";
    if (!part.is_object()) return WrongType(pf, "an object", part);
    const auto type = part.find("type");
    if (type == part.end() || !type->is_string()) {
      return InvalidArgument("'" + pf + ".type' must be a string");
    }
    if (*type != "text") {
      return InvalidArgument("'" + pf + ".type' = \"" + type->get<std::string>() +
                             "\" is not supported (only \"text\")");
    }
    const auto t = part.find("text");
    if (t == part.end() || !t->is_string()) {
      return InvalidArgument("'" + pf + ".text' must be a string");
    }
    text += t->get<std::string>();
  }
  return ojson(text);
}

Status ParseMessage(const ojson& m, size_t i, ojson* out) {
  const std::string field = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return WrongType(field, "an object", m);
  const auto role = m.find("role");
  if (role == m.end() || !role->is_string()) {
    return InvalidArgument("'" + field + ".role' must be a string");
  }
  const std::string r = role->get<std::string>();
  if (r != "system" && r != "user" && r != "assistant" && r != "developer" && r != "tool") {
    return InvalidArgument("'" + field + ".role' = \"" + r + "\" is not a known role");
  }
  *out = m;  // every field (tool_calls, tool_call_id, name, reasoning_content) goes to the template
  const auto content = m.find("content");
  const bool has_tool_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
  if (has_tool_calls) {
    const ojson& calls = m["tool_calls"];
    if (!calls.is_array()) return WrongType(field + ".tool_calls", "a list", calls);
    for (size_t k = 0; k < calls.size(); ++k) {
      const std::string cf = field + ".tool_calls[" + std::to_string(k) + "]";
      if (!calls[k].is_object() || !calls[k].contains("function") ||
          !calls[k]["function"].is_object() || !calls[k]["function"].contains("name") ||
          !calls[k]["function"]["name"].is_string()) {
        return InvalidArgument("'" + cf +
                               "' must be {\"type\": \"function\", \"function\": "
                               "{\"name\": string, \"arguments\": string}}");
      }
    }
  }
  if (content == m.end()) {
    if (r != "assistant" || !has_tool_calls) {
      return InvalidArgument("'" + field + ".content' is required");
    }
    (*out)["content"] = nullptr;
    return OkStatus();
  }
  ASSIGN_OR_RETURN((*out)["content"], MessageContent(*content, field + ".content"));
  return OkStatus();
}

Result<ToolChoice> ParseToolChoice(const ojson& doc, const ojson& tools) {
  ToolChoice out;
  const auto choice = doc.find("tool_choice");
  if (choice == doc.end() || choice->is_null()) return out;
  const bool has_tools = tools.is_array() && !tools.empty();
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c == "none") {
      out.mode = ToolChoice::Mode::kNone;
    } else if (c == "required") {
      out.mode = ToolChoice::Mode::kRequired;
    } else if (c != "auto") {
      return InvalidArgument("'tool_choice' = \"" + c +
                             "\" is not one of \"auto\", \"none\", \"required\" or "
                             "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (out.mode == ToolChoice::Mode::kRequired && !has_tools) {
      return InvalidArgument("'tool_choice' = \"required\" needs 'tools'");
    }
    return out;
  }
  if (!choice->is_object()) {
    return WrongType("tool_choice", "a string or {\"type\": \"function\", ...}", *choice);
  }
  const auto type = choice->find("type");
  if (type == choice->end() || *type != "function") {
    return InvalidArgument("'tool_choice.type' must be \"function\"");
  }
  const auto fn = choice->find("function");
  if (fn == choice->end() || !fn->is_object() || !fn->contains("name") ||
      !(*fn)["name"].is_string()) {
    return InvalidArgument("'tool_choice.function.name' must be a string");
  }
  out.mode = ToolChoice::Mode::kFunction;
  out.function = (*fn)["name"].get<std::string>();
  bool found = false;
  for (const ojson& t : has_tools ? tools : ojson::array()) {
    found = found || t["function"]["name"] == out.function;
  }
  if (!found) {
    return InvalidArgument("'tool_choice.function.name' = \"" + out.function +
                           "\" is not the name of one of 'tools'");
  }
  return out;
}

// OpenAI's rule for function names: letters, digits, '_', '-' (and '.'), 1 to 64 of them.
bool ValidFunctionName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
      return false;
  }
  return true;
}

Status ParseTools(const ojson& doc, model::ChatInput* input) {
  const auto tools = doc.find("tools");
  if (tools == doc.end() || tools->is_null()) return OkStatus();
  if (!tools->is_array()) return WrongType("tools", "a list of tools", *tools);
  for (size_t i = 0; i < tools->size(); ++i) {
    const ojson& t = (*tools)[i];
    const std::string field = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return WrongType(field, "an object", t);
    const auto type = t.find("type");
    if (type == t.end() || !type->is_string() || *type != "function") {
      return InvalidArgument("'" + field + ".type' must be \"function\"");
    }
    const auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object())
      return InvalidArgument("'" + field + ".function' must be an object");
    const auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) {
      return InvalidArgument("'" + field + ".function.name' must be a string");
    }
    if (!ValidFunctionName(name->get<std::string>())) {
      return InvalidArgument("'" + field + ".function.name' = " + name->dump() +
                             " must be 1 to 64 letters, digits, '_', '-' or '.'");
    }
    const auto params = fn->find("parameters");
    if (params != fn->end() && !params->is_null()) {
      if (!params->is_object()) {
        return WrongType(field + ".function.parameters", "a JSON Schema object", *params);
      }
      const auto ptype = params->find("type");
      if (ptype != params->end() && *ptype != "object") {
        return InvalidArgument("'" + field + ".function.parameters.type' must be \"object\"");
      }
      const auto props = params->find("properties");
      if (props != params->end() && !props->is_object()) {
        return WrongType(field + ".function.parameters.properties", "an object", *props);
      }
    }
  }
  if (!tools->empty()) input->tools = *tools;
  return OkStatus();
}

}  // namespace

Result<model::ChatInput> ParseChatInput(std::string_view body, ToolChoice* tool_choice) {
  ojson doc;
  try {
    doc = ojson::parse(body);
  } catch (const ojson::exception& e) {
    return InvalidArgument(std::string("the body is not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) return InvalidArgument("the body must be a JSON object");
  model::ChatInput input;
  const auto messages = doc.find("messages");
  if (messages == doc.end() || messages->is_null())
    return InvalidArgument("'messages' is required");
  if (!messages->is_array()) return WrongType("messages", "a list of messages", *messages);
  if (messages->empty()) return InvalidArgument("'messages' must not be empty");
  for (size_t i = 0; i < messages->size(); ++i) {
    ojson m;
    RETURN_IF_ERROR(ParseMessage((*messages)[i], i, &m));
    input.messages.push_back(std::move(m));
  }
  RETURN_IF_ERROR(ParseTools(doc, &input));
  ASSIGN_OR_RETURN(ToolChoice choice, ParseToolChoice(doc, input.tools));
  if (tool_choice != nullptr) *tool_choice = std::move(choice);
  const auto agp = doc.find("add_generation_prompt");
  if (agp != doc.end() && !agp->is_null()) {
    if (!agp->is_boolean()) return WrongType("add_generation_prompt", "a boolean", *agp);
    input.add_generation_prompt = agp->get<bool>();
  }
  const auto kwargs = doc.find("chat_template_kwargs");
  if (kwargs != doc.end() && !kwargs->is_null()) {
    if (!kwargs->is_object()) return WrongType("chat_template_kwargs", "an object", *kwargs);
    input.template_kwargs = *kwargs;
  }
  return input;
}

}  // namespace pd::server
