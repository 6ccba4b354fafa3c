// Tokenizer: HF tokenizer.json byte-level BPE (GPT-2 / Llama-3 / Qwen2 kind).
//
// Encode: added tokens are cut out of the text first (leftmost-longest literal match), each
// remaining segment goes through the pre-tokenizer (Split regexes via PCRE2 with UTF + UCP, and
// ByteLevel), and each word through BPE merges by rank. Decode concatenates each token's bytes
// (byte-level tokens through GPT-2's byte decoder, added tokens as written), so
// Decode(Encode(s)) == s for any s, invalid UTF-8 included (unless a ByteLevel step has
// add_prefix_space, which puts a space in front of each segment as HF does).
//
// Supported: model.type BPE (merges as "a b" or [a, b], ignore_merges); pre-tokenizers
// Sequence, Split (Isolated, not inverted), ByteLevel (add_prefix_space, use_regex), Digits;
// normalizer null or NFC. Not applied: the NFC normalizer (accepted; text that already is NFC,
// as nearly all text is, tokenizes the same), post_processor (Encode never adds BOS/EOS: chat
// templates and callers do), decoder options, dropout, and added tokens' lstrip/rstrip/
// single_word flags (false in the supported families).
#include "model/tokenizer.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "model/tokenizer_impl.h"

namespace pd::model {
namespace internal {

bool BpeTokenizer::Present(int32_t id) const {
  return id >= 0 && id < vocab_size() && (data_->flags[id] & TokenizerData::kPresent);
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return Present(id) && (data_->flags[id] & TokenizerData::kSpecial);
}

void BpeTokenizer::EncodeText(std::string_view text, std::vector<int32_t>* ids) const {
  std::vector<std::string> words;
  data_->pre_tokenizer.Apply(text, &words);
  for (const std::string& word : words) data_->bpe.EncodeWord(word, ids);
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedTokenMatcher::Match match = data_->added.Find(text, pos);
    if (match.id < 0) {
      EncodeText(text.substr(pos), &ids);
      break;
    }
    if (match.pos > pos) EncodeText(text.substr(pos, match.pos - pos), &ids);
    ids.push_back(match.id);
    pos = match.pos + match.size;
  }
  return ids;
}

Result<std::string> BpeTokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (!Present(id)) {
      return OutOfRange("Decode: id " + std::to_string(id) + " at position " + std::to_string(i) +
                        " is not in the vocabulary (vocab_size " + std::to_string(vocab_size()) +
                        ")");
    }
    if (skip_special && (data_->flags[id] & TokenizerData::kSpecial)) continue;
    text += data_->token_bytes[id];
  }
  return text;
}

Result<std::string> BpeTokenizer::TokenBytes(int32_t id) const {
  if (!Present(id)) {
    return OutOfRange("TokenBytes: id " + std::to_string(id) + " is not in the vocabulary");
  }
  return data_->token_bytes[id];
}

std::string BpeTokenizer::TokenString(int32_t id) const {
  return Present(id) ? data_->token_strings[id] : std::string();
}

std::optional<int32_t> BpeTokenizer::TokenToId(std::string_view token) const {
  const auto it = data_->string_to_id.find(token);
  if (it == data_->string_to_id.end()) return std::nullopt;
  return it->second;
}

Result<std::string> BpeTokenizer::ApplyChatTemplate(std::span<const ChatMessage> messages,
                                                    bool add_generation_prompt) const {
  switch (data_->chat_template) {
    case ChatTemplateKind::kChatML:
      return RenderChatML(messages, add_generation_prompt);
    case ChatTemplateKind::kLlama3:
      return RenderLlama3(messages, add_generation_prompt,
                          data_->bos_token.empty() ? "<|begin_of_text|>" : data_->bos_token);
    case ChatTemplateKind::kNone:
      break;
  }
  return FailedPrecondition(
      "this model has no supported chat template (tokenizer_config.json's chat_template must be "
      "ChatML (<|im_start|>) or Llama-3's (<|start_header_id|>)); send a raw prompt instead");
}

namespace {

using nlohmann::json;

// bos_token / eos_token: a string, {"content": string, ...} or null.
Result<std::optional<std::string>> SpecialTokenField(const json& root, const char* key,
                                                     const std::string& source) {
  const auto it = root.find(key);
  if (it == root.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return std::optional<std::string>((*it)["content"].get<std::string>());
  }
  return InvalidArgument(source + ": " + key + " must be a string or {\"content\": string}");
}

// chat_template: a string, or a list of {"name", "template"} (the "default" one is used).
std::string ChatTemplateText(const json& root) {
  const auto it = root.find("chat_template");
  if (it == root.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return "";
  std::string first;
  for (const json& entry : *it) {
    if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string()) {
      continue;
    }
    if (entry.value("name", std::string()) == "default")
      return entry["template"].get<std::string>();
    if (first.empty()) first = entry["template"].get<std::string>();
  }
  return first;
}

Status ParseConfigRoot(const json& root, const std::string& source, TokenizerData* data) {
  if (!root.is_object()) return InvalidArgument(source + ": top level is not a JSON object");
  for (const char* key : {"bos_token", "eos_token"}) {
    ASSIGN_OR_RETURN(std::optional<std::string> token, SpecialTokenField(root, key, source));
    if (!token.has_value()) continue;
    const auto it = data->string_to_id.find(*token);
    if (it == data->string_to_id.end()) {
      return InvalidArgument(source + ": " + key + " '" + *token +
                             "' is not a token of tokenizer.json");
    }
    if (std::string_view(key) == "bos_token") {
      data->bos_id = it->second;
      data->bos_token = *token;
    } else {
      data->eos_id = it->second;
    }
  }
  data->chat_template = DetectChatTemplate(ChatTemplateText(root));
  return OkStatus();
}

}  // namespace

Status ParseTokenizerConfig(const std::string& text, const std::string& source,
                            TokenizerData* data) {
  try {
    return ParseConfigRoot(json::parse(text), source, data);
  } catch (const json::exception& e) {
    return InvalidArgument(source + ": malformed JSON: " + e.what());
  }
}

}  // namespace internal

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const std::string& tokenizer_json,
                                                       const std::string& source) {
  auto data = std::make_unique<internal::TokenizerData>();
  RETURN_IF_ERROR(internal::ParseTokenizerJson(tokenizer_json, source, data.get()));
  return std::unique_ptr<Tokenizer>(new internal::BpeTokenizer(std::move(data)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir) {
  const std::string json_path = model_dir + "/tokenizer.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(json_path));
  auto data = std::make_unique<internal::TokenizerData>();
  RETURN_IF_ERROR(internal::ParseTokenizerJson(text, json_path, data.get()));
  const std::string config_path = model_dir + "/tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    ASSIGN_OR_RETURN(std::string config_text, ReadFileToString(config_path));
    RETURN_IF_ERROR(internal::ParseTokenizerConfig(config_text, config_path, data.get()));
  }
  return std::unique_ptr<Tokenizer>(new internal::BpeTokenizer(std::move(data)));
}

}  // namespace pd::model
