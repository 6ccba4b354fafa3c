// JSON Schema to a regular expression tree (regex_parser.h) whose sentences are JSON texts valid
// under the schema, for bounded schemas:
//   type (one or a list): object, array, string, number, integer, boolean, null
//   object: properties (written in the schema's order; optional ones may be left out), required,
//     additionalProperties (absent or false: no other members, as OpenAI's strict mode has it)
//   array: items, minItems, maxItems
//   string: minLength, maxLength, pattern (a search, as JSON Schema defines it: unanchored ends
//     may hold other characters; the value is written without escapes), format date, time,
//     date-time, uuid
//   integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (16 digits at most)
//   enum, const, anyOf, oneOf (as anyOf), allOf of one schema, $ref to #/$defs/... or
//     #/definitions/... without recursion
//   annotations (title, description, default, examples, $schema, $id, $comment, ...) are ignored
// Between tokens a run of at most max_whitespace blanks (space, tab, newline, CR) may stand.
// Numbers: at most 16 integer and 16 fraction digits and a two-digit exponent.
// Anything else (another keyword, a recursive $ref, a schema that allows any value) is
// InvalidArgument naming the keyword and where it is ("unsupported JSON schema keyword 'minimum'
// at #/properties/age").
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "constrain/regex_parser.h"

namespace pd::constrain {

struct JsonSchemaOptions {
  int max_whitespace = 16;
};

Result<RegexNode> JsonSchemaToRegex(const nlohmann::ordered_json& schema,
                                    const JsonSchemaOptions& options = {});

}  // namespace pd::constrain
