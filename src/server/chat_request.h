// The chat part of a request (/v1/chat/completions, /tokenize with messages): messages, tools,
// tool_choice, add_generation_prompt and chat_template_kwargs, validated and kept in the client's
// key order for the chat template.
#pragma once

#include <string_view>

#include "common/status.h"
#include "model/chat_template.h"

namespace pd::server {

// Parses the request body's chat fields. Message content given as a list of text parts is joined
// into one string; null content stays null (an assistant turn with tool_calls). InvalidArgument
// names the field and what was wrong.
Result<model::ChatInput> ParseChatInput(std::string_view body);

}  // namespace pd::server
