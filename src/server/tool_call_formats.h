// The markers and the call-body grammars of the tool-call formats (tool_call_parser.h). The
// marker strings are the ones the checkpoints' chat templates write (Qwen3's tokenizer_config.json
// for hermes, DeepSeek-V3's for its tool-call tokens).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pd::server {

inline constexpr std::string_view kHermesCallBegin = "<tool_call>";
inline constexpr std::string_view kHermesCallEnd = "</tool_call>";
inline constexpr std::string_view kDeepSeekCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kDeepSeekCallsEnd = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view kDeepSeekCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kDeepSeekCallEnd = "<｜tool▁call▁end｜>";
inline constexpr std::string_view kDeepSeekSep = "<｜tool▁sep｜>";
inline constexpr std::string_view kLlamaPythonTag = "<|python_tag|>";

struct ParsedCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

// Between <tool_call> and </tool_call>: {"name": N, "arguments": {...}} ("arguments" may also be
// a string holding the object, or absent: {}).
Result<ParsedCall> ParseHermesCall(std::string_view body);
// Between <tool_call> and </tool_call>: <function=N> (<parameter=P>value</parameter>)*
// </function>. A value keeps its text minus one leading and one trailing newline, and becomes a
// number, boolean, object, array or null when `tools` gives the parameter that JSON Schema type
// (and the value parses as one); otherwise it is a string.
Result<ParsedCall> ParseQwen3CoderCall(std::string_view body, const nlohmann::ordered_json& tools);
// Between <｜tool▁call▁begin｜> and <｜tool▁call▁end｜>: TYPE<｜tool▁sep｜>N\n```json\n{...}\n```
Result<ParsedCall> ParseDeepSeekCall(std::string_view body);
// A whole reply: [<|python_tag|>] {"name": N, "parameters": {...}} (or "arguments"), several
// separated by ';'.
Result<std::vector<ParsedCall>> ParseLlama3Calls(std::string_view text);

}  // namespace pd::server
