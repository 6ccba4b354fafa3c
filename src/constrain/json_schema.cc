#include "constrain/json_schema.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace pd::constrain {
namespace {

using json = nlohmann::ordered_json;
using Kind = RegexNode::Kind;

constexpr int kMaxDepth = 64;

// A JSON string's character: anything but '"', '\' and controls, or an escape.
constexpr char kStringChar[] = R"(([^"\\\x00-\x1f]|\\(["\\/bfnrt]|u[0-9a-fA-F]{4})))";
constexpr char kInteger[] = R"(-?(0|[1-9][0-9]{0,15}))";
constexpr char kNumber[] = R"(-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][+-]?[0-9]{1,2})?)";
constexpr char kDate[] = R"([0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]))";
constexpr char kTime[] =
    R"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))";
constexpr char kUuid[] =
    R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})";

// A fixed fragment of this file: parsing it cannot fail.
RegexNode Frag(std::string_view regex) {
  auto node = ParseRegex(regex);
  PD_CHECK(node.ok()) << node.status().ToString();
  return std::move(node).value();
}
RegexNode Lit(std::string_view text) { return Frag(EscapeRegex(text)); }
RegexNode Seq(std::vector<RegexNode> parts) {
  RegexNode n;
  n.kind = Kind::kConcat;
  n.children = std::move(parts);
  return n;
}
RegexNode Alt(std::vector<RegexNode> parts) {
  if (parts.size() == 1) return std::move(parts[0]);
  RegexNode n;
  n.kind = Kind::kAlt;
  n.children = std::move(parts);
  return n;
}
RegexNode Rep(RegexNode child, int min, int max) {
  RegexNode n;
  n.kind = Kind::kRepeat;
  n.min = min;
  n.max = max;
  n.children.push_back(std::move(child));
  return n;
}

// The decimal integers of [lo, hi], both written with the same number of digits.
std::string SameLengthRange(const std::string& lo, const std::string& hi) {
  if (lo.size() == 1) return lo == hi ? lo : "[" + lo + "-" + hi + "]";
  const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
  if (lo[0] == hi[0]) return lo.substr(0, 1) + "(" + SameLengthRange(lo_rest, hi_rest) + ")";
  const std::string zeros(lo_rest.size(), '0'), nines(lo_rest.size(), '9');
  std::vector<std::string> parts;
  char first = lo[0], last = hi[0];
  if (lo_rest != zeros) {
    parts.push_back(lo.substr(0, 1) + "(" + SameLengthRange(lo_rest, nines) + ")");
    ++first;
  }
  if (hi_rest != nines) --last;
  if (first <= last) {
    const std::string lead =
        first == last ? std::string(1, first) : "[" + std::string(1, first) + "-" + last + "]";
    parts.push_back(lead + "[0-9]{" + std::to_string(lo_rest.size()) + "}");
  }
  if (hi_rest != nines)
    parts.push_back(hi.substr(0, 1) + "(" + SameLengthRange(zeros, hi_rest) + ")");
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "|") + p;
  return out;
}

// The decimal integers of [lo, hi], 0 <= lo <= hi, without leading zeros.
std::string NonNegativeRange(int64_t lo, int64_t hi) {
  std::string out;
  for (int64_t start = lo; start <= hi;) {
    const std::string digits = std::to_string(start);
    int64_t top = 9;  // the largest number with as many digits as start
    for (size_t i = 1; i < digits.size(); ++i) top = top * 10 + 9;
    const int64_t end = std::min(top, hi);
    out += (out.empty() ? "(" : "|(") + SameLengthRange(digits, std::to_string(end)) + ")";
    if (end == hi) break;
    start = end + 1;
  }
  return out;
}

// The integers of [lo, hi] as a regex.
std::string IntegerRange(int64_t lo, int64_t hi) {
  std::string out;
  if (lo < 0) out = "-(" + NonNegativeRange(std::max<int64_t>(1, -hi), -lo) + ")";
  if (hi >= 0) out += (out.empty() ? "" : "|") + NonNegativeRange(std::max<int64_t>(0, lo), hi);
  return out;
}

const std::set<std::string, std::less<>> kAnnotations = {
    "title",    "description", "default",  "examples",  "$schema", "$id",
    "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
const std::set<std::string, std::less<>> kKeywords = {"type",
                                                      "properties",
                                                      "required",
                                                      "additionalProperties",
                                                      "enum",
                                                      "const",
                                                      "anyOf",
                                                      "oneOf",
                                                      "allOf",
                                                      "items",
                                                      "minItems",
                                                      "maxItems",
                                                      "minLength",
                                                      "maxLength",
                                                      "pattern",
                                                      "format",
                                                      "$ref",
                                                      "minimum",
                                                      "maximum",
                                                      "exclusiveMinimum",
                                                      "exclusiveMaximum"};

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const JsonSchemaOptions& o) : root_(root), options_(o) {}

  Result<RegexNode> Value(const json& schema, const std::string& path, int depth) {
    if (depth > kMaxDepth) return Error(path, "schema nested more than 64 levels deep");
    if (schema.is_boolean() || (schema.is_object() && Meaningful(schema) == 0))
      return Error(path, "a schema that allows any value is not supported");
    if (!schema.is_object()) return Error(path, "a schema must be an object");
    for (const auto& [key, value] : schema.items()) {
      if (!kKeywords.contains(key) && !kAnnotations.contains(key))
        return Error(path, "unsupported JSON schema keyword '" + key + "'");
    }
    if (schema.contains("$ref")) return Ref(schema, path, depth);
    if (schema.contains("const")) return Lit(schema["const"].dump());
    if (schema.contains("enum")) return Enum(schema, path);
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      if (schema.contains(key)) return Combined(schema, key, path, depth);
    }
    return Typed(schema, path, depth);
  }

 private:
  static Status Error(const std::string& path, const std::string& what) {
    return InvalidArgument(what + " at " + path);
  }
  static int Meaningful(const json& schema) {
    return static_cast<int>(
        std::count_if(schema.items().begin(), schema.items().end(),
                      [](const auto& kv) { return !kAnnotations.contains(kv.key()); }));
  }
  RegexNode Ws() const { return Rep(Frag("[ \\t\\n\\r]"), 0, options_.max_whitespace); }

  Result<RegexNode> Ref(const json& schema, const std::string& path, int depth) {
    if (Meaningful(schema) != 1)
      return Error(path, "'$ref' beside other keywords is not supported");
    if (!schema["$ref"].is_string()) return Error(path, "'$ref' must be a string");
    const std::string ref = schema["$ref"];
    if (!ref.starts_with("#/")) return Error(path, "'$ref' = \"" + ref + "\" (only #/... refs)");
    if (std::find(refs_.begin(), refs_.end(), ref) != refs_.end())
      return Error(path, "recursive '$ref' \"" + ref + "\" is not supported");
    const json* target = nullptr;
    try {
      target = &root_.at(json::json_pointer(ref.substr(1)));
    } catch (const json::exception&) {
      return Error(path, "'$ref' \"" + ref + "\" points nowhere");
    }
    refs_.push_back(ref);
    auto node = Value(*target, ref, depth + 1);
    refs_.pop_back();
    return node;
  }

  Result<RegexNode> Enum(const json& schema, const std::string& path) {
    const json& values = schema["enum"];
    if (!values.is_array() || values.empty())
      return Error(path, "'enum' must be a non-empty array");
    std::vector<RegexNode> alts;
    for (const json& v : values) alts.push_back(Lit(v.dump()));
    return Alt(std::move(alts));
  }

  Result<RegexNode> Combined(const json& schema, const char* key, const std::string& path,
                             int depth) {
    if (Meaningful(schema) != 1)
      return Error(path, std::string("'") + key + "' beside other keywords is not supported");
    const json& subs = schema[key];
    if (!subs.is_array() || subs.empty())
      return Error(path, std::string("'") + key + "' must be a non-empty array");
    if (std::string_view(key) == "allOf" && subs.size() != 1)
      return Error(path, "'allOf' with more than one schema is not supported");
    std::vector<RegexNode> alts;
    for (size_t i = 0; i < subs.size(); ++i) {
      ASSIGN_OR_RETURN(RegexNode n,
                       Value(subs[i], path + "/" + key + "/" + std::to_string(i), depth + 1));
      alts.push_back(std::move(n));
    }
    return Alt(std::move(alts));
  }

  Result<std::vector<std::string>> Types(const json& schema, const std::string& path) {
    std::vector<std::string> types;
    if (schema.contains("type")) {
      const json& t = schema["type"];
      if (t.is_string()) types.push_back(t);
      if (t.is_array()) {
        for (const json& x : t) {
          if (!x.is_string()) return Error(path, "'type' must be a string or a list of strings");
          types.push_back(x);
        }
      }
      if (types.empty()) return Error(path, "'type' must be a string or a list of strings");
    } else if (schema.contains("properties")) {
      types.push_back("object");
    } else if (schema.contains("items")) {
      types.push_back("array");
    } else if (schema.contains("pattern") || schema.contains("format") ||
               schema.contains("minLength") || schema.contains("maxLength")) {
      types.push_back("string");
    } else {
      return Error(path, "a schema without 'type' is not supported");
    }
    return types;
  }

  Result<RegexNode> Typed(const json& schema, const std::string& path, int depth) {
    ASSIGN_OR_RETURN(std::vector<std::string> types, Types(schema, path));
    std::vector<RegexNode> alts;
    for (const std::string& type : types) {
      if (type == "object") {
        ASSIGN_OR_RETURN(RegexNode n, Object(schema, path, depth));
        alts.push_back(std::move(n));
      } else if (type == "array") {
        ASSIGN_OR_RETURN(RegexNode n, Array(schema, path, depth));
        alts.push_back(std::move(n));
      } else if (type == "string") {
        ASSIGN_OR_RETURN(RegexNode n, String(schema, path));
        alts.push_back(std::move(n));
      } else if (type == "number") {
        for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
          if (schema.contains(key))
            return Error(
                path, std::string("'") + key + "' is supported on integers only, not on numbers");
        }
        alts.push_back(Frag(kNumber));
      } else if (type == "integer") {
        ASSIGN_OR_RETURN(RegexNode n, Integer(schema, path));
        alts.push_back(std::move(n));
      } else if (type == "boolean") {
        alts.push_back(Frag("true|false"));
      } else if (type == "null") {
        alts.push_back(Lit("null"));
      } else {
        return Error(path, "unknown 'type' \"" + type + "\"");
      }
    }
    return Alt(std::move(alts));
  }

  Result<int> Count(const json& schema, const char* key, const std::string& path, int dflt) {
    if (!schema.contains(key)) return dflt;
    const json& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxRepeat)
      return Error(path, std::string("'") + key + "' must be an integer in [0, " +
                             std::to_string(kMaxRepeat) + "]");
    return v.get<int>();
  }

  Result<RegexNode> Integer(const json& schema, const std::string& path);
  Result<RegexNode> Object(const json& schema, const std::string& path, int depth);
  Result<RegexNode> Array(const json& schema, const std::string& path, int depth);
  Result<RegexNode> String(const json& schema, const std::string& path);

  const json& root_;
  JsonSchemaOptions options_;
  std::vector<std::string> refs_;  // the $refs being expanded, outermost first
};

// minimum / maximum (and their exclusive forms) bound the integer; without them it has at most 16
// digits.
Result<RegexNode> SchemaCompiler::Integer(const json& schema, const std::string& path) {
  constexpr int64_t kLimit = 9999999999999999;  // 16 digits
  int64_t lo = -kLimit, hi = kLimit;
  bool bounded = false;
  for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
    if (!schema.contains(key)) continue;
    const json& v = schema[key];
    if (!v.is_number() || std::fabs(v.get<double>()) > static_cast<double>(kLimit))
      return Error(path, std::string("'") + key + "' must be a number of at most 16 digits");
    const double x = v.get<double>();
    const std::string_view k = key;
    if (k == "minimum") lo = std::max(lo, static_cast<int64_t>(std::ceil(x)));
    if (k == "exclusiveMinimum") lo = std::max(lo, static_cast<int64_t>(std::floor(x)) + 1);
    if (k == "maximum") hi = std::min(hi, static_cast<int64_t>(std::floor(x)));
    if (k == "exclusiveMaximum") hi = std::min(hi, static_cast<int64_t>(std::ceil(x)) - 1);
    bounded = true;
  }
  if (!bounded) return Frag(kInteger);
  if (lo > hi) return Error(path, "no integer lies between the minimum and the maximum");
  return Frag(IntegerRange(lo, hi));
}

// Members in the schema's order, required ones always, optional ones maybe: after(i, first) is
// the text of members i.. given whether none was written yet (then no comma leads).
Result<RegexNode> SchemaCompiler::Object(const json& schema, const std::string& path, int depth) {
  if (schema.contains("additionalProperties") && schema["additionalProperties"] != json(false))
    return Error(path, "'additionalProperties' other than false is not supported");
  const json empty = json::object();
  const json& props = schema.contains("properties") ? schema["properties"] : empty;
  if (!props.is_object()) return Error(path, "'properties' must be an object");
  std::set<std::string> required;
  if (schema.contains("required")) {
    if (!schema["required"].is_array()) return Error(path, "'required' must be an array");
    for (const json& r : schema["required"]) {
      if (!r.is_string() || !props.contains(r.get<std::string>()))
        return Error(path, "required property " + r.dump() + " is not in 'properties'");
      required.insert(r.get<std::string>());
    }
  }
  std::vector<RegexNode> members;
  std::vector<bool> is_required;
  for (const auto& [name, sub] : props.items()) {
    ASSIGN_OR_RETURN(RegexNode value, Value(sub, path + "/properties/" + name, depth + 1));
    members.push_back(Seq({Lit(json(name).dump()), Ws(), Lit(":"), Ws(), std::move(value)}));
    is_required.push_back(required.contains(name));
  }
  const RegexNode comma = Seq({Ws(), Lit(","), Ws()});
  RegexNode after_some;  // after(i, false)
  RegexNode after_none;  // after(i, true)
  for (size_t i = members.size(); i-- > 0;) {
    RegexNode with_comma = Seq({comma, members[i], after_some});
    RegexNode first = Seq({members[i], after_some});
    if (is_required[i]) {
      after_some = std::move(with_comma);
      after_none = std::move(first);
    } else {
      after_some = Seq({Rep(Seq({comma, members[i]}), 0, 1), after_some});
      after_none = Alt({std::move(first), after_none});
    }
  }
  return Seq({Lit("{"), Ws(), std::move(after_none), Ws(), Lit("}")});
}

Result<RegexNode> SchemaCompiler::Array(const json& schema, const std::string& path, int depth) {
  if (!schema.contains("items")) return Error(path, "an array without 'items' is not supported");
  ASSIGN_OR_RETURN(RegexNode item, Value(schema["items"], path + "/items", depth + 1));
  ASSIGN_OR_RETURN(int min, Count(schema, "minItems", path, 0));
  ASSIGN_OR_RETURN(int max, Count(schema, "maxItems", path, -1));
  if (max >= 0 && max < min) return Error(path, "'maxItems' is below 'minItems'");
  if (max == 0) return Seq({Lit("["), Ws(), Lit("]")});
  RegexNode more =
      Rep(Seq({Ws(), Lit(","), Ws(), item}), std::max(min - 1, 0), max < 0 ? -1 : max - 1);
  RegexNode items = Seq({item, std::move(more)});
  if (min == 0) items = Rep(std::move(items), 0, 1);
  return Seq({Lit("["), Ws(), std::move(items), Ws(), Lit("]")});
}

Result<RegexNode> SchemaCompiler::String(const json& schema, const std::string& path) {
  ASSIGN_OR_RETURN(int min, Count(schema, "minLength", path, 0));
  ASSIGN_OR_RETURN(int max, Count(schema, "maxLength", path, -1));
  if (max >= 0 && max < min) return Error(path, "'maxLength' is below 'minLength'");
  const bool lengths = schema.contains("minLength") || schema.contains("maxLength");
  if (schema.contains("format")) {
    if (lengths || schema.contains("pattern"))
      return Error(path, "'format' beside 'pattern', 'minLength' or 'maxLength' is not supported");
    const json& f = schema["format"];
    const std::string format = f.is_string() ? f.get<std::string>() : f.dump();
    std::string body;
    if (format == "date") body = kDate;
    if (format == "time") body = kTime;
    if (format == "date-time") body = std::string(kDate) + "T" + kTime;
    if (format == "uuid") body = kUuid;
    if (body.empty()) return Error(path, "unsupported 'format' \"" + format + "\"");
    return Seq({Lit("\""), Frag(body), Lit("\"")});
  }
  if (schema.contains("pattern")) {
    if (lengths) return Error(path, "'pattern' beside 'minLength' or 'maxLength' is not supported");
    if (!schema["pattern"].is_string()) return Error(path, "'pattern' must be a string");
    const std::string pattern = schema["pattern"];
    RegexOptions options;
    options.json_string_chars = true;
    auto parsed = ParseRegex(pattern, options);
    if (!parsed.ok()) return Error(path + "/pattern", parsed.status().message());
    // A search: an end without its anchor may hold anything a string may.
    const RegexNode free = Rep(Frag(R"([^"\\\x00-\x1f])"), 0, -1);
    bool end_anchor = false;
    if (pattern.ends_with("$")) {  // and not an escaped '\$'
      size_t slashes = 0;
      for (size_t i = pattern.size() - 1; i > 0 && pattern[i - 1] == '\\'; --i) ++slashes;
      end_anchor = slashes % 2 == 0;
    }
    std::vector<RegexNode> parts = {Lit("\"")};
    if (!pattern.starts_with("^")) parts.push_back(free);
    parts.push_back(std::move(parsed).value());
    if (!end_anchor) parts.push_back(free);
    parts.push_back(Lit("\""));
    return Seq(std::move(parts));
  }
  return Seq({Lit("\""), Rep(Frag(kStringChar), min, max), Lit("\"")});
}

}  // namespace

Result<RegexNode> JsonSchemaToRegex(const json& schema, const JsonSchemaOptions& options) {
  if (options.max_whitespace < 0 || options.max_whitespace > kMaxRepeat)
    return InvalidArgument("JSON schema: max_whitespace out of range");
  return SchemaCompiler(schema, options).Value(schema, "#", 0);
}

}  // namespace pd::constrain
