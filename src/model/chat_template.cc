// The two chat template families pdserve renders natively (no Jinja engine): ChatML (Qwen) and
// Llama-3. Output is byte-for-byte what HF's Jinja rendering of the templates below gives.
#include <string>

#include "model/tokenizer_byte_level.h"
#include "model/tokenizer_impl.h"

namespace pd::model::internal {

const char kChatMLJinjaTemplate[] =
    R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";

const char kLlama3JinjaTemplate[] =
    R"({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})";

namespace {

// Python's str.isspace(), which Jinja's trim filter (str.strip) uses.
bool IsPythonSpace(uint32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20)) return true;
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// Jinja's `| trim`: strips leading and trailing Unicode whitespace.
std::string_view Trim(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    size_t next = begin;
    uint32_t cp = 0;
    if (!NextUtf8(text, &next, &cp) || !IsPythonSpace(cp)) break;
    begin = next;
  }
  size_t end = text.size();
  while (end > begin) {
    size_t start = end - 1;  // back to the first byte of the last character
    while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    size_t next = start;
    uint32_t cp = 0;
    if (!NextUtf8(text, &next, &cp) || next != end || !IsPythonSpace(cp)) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

}  // namespace

ChatTemplateKind DetectChatTemplate(std::string_view jinja_template) {
  if (jinja_template.find("<|im_start|>") != std::string_view::npos) {
    return ChatTemplateKind::kChatML;
  }
  if (jinja_template.find("<|start_header_id|>") != std::string_view::npos) {
    return ChatTemplateKind::kLlama3;
  }
  return ChatTemplateKind::kNone;
}

std::string RenderChatML(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += "<|im_start|>";
    out += m.role;
    out += "\n";
    out += m.content;
    out += "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string RenderLlama3(std::span<const ChatMessage> messages, bool add_generation_prompt,
                         std::string_view bos_token) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) out += bos_token;
    out += "<|start_header_id|>";
    out += messages[i].role;
    out += "<|end_header_id|>\n\n";
    out += Trim(messages[i].content);
    out += "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace pd::model::internal
