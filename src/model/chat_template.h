// A checkpoint's chat template: the Jinja text its tokenizer_config.json (or chat_template.jinja,
// or --chat-template FILE) ships, parsed once and rendered as Hugging Face's apply_chat_template
// renders it: with messages, tools, add_generation_prompt, the special tokens
// (bos_token, eos_token, ...) and the request's chat_template_kwargs.
//
// Thread safety: immutable after Create; Render may be called from any thread.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pd::template_engine {
class Template;
}

namespace pd::model {

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" | "tool" | ...
  std::string content;
};

// What one chat request renders: apply_chat_template's arguments. Key order inside messages and
// tools is kept (tojson writes it as the client sent it).
struct ChatInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null: the request has none (the template sees tools = None)
  bool add_generation_prompt = true;
  // chat_template_kwargs: extra template variables (Qwen3's enable_thinking, ...).
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();

  // Plain {role, content} messages.
  static ChatInput FromMessages(std::span<const ChatMessage> messages, bool add_generation_prompt);
};

class ChatTemplate {
 public:
  // `source` is the Jinja text; `special_tokens` a JSON object of template variables
  // (bos_token, eos_token, ..., additional_special_tokens); `origin` names the template in
  // errors ("models/x/tokenizer_config.json"). A template that does not parse is an
  // InvalidArgument naming the origin, the construct and its line:column.
  static Result<std::unique_ptr<ChatTemplate>> Create(std::string_view source,
                                                      nlohmann::ordered_json special_tokens,
                                                      std::string origin);
  ~ChatTemplate();

  // The prompt text. A template that raises (raise_exception) or fails at run time is an
  // InvalidArgument whose message says so.
  Result<std::string> Render(const ChatInput& input) const;
  const std::string& origin() const { return origin_; }
  const std::string& source() const { return source_; }

 private:
  ChatTemplate() = default;
  std::unique_ptr<template_engine::Template> template_;
  nlohmann::ordered_json special_tokens_;
  std::string origin_;
  std::string source_;
};

}  // namespace pd::model
