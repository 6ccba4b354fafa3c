// Structured outputs: what a request asks its output to be (OpenAI's response_format, vLLM's
// guided_json / guided_regex / guided_choice) compiled into an engine::OutputConstraint, with a
// bounded LRU cache of compiled constraints keyed by kind and text, so that requests repeating a
// schema share one automaton (and its cached masks, token_automaton.h).
#pragma once

#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/mutex.h"
#include "common/status.h"
#include "constrain/json_schema.h"
#include "constrain/token_automaton.h"
#include "engine/output_constraint.h"

namespace pd::constrain {

struct StructuredOutput {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kChoice };
  Kind kind = Kind::kNone;
  // kJsonSchema: the schema as JSON text (member order kept: it is the order properties are
  // written in); kRegex: the pattern; kChoice: the choices as a JSON array of strings.
  std::string text;
  std::string field;  // the request field it came from, named in errors ("guided_json")
};

// Thread safety: thread-safe; the cache is guarded by mu_.
class StructuredOutputCompiler {
 public:
  explicit StructuredOutputCompiler(std::shared_ptr<const engine::TokenTexts> texts,
                                    size_t cache_capacity = 64,
                                    const JsonSchemaOptions& schema_options = {});

  // InvalidArgument names the field and the problem ("'guided_regex': regex: unsupported
  // back-reference '\1' at offset 3 of ..."). kNone gives null.
  Result<std::shared_ptr<const engine::OutputConstraint>> Compile(const StructuredOutput& spec);

  const std::shared_ptr<const engine::TokenTexts>& texts() const { return texts_; }
  size_t cache_size() const;

 private:
  Result<std::shared_ptr<const engine::OutputConstraint>> CompileUncached(
      const StructuredOutput& spec) const;

  const std::shared_ptr<const engine::TokenTexts> texts_;
  const std::shared_ptr<const VocabTrie> trie_;
  const size_t capacity_;
  const JsonSchemaOptions schema_options_;

  using Entry = std::pair<std::string, std::shared_ptr<const engine::OutputConstraint>>;
  mutable Mutex mu_;
  std::list<Entry> lru_ GUARDED_BY(mu_);  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_ GUARDED_BY(mu_);
};

}  // namespace pd::constrain
