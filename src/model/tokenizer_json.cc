// tokenizer.json -> TokenizerData: model (BPE vocab and merges), added tokens, normalizer and
// pre-tokenizer, each malformed entry refused with an InvalidArgument naming the file and entry.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "model/tokenizer_byte_level.h"
#include "model/tokenizer_impl.h"

namespace pd::model::internal {
namespace {

using nlohmann::json;

constexpr int64_t kMaxTokenId = int64_t{1} << 24;

// Names a token in an error message, cutting very long ones.
std::string Quote(std::string_view token) {
  constexpr size_t kMax = 80;
  if (token.size() <= kMax) return "'" + std::string(token) + "'";
  return "'" + std::string(token.substr(0, kMax)) + "...'";
}

void Resize(TokenizerData* data, int64_t id) {
  if (id < static_cast<int64_t>(data->flags.size())) return;
  data->token_strings.resize(id + 1);
  data->token_bytes.resize(id + 1);
  data->flags.resize(id + 1, 0);
}

Status ParseVocab(const json& model, const std::string& source, TokenizerData* data) {
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return InvalidArgument(source + ": model.vocab is missing or not an object");
  }
  if (vocab->empty()) return InvalidArgument(source + ": model.vocab is empty");
  data->string_to_id.reserve(vocab->size());
  for (const auto& [token, value] : vocab->items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= kMaxTokenId) {
      return InvalidArgument(source + ": model.vocab[" + Quote(token) + "]: id " + value.dump() +
                             " is not an integer in [0, " + std::to_string(kMaxTokenId) + ")");
    }
    const int64_t id = value.get<int64_t>();
    Resize(data, id);
    if (data->flags[id] & TokenizerData::kPresent) {
      return InvalidArgument(source + ": model.vocab: duplicate id " + std::to_string(id) +
                             " for tokens " + Quote(data->token_strings[id]) + " and " +
                             Quote(token));
    }
    data->flags[id] = TokenizerData::kPresent;
    data->token_strings[id] = token;
    // A token outside the byte alphabet decodes to its own UTF-8, as HF's ByteLevel decoder does.
    std::string bytes;
    data->token_bytes[id] = ByteLevelDecode(token, &bytes) ? std::move(bytes) : token;
    data->string_to_id.emplace(token, static_cast<int32_t>(id));
  }
  return OkStatus();
}

Result<std::pair<std::string, std::string>> MergePair(const json& entry) {
  if (entry.is_string()) {
    const std::string line = entry.get<std::string>();
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 >= line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      return InvalidArgument("expected \"left right\"");
    }
    return std::make_pair(line.substr(0, space), line.substr(space + 1));
  }
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
    return std::make_pair(entry[0].get<std::string>(), entry[1].get<std::string>());
  }
  return InvalidArgument("expected \"left right\" or [\"left\", \"right\"]");
}

Status ParseMerges(const json& model, const std::string& source, BpeModelOptions* options,
                   const TokenizerData& data) {
  const auto merges = model.find("merges");
  if (merges == model.end() || merges->is_null()) return OkStatus();
  if (!merges->is_array()) return InvalidArgument(source + ": model.merges is not an array");
  options->merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& entry = (*merges)[i];
    const auto where = [&] {  // built only on the error paths: there may be 300k merges
      return source + ": model.merges[" + std::to_string(i) + "] " +
             (entry.is_string() ? Quote(entry.get<std::string>()) : entry.dump());
    };
    auto pair = MergePair(entry);
    if (!pair.ok()) return InvalidArgument(where() + ": " + pair.status().message());
    const auto& [left, right] = *pair;
    const auto left_it = data.string_to_id.find(left);
    if (left_it == data.string_to_id.end()) {
      return InvalidArgument(where() + ": token " + Quote(left) + " is not in model.vocab");
    }
    const auto right_it = data.string_to_id.find(right);
    if (right_it == data.string_to_id.end()) {
      return InvalidArgument(where() + ": token " + Quote(right) + " is not in model.vocab");
    }
    const auto result_it = data.string_to_id.find(left + right);
    if (result_it == data.string_to_id.end()) {
      return InvalidArgument(where() + ": merged token " + Quote(left + right) +
                             " is not in model.vocab");
    }
    options->merges.push_back(BpeMerge{left_it->second, right_it->second, result_it->second});
  }
  return OkStatus();
}

Status ParseModel(const json& root, const std::string& source, TokenizerData* data) {
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object()) {
    return InvalidArgument(source + ": 'model' is missing or not an object");
  }
  if (model->contains("type") && (*model)["type"] != "BPE") {
    const json& type = (*model)["type"];
    return InvalidArgument(source + ": model.type " +
                           (type.is_string() ? Quote(type.get<std::string>()) : type.dump()) +
                           " is not supported (byte-level BPE only)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model->contains(key) && (*model)[key].is_string() &&
        !(*model)[key].get<std::string>().empty()) {
      return InvalidArgument(source + ": model." + key + " is not supported (byte-level BPE only)");
    }
  }
  RETURN_IF_ERROR(ParseVocab(*model, source, data));
  BpeModelOptions options;
  const auto& alphabet = ByteToUnicode();
  for (int b = 0; b < 256; ++b) {
    const auto it = data->string_to_id.find(alphabet[b]);
    if (it == data->string_to_id.end()) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", b);
      return InvalidArgument(source + ": model.vocab has no token for byte " + hex + " (" +
                             Quote(alphabet[b]) + "): byte-level BPE needs all 256 byte tokens");
    }
    options.byte_ids[b] = it->second;
  }
  RETURN_IF_ERROR(ParseMerges(*model, source, &options, *data));
  options.ignore_merges = model->value("ignore_merges", false);
  if (options.ignore_merges) {
    for (size_t id = 0; id < data->flags.size(); ++id) {
      if (data->flags[id] & TokenizerData::kPresent) {
        options.word_ids.emplace(data->token_bytes[id], static_cast<int32_t>(id));
      }
    }
  }
  data->bpe = BpeModel(std::move(options));
  return OkStatus();
}

// Called once per added token (150k of them for a large synthetic vocabulary), so error text is
// only built on the error paths.
Status ParseAddedToken(const json& entry, size_t index, const std::string& source,
                       TokenizerData* data) {
  const auto where = [&] { return source + ": added_tokens[" + std::to_string(index) + "]"; };
  const auto id_it = entry.is_object() ? entry.find("id") : entry.end();
  const auto content_it = entry.is_object() ? entry.find("content") : entry.end();
  if (!entry.is_object() || id_it == entry.end() || !id_it->is_number_integer() ||
      content_it == entry.end() || !content_it->is_string()) {
    return InvalidArgument(where() + ": expected {\"id\": int, \"content\": string, ...}");
  }
  const int64_t id = id_it->get<int64_t>();
  const std::string& content = content_it->get_ref<const std::string&>();
  if (id < 0 || id >= kMaxTokenId) {
    return InvalidArgument(where() + ": id " + std::to_string(id) + " is out of range");
  }
  if (content.empty()) return InvalidArgument(where() + ": content is empty");
  const auto named = [&] {
    return where() + " " + Quote(content) + " (id " + std::to_string(id) + ")";
  };
  Resize(data, id);
  uint8_t& flags = data->flags[id];
  if ((flags & TokenizerData::kPresent) && data->token_strings[id] != content) {
    const bool added = flags & TokenizerData::kAdded;
    return InvalidArgument(named() + ": id " + std::to_string(id) + " is already " +
                           Quote(data->token_strings[id]) + " in " +
                           (added ? "added_tokens" : "model.vocab"));
  }
  const auto existing = data->string_to_id.find(content);
  if (existing != data->string_to_id.end() && existing->second != id) {
    return InvalidArgument(named() + ": " + Quote(content) + " already has id " +
                           std::to_string(existing->second));
  }
  flags |= TokenizerData::kPresent | TokenizerData::kAdded;
  const auto special = entry.find("special");
  if (special != entry.end() && special->is_boolean() && special->get<bool>()) {
    flags |= TokenizerData::kSpecial;
  }
  data->token_strings[id] = content;
  data->token_bytes[id] = content;  // added tokens decode to their content as written
  data->string_to_id.emplace(content, static_cast<int32_t>(id));
  data->added.Add(content, static_cast<int32_t>(id));
  return OkStatus();
}

Status ParseAddedTokens(const json& root, const std::string& source, TokenizerData* data) {
  const auto added = root.find("added_tokens");
  if (added == root.end() || added->is_null()) return OkStatus();
  if (!added->is_array()) return InvalidArgument(source + ": added_tokens is not an array");
  data->string_to_id.reserve(data->string_to_id.size() + added->size());
  data->added.Reserve(added->size());
  for (size_t i = 0; i < added->size(); ++i) {
    RETURN_IF_ERROR(ParseAddedToken((*added)[i], i, source, data));
  }
  return OkStatus();
}

// Only null and NFC are accepted. NFC is NOT applied (see tokenizer.cc's header comment):
// text that is already NFC, as nearly all text is, tokenizes the same either way.
Status CheckNormalizer(const json& node, const std::string& where) {
  if (node.is_null()) return OkStatus();
  const std::string type = node.is_object() ? node.value("type", std::string()) : std::string();
  if (type == "NFC") return OkStatus();
  if (type == "Sequence" && node.contains("normalizers") && node["normalizers"].is_array()) {
    for (const json& inner : node["normalizers"]) RETURN_IF_ERROR(CheckNormalizer(inner, where));
    return OkStatus();
  }
  return InvalidArgument(where + " " + (type.empty() ? node.dump() : Quote(type)) +
                         " is not supported (null or NFC only)");
}

// The special token a TemplateProcessing post-processor (possibly inside a Sequence) puts first.
std::string PostProcessorPrefix(const json& node) {
  if (!node.is_object()) return "";
  const std::string type = node.value("type", std::string());
  if (type == "Sequence" && node.contains("processors") && node["processors"].is_array()) {
    for (const json& inner : node["processors"]) {
      std::string prefix = PostProcessorPrefix(inner);
      if (!prefix.empty()) return prefix;
    }
    return "";
  }
  if (type != "TemplateProcessing" || !node.contains("single") || !node["single"].is_array() ||
      node["single"].empty()) {
    return "";
  }
  const json& first = node["single"][0];
  if (!first.is_object() || !first.contains("SpecialToken")) return "";
  const json& special = first["SpecialToken"];
  return special.is_object() ? special.value("id", std::string()) : "";
}

Status ParseRoot(const json& root, const std::string& source, TokenizerData* data) {
  if (!root.is_object()) return InvalidArgument(source + ": top level is not a JSON object");
  RETURN_IF_ERROR(ParseModel(root, source, data));
  RETURN_IF_ERROR(ParseAddedTokens(root, source, data));
  if (root.contains("normalizer")) {
    RETURN_IF_ERROR(CheckNormalizer(root["normalizer"], source + ": normalizer"));
  }
  const json null_node;
  auto pre = PreTokenizer::FromJson(
      root.contains("pre_tokenizer") ? root["pre_tokenizer"] : null_node, source);
  if (!pre.ok()) return pre.status();
  data->pre_tokenizer = std::move(pre).value();
  if (root.contains("post_processor")) {
    data->post_processor_prefix = PostProcessorPrefix(root["post_processor"]);
  }
  return OkStatus();
}

}  // namespace

Status ParseTokenizerJson(const std::string& text, const std::string& source, TokenizerData* data) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    return InvalidArgument(source + ": malformed JSON: " + e.what());
  }
  try {
    return ParseRoot(root, source, data);
  } catch (const json::exception& e) {  // a field of an unexpected type
    return InvalidArgument(source + ": " + e.what());
  }
}

}  // namespace pd::model::internal
