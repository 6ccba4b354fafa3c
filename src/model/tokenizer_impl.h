// The byte-level BPE Tokenizer behind Tokenizer::Load / FromJson, and the chat template
// renderers it uses. Private to src/model.
#pragma once

#include <cstdint>
#include <memory>
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

  ChatTemplateKind chat_template = ChatTemplateKind::kNone;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  std::string bos_token;  // as configured, used by Llama-3's template
};

// Parses tokenizer.json into `data` (everything but the tokenizer_config.json fields).
Status ParseTokenizerJson(const std::string& text, const std::string& source, TokenizerData* data);
// Applies tokenizer_config.json: bos_token, eos_token, chat_template.
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
  ChatTemplateKind chat_template() const override { return data_->chat_template; }
  Result<std::string> ApplyChatTemplate(std::span<const ChatMessage> messages,
                                        bool add_generation_prompt) const override;

 private:
  bool Present(int32_t id) const;
  void EncodeText(std::string_view text, std::vector<int32_t>* ids) const;

  std::unique_ptr<TokenizerData> data_;
};

// Chat templates (chat_template.cc).
// The Jinja templates HF models ship for the two supported families, as written in
// tokenizer_config.json.
extern const char kChatMLJinjaTemplate[];
extern const char kLlama3JinjaTemplate[];
ChatTemplateKind DetectChatTemplate(std::string_view jinja_template);
std::string RenderChatML(std::span<const ChatMessage> messages, bool add_generation_prompt);
std::string RenderLlama3(std::span<const ChatMessage> messages, bool add_generation_prompt,
                         std::string_view bos_token);

}  // namespace pd::model::internal
