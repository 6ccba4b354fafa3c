#include "server/structured_request.h"

#include <optional>
#include <vector>

namespace pd::server {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;
using constrain::StructuredOutput;
using Kind = StructuredOutput::Kind;

class Reader {
 public:
  Reader(const json& doc, std::string_view body) : doc_(doc), body_(body) {}

  Result<StructuredOutput> Read() {
    RETURN_IF_ERROR(ReadResponseFormat());
    RETURN_IF_ERROR(ReadGuided(doc_, {}, "guided_"));
    for (const char* group : {"structured_outputs", "guided_decoding"}) {
      auto it = doc_.find(group);
      if (it == doc_.end() || it->is_null()) continue;
      if (!it->is_object())
        return InvalidArgument(std::string("'") + group + "' must be an object");
      RETURN_IF_ERROR(ReadGuided(*it, {group}, ""));
    }
    if (found_.size() > 1)
      return InvalidArgument("only one structured output may be set, got '" + found_[0].field +
                             "' and '" + found_[1].field + "'");
    return found_.empty() ? StructuredOutput{} : found_[0];
  }

 private:
  // The value at `path` in the body parsed in member order, as JSON text.
  Result<std::string> OrderedDump(const std::vector<std::string>& path) {
    if (!ordered_) {
      try {
        ordered_ = ordered_json::parse(body_);
      } catch (const ordered_json::exception& e) {
        return InvalidArgument(std::string("request body is not valid JSON: ") + e.what());
      }
    }
    const ordered_json* v = &*ordered_;
    for (const std::string& key : path) v = &(*v)[key];
    return v->dump();
  }

  static std::string Join(const std::vector<std::string>& path) {
    std::string out;
    for (const std::string& p : path) out += (out.empty() ? "" : ".") + p;
    return out;
  }

  Status Add(Kind kind, std::string text, const std::vector<std::string>& path) {
    found_.push_back({kind, std::move(text), Join(path)});
    return OkStatus();
  }

  // A schema given as an object, or as JSON text (vLLM accepts both).
  Status AddSchema(const json& value, const std::vector<std::string>& path) {
    if (value.is_string()) {
      auto parsed = ordered_json::parse(value.get<std::string>(), nullptr, false);
      if (parsed.is_discarded())
        return InvalidArgument("'" + Join(path) + "' is not a valid JSON schema text");
      return Add(Kind::kJsonSchema, parsed.dump(), path);
    }
    if (!value.is_object() && !value.is_boolean())
      return InvalidArgument("'" + Join(path) + "' must be a JSON schema object");
    ASSIGN_OR_RETURN(std::string text, OrderedDump(path));
    return Add(Kind::kJsonSchema, std::move(text), path);
  }

  Status ReadResponseFormat() {
    auto rf = doc_.find("response_format");
    if (rf == doc_.end() || rf->is_null()) return OkStatus();
    if (!rf->is_object()) return InvalidArgument("'response_format' must be an object");
    auto type = rf->find("type");
    if (type == rf->end() || !type->is_string())
      return InvalidArgument("'response_format.type' must be a string");
    const std::string t = *type;
    if (t == "text") return OkStatus();
    if (t == "json_object") return Add(Kind::kJsonObject, "", {"response_format"});
    if (t != "json_schema")
      return InvalidArgument("'response_format.type' = \"" + t +
                             "\" is not supported (only \"text\", \"json_object\", "
                             "\"json_schema\")");
    auto js = rf->find("json_schema");
    if (js == rf->end() || !js->is_object())
      return InvalidArgument("'response_format.json_schema' must be an object");
    auto schema = js->find("schema");
    if (schema == js->end() || schema->is_null())
      return InvalidArgument("'response_format.json_schema.schema' is required");
    return AddSchema(*schema, {"response_format", "json_schema", "schema"});
  }

  // guided_json, guided_regex, ... at the top level (prefix "guided_"), or json, regex, ... inside
  // a structured_outputs / guided_decoding object.
  Status ReadGuided(const json& obj, std::vector<std::string> base, const std::string& prefix) {
    auto path = [&](const char* name) {
      std::vector<std::string> p = base;
      p.push_back(prefix + name);
      return p;
    };
    for (const char* refused : {"grammar", "whitespace_pattern", "structural_tag"}) {
      auto it = obj.find(prefix + refused);
      if (it != obj.end() && !it->is_null())
        return InvalidArgument("'" + Join(path(refused)) + "' is not supported");
    }
    if (auto it = obj.find(prefix + "json"); it != obj.end() && !it->is_null())
      RETURN_IF_ERROR(AddSchema(*it, path("json")));
    if (auto it = obj.find(prefix + "regex"); it != obj.end() && !it->is_null()) {
      if (!it->is_string())
        return InvalidArgument("'" + Join(path("regex")) + "' must be a string");
      RETURN_IF_ERROR(Add(Kind::kRegex, it->get<std::string>(), path("regex")));
    }
    if (auto it = obj.find(prefix + "choice"); it != obj.end() && !it->is_null()) {
      bool strings = it->is_array() && !it->empty();
      for (const json& c : *it) strings = strings && c.is_string();
      if (!strings)
        return InvalidArgument("'" + Join(path("choice")) +
                               "' must be a non-empty list of strings");
      RETURN_IF_ERROR(Add(Kind::kChoice, it->dump(), path("choice")));
    }
    if (prefix.empty()) {
      if (auto it = obj.find("json_object"); it != obj.end() && it->is_boolean() && it->get<bool>())
        RETURN_IF_ERROR(Add(Kind::kJsonObject, "", path("json_object")));
    }
    return OkStatus();
  }

  const json& doc_;
  std::string_view body_;
  std::optional<ordered_json> ordered_;
  std::vector<StructuredOutput> found_;
};

}  // namespace

Result<StructuredOutput> ParseStructuredOutput(const json& doc, std::string_view body) {
  return Reader(doc, body).Read();
}

}  // namespace pd::server
