// The chat part of a request (/v1/chat/completions, /tokenize with messages): messages, tools,
// tool_choice, add_generation_prompt and chat_template_kwargs, validated and kept in the client's
// key order for the chat template.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "model/chat_template.h"

namespace pd::server {

// tool_choice: "auto" (the default), "none" (the reply is not parsed for calls; the tools are
// still rendered into the prompt, as vLLM does), "required" (some call), or
// {"type": "function", "function": {"name": N}} (a call of N, one of the request's tools).
struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function;  // kFunction
  bool forces_call() const { return mode == Mode::kRequired || mode == Mode::kFunction; }
};

// Parses the request body's chat fields. Message content given as a list of text parts is joined
// into one string; null content stays null (an assistant turn with tool_calls). Tools must be
// {"type": "function", "function": {"name": [A-Za-z0-9_.-]{1,64}, "parameters": an object schema}}.
// InvalidArgument names the field and what was wrong. `tool_choice` (may be null) receives the
// parsed tool_choice.
Result<model::ChatInput> ParseChatInput(std::string_view body, ToolChoice* tool_choice = nullptr);

}  // namespace pd::server
