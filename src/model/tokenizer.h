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
#include "model/chat_template.h"
#include "model/config.h"

namespace pd::model {

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, if present, DIR/tokenizer_config.json (special tokens, chat
  // template). The chat template is, first found: `chat_template_file` (when not empty),
  // DIR/chat_template.jinja, tokenizer_config.json's chat_template (a string, or HF's list of
  // {name, template} whose "default" entry is used). It parses here: a malformed one fails Load.
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir,
                                                 const std::string& chat_template_file = "");
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

  // Whether a raw prompt gets bos prepended, as HF's tokenizer does (tokenizer_config.json's
  // add_bos_token, or a post-processor that starts with bos, as Llama 3's).
  virtual bool adds_bos_token() const = 0;
  // The checkpoint's chat template; nullptr when it has none.
  virtual const ChatTemplate* chat_template() const = 0;
  // Renders a chat with the checkpoint's template. FailedPrecondition when there is none;
  // InvalidArgument when the template raises or fails.
  virtual Result<std::string> ApplyChatTemplate(const ChatInput& input) const = 0;
};

// Writes a working byte-level BPE tokenizer.json and tokenizer_config.json with exactly
// `vocab_size` ids (bytes, learned merges, then the arch's special tokens at the top), the
// chat template of the arch (ChatML for qwen2/qwen3/qwen3_moe, Llama-3's for llama, DeepSeek-V3's
// for deepseek_v3), in HF's format. Llama's and DeepSeek's add bos to raw prompts
// (add_bos_token), Qwen's do not.
Status WriteSyntheticTokenizer(const std::string& model_dir, Arch arch, int vocab_size);
// The ids WriteSyntheticTokenizer gives the arch's bos and eos tokens (config.json's ids).
struct SpecialTokenIds {
  int bos = -1;
  int eos = -1;
};
SpecialTokenIds SyntheticSpecialTokenIds(Arch arch, int vocab_size);

}  // namespace pd::model
