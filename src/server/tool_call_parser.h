// --tool-call-parser: turns the tool-call text a model writes into OpenAI tool_calls, for a whole
// reply and as it streams, in the formats the supported checkpoints emit:
//   hermes       <tool_call>{"name": N, "arguments": {...}}</tool_call>   (Qwen3, Qwen2.5)
//   qwen3_coder  <tool_call><function=N><parameter=P>value</parameter>...</function></tool_call>
//                (values converted by the tool's JSON Schema parameter types)
//   deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N
//                ```json {...} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   llama3_json  {"name": N, "parameters": {...}} (optionally after <|python_tag|>, several
//                separated by ';'), when the reply is nothing else
// Text before a call stays content; markup never reaches content; a call that does not parse
// (malformed, or cut short by max_tokens) stays content, markup included.
//
// Also: the constraint that forces a call in a format's syntax (tool_choice "required" or a
// named function).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/output_constraint.h"

namespace pd::server {

enum class ToolCallFormat { kNone, kHermes, kQwen3Coder, kDeepSeekV3, kLlama3Json };

// "" / "none", "hermes", "qwen3_coder", "deepseek_v3", "llama3_json"; InvalidArgument naming the
// accepted values otherwise.
Result<ToolCallFormat> ParseToolCallParserName(std::string_view name);

// A piece of one call: the first piece of a call carries its id and name (arguments empty), later
// ones the arguments text (a JSON object, possibly in several fragments).
struct ToolCallDelta {
  int index = 0;
  std::string id;    // "call_..." on the first piece
  std::string name;  // on the first piece
  std::string arguments;
};

struct ToolParse {
  std::string content;
  std::vector<ToolCallDelta> calls;
};

// Thread safety: not thread-safe; one request's response builder owns it.
class ToolCallParser {
 public:
  // `tools`: the request's tools (qwen3_coder reads their parameter types); may be null.
  ToolCallParser(ToolCallFormat format, nlohmann::ordered_json tools);
  // The next piece of (non-reasoning) text. A tail that may be the start of a call marker, and a
  // call until its end marker, are held back until the next Feed or Finish.
  ToolParse Feed(std::string_view text);
  // The end of the output: what was held back becomes content, or (llama3_json) calls.
  ToolParse Finish();
  int num_calls() const { return num_calls_; }

 private:
  enum class State { kText, kCall, kSection, kWhole, kPlain };
  void FeedText(std::string* buf, ToolParse* out);
  void FeedCall(std::string* buf, ToolParse* out);
  void FeedSection(std::string* buf, ToolParse* out);
  // A whole call body: appends its deltas, or false when it does not parse.
  bool EmitCall(std::string_view body, ToolParse* out);
  void EmitCalls(std::string_view whole, ToolParse* out);  // llama3_json

  const ToolCallFormat format_;
  const nlohmann::ordered_json tools_;
  State state_;
  std::string pending_;      // held back
  std::string raw_;          // the markup of the call in progress, returned as content if it fails
  size_t body_start_ = 0;    // where the call's body starts in raw_
  bool skip_space_ = false;  // after a call: whitespace before the next one is dropped
  int num_calls_ = 0;
};

// The constraint a forced call decodes under: the format's call syntax with one of `names` and
// arguments that are one JSON object (qwen3_coder: parameters in its XML syntax, which the parser
// turns into one). InvalidArgument for kNone.
Result<std::shared_ptr<const engine::OutputConstraint>> ForcedCallConstraint(
    ToolCallFormat format, const std::vector<std::string>& names,
    std::shared_ptr<const engine::TokenTexts> texts);

// "call_" and 24 random letters and digits.
std::string NewToolCallId();

}  // namespace pd::server
