#include "model/chat_template.h"

#include "template/template.h"

namespace pd::model {

using template_engine::Value;

ChatInput ChatInput::FromMessages(std::span<const ChatMessage> messages,
                                  bool add_generation_prompt) {
  ChatInput input;
  for (const ChatMessage& m : messages) {
    input.messages.push_back({{"role", m.role}, {"content", m.content}});
  }
  input.add_generation_prompt = add_generation_prompt;
  return input;
}

ChatTemplate::~ChatTemplate() = default;

Result<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(std::string_view source,
                                                           nlohmann::ordered_json special_tokens,
                                                           std::string origin) {
  auto parsed = template_engine::Template::Parse(source);
  if (!parsed.ok()) {
    return InvalidArgument(origin + ": chat template: " + parsed.status().message());
  }
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  t->template_ = std::move(parsed).value();
  t->special_tokens_ =
      special_tokens.is_object() ? std::move(special_tokens) : nlohmann::ordered_json::object();
  t->origin_ = std::move(origin);
  t->source_ = std::string(source);
  return t;
}

Result<std::string> ChatTemplate::Render(const ChatInput& input) const {
  // As transformers' apply_chat_template: special tokens first, then messages, tools,
  // add_generation_prompt, then the caller's kwargs (which may override any of them).
  Value context{template_engine::Object()};
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) {
    context.Set(it.key(), Value::FromJson(*it));
  }
  context.Set("messages", Value::FromJson(input.messages));
  context.Set("tools", Value::FromJson(input.tools));
  context.Set("documents", Value::None());
  context.Set("add_generation_prompt", Value(input.add_generation_prompt));
  if (input.template_kwargs.is_object()) {
    for (auto it = input.template_kwargs.begin(); it != input.template_kwargs.end(); ++it) {
      context.Set(it.key(), Value::FromJson(*it));
    }
  }
  auto text = template_->Render(context);
  if (!text.ok()) {
    return InvalidArgument("the chat template (" + origin_ +
                           ") failed: " + text.status().message());
  }
  return std::move(text).value();
}

}  // namespace pd::model
