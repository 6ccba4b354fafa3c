// HF pre-tokenizers of the byte-level BPE kind: Sequence, Split (behavior Isolated), ByteLevel
// (GPT-2's regex when use_regex), Digits. Cuts text into the words BPE then merges within.
//
// Thread safety: immutable after construction; Apply may run on many threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/tokenizer_regex.h"

namespace pd::model::internal {

class PreTokenizer {
 public:
  // No splitting at all: each text segment is one word.
  PreTokenizer() = default;
  // `node` is tokenizer.json's "pre_tokenizer" value (null allowed); `source` names the file.
  static Result<PreTokenizer> FromJson(const nlohmann::json& node, const std::string& source);
  // Split(pattern, Isolated) then ByteLevel(use_regex false): the Llama-3 / Qwen2 shape.
  static Result<PreTokenizer> SplitThenByteLevel(std::string_view pattern);

  // Appends the non-empty words of `text` (their concatenation is `text`, plus a space in front
  // of a word when a ByteLevel step has add_prefix_space).
  void Apply(std::string_view text, std::vector<std::string>* words) const;

 private:
  struct Step {
    std::shared_ptr<const RegexSplitter> regex;  // null: this step does not split
    bool add_prefix_space = false;
  };
  Status AddFromJson(const nlohmann::json& node, const std::string& where);

  std::vector<Step> steps_;
};

}  // namespace pd::model::internal
