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

Result<std::string> BpeTokenizer::ApplyChatTemplate(const ChatInput& input) const {
  if (data_->chat_template == nullptr) {
    return FailedPrecondition(
        "this model has no chat template (neither tokenizer_config.json's chat_template nor "
        "chat_template.jinja; give one with --chat-template FILE); send a raw prompt to "
        "/v1/completions instead");
  }
  return data_->chat_template->Render(input);
}

namespace {

using nlohmann::json;

// A special token field: a string, {"content": string, ...} or null.
Result<std::optional<std::string>> SpecialTokenText(const json& v, const std::string& where) {
  if (v.is_null()) return std::optional<std::string>();
  if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return std::optional<std::string>(v["content"].get<std::string>());
  }
  return InvalidArgument(where + " must be a string or {\"content\": string}");
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

// The special tokens HF's special_tokens_map gives a chat template, in its order.
Status ParseSpecialTokens(const json& root, const std::string& source, TokenizerData* data) {
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    const auto it = root.find(key);
    if (it == root.end()) continue;
    ASSIGN_OR_RETURN(std::optional<std::string> token, SpecialTokenText(*it, source + ": " + key));
    if (!token.has_value()) continue;
    data->special_tokens[key] = *token;
    if (std::string_view(key) != "bos_token" && std::string_view(key) != "eos_token") continue;
    const auto id = data->string_to_id.find(*token);
    if (id == data->string_to_id.end()) {
      return InvalidArgument(source + ": " + key + " '" + *token +
                             "' is not a token of tokenizer.json");
    }
    (std::string_view(key) == "bos_token" ? data->bos_id : data->eos_id) = id->second;
  }
  const auto extra = root.find("additional_special_tokens");
  if (extra != root.end() && extra->is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (size_t i = 0; i < extra->size(); ++i) {
      ASSIGN_OR_RETURN(std::optional<std::string> token,
                       SpecialTokenText((*extra)[i], source + ": additional_special_tokens[" +
                                                         std::to_string(i) + "]"));
      if (token.has_value()) list.push_back(*token);
    }
    data->special_tokens["additional_special_tokens"] = std::move(list);
  }
  return OkStatus();
}

Status ParseConfigRoot(const json& root, const std::string& source, TokenizerData* data) {
  if (!root.is_object()) return InvalidArgument(source + ": top level is not a JSON object");
  RETURN_IF_ERROR(ParseSpecialTokens(root, source, data));
  const auto add_bos = root.find("add_bos_token");
  if (add_bos != root.end() && add_bos->is_boolean()) {
    data->add_bos_token = add_bos->get<bool>();
  } else if (data->special_tokens.contains("bos_token")) {
    data->add_bos_token =
        data->post_processor_prefix == data->special_tokens["bos_token"].get<std::string>();
  }
  data->config_chat_template = ChatTemplateText(root);
  data->config_source = source;
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

namespace {

// The chat template, first found: the explicit file, DIR/chat_template.jinja, the config's.
Status LoadChatTemplate(const std::string& model_dir, const std::string& chat_template_file,
                        internal::TokenizerData* data) {
  std::string path = chat_template_file;
  std::error_code ec;
  if (path.empty() && std::filesystem::exists(model_dir + "/chat_template.jinja", ec)) {
    path = model_dir + "/chat_template.jinja";
  }
  std::string text = data->config_chat_template;
  std::string origin = data->config_source;
  if (!path.empty()) {
    ASSIGN_OR_RETURN(text, ReadFileToString(path));
    origin = path;
  }
  if (text.empty()) return OkStatus();
  ASSIGN_OR_RETURN(data->chat_template, ChatTemplate::Create(text, data->special_tokens, origin));
  return OkStatus();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir,
                                                   const std::string& chat_template_file) {
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
  RETURN_IF_ERROR(LoadChatTemplate(model_dir, chat_template_file, data.get()));
  return std::unique_ptr<Tokenizer>(new internal::BpeTokenizer(std::move(data)));
}

}  // namespace pd::model
