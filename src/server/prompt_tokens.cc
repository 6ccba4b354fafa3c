#include "server/prompt_tokens.h"

namespace pd::server {

std::vector<int32_t> EncodePromptText(const model::Tokenizer& tokenizer, const std::string& text,
                                      bool add_special_tokens) {
  // As HF tokenizers do: Llama-3's post-processor prepends <|begin_of_text|>; Qwen's adds nothing
  // (its config names a bos_token_id, but its tokenizer never inserts it).
  std::vector<int32_t> ids;
  auto bos = tokenizer.bos_token_id();
  if (add_special_tokens && bos && tokenizer.adds_bos_token()) ids.push_back(*bos);
  std::vector<int32_t> body = tokenizer.Encode(text);
  if (!ids.empty() && !body.empty() && body.front() == ids.front())
    ids.clear();  // BOS written in the text
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

Result<std::vector<int32_t>> PromptTokens(const model::Tokenizer& tokenizer,
                                          const GenerateRequest& request) {
  if (request.kind == ApiKind::kChat) {
    // The template writes the special tokens it wants (bos included): none are added here.
    auto text = tokenizer.ApplyChatTemplate(request.chat);
    if (!text.ok())
      return InvalidArgument("cannot apply the chat template: " + text.status().message());
    return tokenizer.Encode(*text);
  }
  if (request.prompt_text) return EncodePromptText(tokenizer, *request.prompt_text, true);
  return request.prompt_ids;
}

uint64_t TokenizerFingerprint(const model::Tokenizer& tokenizer) {
  std::string text = "vocab=" + std::to_string(tokenizer.vocab_size());
  auto add_ids = [&text](const std::vector<int32_t>& ids) {
    text += "\n";
    for (int32_t id : ids) text += std::to_string(id) + ",";
  };
  add_ids(
      EncodePromptText(tokenizer, "The quick brown fox, 12345 times: \u00e4\u65e5\u672c!", true));
  add_ids(EncodePromptText(tokenizer, "  indented\n\tcode() { return x; }", false));
  const model::ChatMessage chat[] = {{"system", "You are terse."}, {"user", "Hello there?"}};
  auto rendered = tokenizer.ApplyChatTemplate(model::ChatInput::FromMessages(chat, true));
  if (rendered.ok()) {
    add_ids(tokenizer.Encode(*rendered));
  } else {
    text += "\nno chat template";
  }
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a: the same in every build and process
  for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ull;
  return hash;
}

}  // namespace pd::server
