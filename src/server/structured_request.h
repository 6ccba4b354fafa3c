// The structured-output fields of a completion or chat request: OpenAI's response_format
// ({"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}),
// vLLM's guided_json / guided_regex / guided_choice, and the same inside vLLM's
// structured_outputs ({"json", "regex", "choice", "json_object"}) and guided_decoding objects.
// At most one may be set. A schema keeps its member order (the order properties are written in).
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "common/status.h"
#include "constrain/structured_output.h"

namespace pd::server {

// `doc` is the parsed body, `body` its text (re-read in order when a schema is present).
// InvalidArgument names the field ("'guided_regex' must be a string, got integer").
Result<constrain::StructuredOutput> ParseStructuredOutput(const nlohmann::json& doc,
                                                          std::string_view body);

}  // namespace pd::server
