// The byte-level BPE Tokenizer behind Tokenizer::Load / FromJson, and the chat template
// renderers it uses. Private to src/model.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/bpe.h"
#include "model/tokenizer.h"
#include "model/tokenizer_added.h"
#include "model/tokenizer_pretok.h"

namespace pd::model::internal {

// Everything tokenizer.json and tokenizer_config.json define, indexed by id.
struct TokenizerData {
  enum Flag : uint8_t { kPresent = 1, kSpecial = 2, kAdded = 4 };
  std::vector<std::string> token_strings;  // as written in tokenizer.json ("" for unused ids)
  std::vector<std::string> token_bytes;    // what the token decodes to
  std::vector<uint8_t> flags;              // Flag bits per id
  StringIdMap string_to_id;                // vocab and added tokens
  BpeModel bpe;
  PreTokenizer pre_tokenizer;
  AddedTokenMatcher added;

  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  bool add_bos_token = false;  // tokenizer_config.json's add_bos_token / the post-processor
  // The special token tokenizer.json's TemplateProcessing post-processor puts before a single
  // sequence ("<|begin_of_text|>" for Llama 3), "" if none.
  std::string post_processor_prefix;
  // The template variables tokenizer_config.json defines: bos_token, eos_token, ...,
  // additional_special_tokens.
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
  std::string config_chat_template;  // tokenizer_config.json's chat_template, "" if none
  std::string config_source;         // where it came from, for errors
  std::unique_ptr<ChatTemplate> chat_template;
};

// Parses tokenizer.json into `data` (everything but the tokenizer_config.json fields).
Status ParseTokenizerJson(const std::string& text, const std::string& source, TokenizerData* data);
// Applies tokenizer_config.json: special tokens, add_bos_token, the chat template's text.
Status ParseTokenizerConfig(const std::string& text, const std::string& source,
                            TokenizerData* data);

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(std::unique_ptr<TokenizerData> data) : data_(std::move(data)) {}
  TokenizerData& mutable_data() { return *data_; }

  std::vector<int32_t> Encode(std::string_view text) const override;
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special) const override;
  Result<std::string> TokenBytes(int32_t id) const override;
  std::string TokenString(int32_t id) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  int vocab_size() const override { return static_cast<int>(data_->flags.size()); }
  bool IsSpecial(int32_t id) const override;
  std::optional<int32_t> bos_token_id() const override { return data_->bos_id; }
  std::optional<int32_t> eos_token_id() const override { return data_->eos_id; }
  bool adds_bos_token() const override { return data_->add_bos_token; }
  const ChatTemplate* chat_template() const override { return data_->chat_template.get(); }
  Result<std::string> ApplyChatTemplate(const ChatInput& input) const override;

 private:
  bool Present(int32_t id) const;
  void EncodeText(std::string_view text, std::vector<int32_t>* ids) const;

  std::unique_ptr<TokenizerData> data_;
};

}  // namespace pd::model::internal
