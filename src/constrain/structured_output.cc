#include "constrain/structured_output.h"

#include <nlohmann/json.hpp>

namespace pd::constrain {

StructuredOutputCompiler::StructuredOutputCompiler(std::shared_ptr<const engine::TokenTexts> texts,
                                                   size_t cache_capacity,
                                                   const JsonSchemaOptions& schema_options)
    : texts_(std::move(texts)),
      trie_(std::make_shared<VocabTrie>(*texts_)),
      capacity_(std::max<size_t>(cache_capacity, 1)),
      schema_options_(schema_options) {}

size_t StructuredOutputCompiler::cache_size() const {
  MutexLock lock(&mu_);
  return lru_.size();
}

Result<std::shared_ptr<const engine::OutputConstraint>> StructuredOutputCompiler::CompileUncached(
    const StructuredOutput& spec) const {
  using Kind = StructuredOutput::Kind;
  RegexNode regex;
  switch (spec.kind) {
    case Kind::kNone:
      return std::shared_ptr<const engine::OutputConstraint>();
    case Kind::kJsonObject:  // any one JSON object, no prefix, no suffix
      return std::shared_ptr<const engine::OutputConstraint>(
          std::make_shared<engine::JsonCallConstraint>(texts_, std::vector<std::string>{""},
                                                       std::string()));
    case Kind::kJsonSchema: {
      nlohmann::ordered_json schema;
      try {
        schema = nlohmann::ordered_json::parse(spec.text);
      } catch (const nlohmann::ordered_json::exception& e) {
        return InvalidArgument(std::string("the schema is not valid JSON: ") + e.what());
      }
      ASSIGN_OR_RETURN(regex, JsonSchemaToRegex(schema, schema_options_));
      break;
    }
    case Kind::kRegex: {
      ASSIGN_OR_RETURN(regex, ParseRegex(spec.text));
      break;
    }
    case Kind::kChoice: {
      nlohmann::json choices = nlohmann::json::parse(spec.text, nullptr, false);
      if (!choices.is_array() || choices.empty())
        return InvalidArgument("must be a non-empty list of strings");
      std::string alternatives;
      for (const auto& c : choices) {
        if (!c.is_string()) return InvalidArgument("must be a non-empty list of strings");
        if (!alternatives.empty()) alternatives += '|';
        alternatives += EscapeRegex(c.get<std::string>());
      }
      ASSIGN_OR_RETURN(regex, ParseRegex(alternatives));
      break;
    }
  }
  ASSIGN_OR_RETURN(auto automaton, TokenAutomaton::Create(regex, texts_, trie_));
  return std::shared_ptr<const engine::OutputConstraint>(std::move(automaton));
}

Result<std::shared_ptr<const engine::OutputConstraint>> StructuredOutputCompiler::Compile(
    const StructuredOutput& spec) {
  if (spec.kind == StructuredOutput::Kind::kNone) return CompileUncached(spec);
  const std::string key = std::to_string(static_cast<int>(spec.kind)) + ":" + spec.text;
  {
    MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock: two requests racing on a new schema may both compile it.
  auto compiled = CompileUncached(spec);
  if (!compiled.ok()) {
    const std::string field = spec.field.empty() ? "" : "'" + spec.field + "': ";
    return InvalidArgument(field + compiled.status().message());
  }
  MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;
  lru_.emplace_front(key, *compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return *compiled;
}

}  // namespace pd::constrain
