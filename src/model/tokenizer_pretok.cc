#include "model/tokenizer_pretok.h"

#include <cctype>

namespace pd::model::internal {
namespace {

using nlohmann::json;

bool BoolField(const json& node, const char* key, bool default_value) {
  auto it = node.find(key);
  if (it == node.end() || it->is_null()) return default_value;
  return it->is_boolean() ? it->get<bool>() : default_value;
}

// A literal string as a PCRE2 pattern: ASCII punctuation is escaped, everything else is literal.
std::string EscapeLiteral(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

Result<std::shared_ptr<const RegexSplitter>> Compile(std::string_view pattern,
                                                     const std::string& where) {
  auto splitter = RegexSplitter::Create(pattern);
  if (!splitter.ok()) return InvalidArgument(where + ": " + splitter.status().message());
  return std::shared_ptr<const RegexSplitter>(std::move(splitter).value());
}

}  // namespace

Result<PreTokenizer> PreTokenizer::FromJson(const json& node, const std::string& source) {
  PreTokenizer pre_tokenizer;
  if (node.is_null()) return pre_tokenizer;
  RETURN_IF_ERROR(pre_tokenizer.AddFromJson(node, source + ": pre_tokenizer"));
  return pre_tokenizer;
}

Result<PreTokenizer> PreTokenizer::SplitThenByteLevel(std::string_view pattern) {
  PreTokenizer pre_tokenizer;
  ASSIGN_OR_RETURN(auto regex, Compile(pattern, "pre_tokenizer Split"));
  pre_tokenizer.steps_.push_back(Step{std::move(regex), false});
  return pre_tokenizer;
}

Status PreTokenizer::AddFromJson(const json& node, const std::string& where) {
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
    return InvalidArgument(where + ": expected an object with a string 'type'");
  }
  const std::string type = node["type"].get<std::string>();
  if (type == "Sequence") {
    const auto it = node.find("pretokenizers");
    if (it == node.end() || !it->is_array()) {
      return InvalidArgument(where + ": Sequence needs a 'pretokenizers' array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      RETURN_IF_ERROR(AddFromJson((*it)[i], where + ".pretokenizers[" + std::to_string(i) + "]"));
    }
    return OkStatus();
  }
  if (type == "ByteLevel") {
    // HF's defaults: add_prefix_space true, use_regex true.
    Step step;
    step.add_prefix_space = BoolField(node, "add_prefix_space", true);
    if (BoolField(node, "use_regex", true)) {
      ASSIGN_OR_RETURN(step.regex, Compile(kGpt2SplitPattern, where + " ByteLevel"));
    }
    steps_.push_back(std::move(step));
    return OkStatus();
  }
  if (type == "Digits") {
    const bool individual = BoolField(node, "individual_digits", false);
    ASSIGN_OR_RETURN(auto regex, Compile(individual ? R"(\p{N})" : R"(\p{N}+)", where));
    steps_.push_back(Step{std::move(regex), false});
    return OkStatus();
  }
  if (type != "Split") {
    return InvalidArgument(where + ": type '" + type +
                           "' is not supported (Sequence, Split, ByteLevel, Digits only)");
  }
  const std::string behavior = node.value("behavior", std::string("Isolated"));
  if (behavior != "Isolated") {
    return InvalidArgument(where + ": Split behavior '" + behavior +
                           "' is not supported (Isolated only)");
  }
  if (BoolField(node, "invert", false)) {
    return InvalidArgument(where + ": Split with invert true is not supported");
  }
  const auto pattern = node.find("pattern");
  std::string regex_text;
  if (pattern != node.end() && pattern->is_object() && pattern->contains("Regex") &&
      (*pattern)["Regex"].is_string()) {
    regex_text = (*pattern)["Regex"].get<std::string>();
  } else if (pattern != node.end() && pattern->is_object() && pattern->contains("String") &&
             (*pattern)["String"].is_string()) {
    regex_text = EscapeLiteral((*pattern)["String"].get<std::string>());
  } else {
    return InvalidArgument(where + ": Split needs a pattern {\"Regex\": ...} or {\"String\": ...}");
  }
  ASSIGN_OR_RETURN(auto regex, Compile(regex_text, where + " Split pattern"));
  steps_.push_back(Step{std::move(regex), false});
  return OkStatus();
}

void PreTokenizer::Apply(std::string_view text, std::vector<std::string>* words) const {
  if (text.empty()) return;
  std::vector<std::string> current;
  current.emplace_back(text);
  std::vector<std::string> next;
  std::vector<std::string_view> parts;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string& piece : current) {
      if (step.add_prefix_space && piece[0] != ' ') piece.insert(piece.begin(), ' ');
      if (step.regex == nullptr) {
        next.push_back(std::move(piece));
        continue;
      }
      parts.clear();
      step.regex->Split(piece, &parts);
      for (std::string_view part : parts) next.emplace_back(part);
    }
    current.swap(next);
  }
  for (std::string& word : current) words->push_back(std::move(word));
}

}  // namespace pd::model::internal
