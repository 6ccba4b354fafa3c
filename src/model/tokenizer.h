// Hugging Face tokenizer.json byte-level BPE (GPT-2 / Llama-3 / Qwen kind) and chat templates.
//
// Thread safety: immutable after Load; Encode/Decode may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "model/config.h"

namespace pd::model {

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" | ...
  std::string content;
};

enum class ChatTemplateKind { kNone, kChatML, kLlama3 };

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, if present, DIR/tokenizer_config.json (chat template, bos/eos).
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir);
  // Parses tokenizer.json text; `source` names it in errors.
  static Result<std::unique_ptr<Tokenizer>> FromJson(const std::string& tokenizer_json,
                                                     const std::string& source);
  virtual ~Tokenizer() = default;

  // Text to ids. Added/special tokens written literally in the text (e.g. "<|im_end|>") become
  // their ids; everything else goes through the pre-tokenizer and BPE merges.
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // Ids to text: byte-exact inverse of Encode (special tokens included unless skip_special).
  // Ids outside the vocabulary are an error.
  virtual Result<std::string> Decode(std::span<const int32_t> ids,
                                     bool skip_special = false) const = 0;
  // The raw bytes of one token (for streaming: concatenating pieces gives Decode's result).
  virtual Result<std::string> TokenBytes(int32_t id) const = 0;
  // The token's string as written in tokenizer.json's vocab (for logprob output).
  virtual std::string TokenString(int32_t id) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual int vocab_size() const = 0;  // highest id + 1
  virtual bool IsSpecial(int32_t id) const = 0;
  virtual std::optional<int32_t> bos_token_id() const = 0;
  virtual std::optional<int32_t> eos_token_id() const = 0;

  virtual ChatTemplateKind chat_template() const = 0;
  // Renders messages with the model's template (ChatML or Llama-3), adding the assistant header
  // when add_generation_prompt. FailedPrecondition when the model has no supported template.
  virtual Result<std::string> ApplyChatTemplate(std::span<const ChatMessage> messages,
                                                bool add_generation_prompt) const = 0;
};

// Writes a working byte-level BPE tokenizer.json and tokenizer_config.json with exactly
// `vocab_size` ids (bytes, learned merges, then the arch's special tokens at the top), the
// chat template of the arch (ChatML for qwen2/qwen3, Llama-3's for llama), in HF's format.
Status WriteSyntheticTokenizer(const std::string& model_dir, Arch arch, int vocab_size);

}  // namespace pd::model
