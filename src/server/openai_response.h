// OpenAI response bodies: completions, chat completions, their streamed chunks (SSE) and the
// logprobs objects of both APIs.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/tokenizer.h"
#include "server/openai_protocol.h"
#include "server/reasoning_parser.h"
#include "server/text_stream.h"
#include "server/tool_call_parser.h"

namespace pd::server {

struct ResponseFormat {
  ApiKind kind = ApiKind::kCompletion;
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  int num_logprobs = -1;  // -1: no logprobs
  bool return_tokens_as_token_ids = false;
  bool include_usage = false;
  // Chat: the <think> part of the reply goes to reasoning_content (--reasoning-parser).
  ReasoningParser reasoning_parser = ReasoningParser::kNone;
  // Chat: the content part is parsed for tool calls in this format (--tool-call-parser; kNone
  // when the request has no tools or tool_choice "none"), with the request's tools.
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
  nlohmann::ordered_json tools;
};

// OpenAI's usage object; prompt_tokens_details.cached_tokens counts the prompt tokens whose KV
// came from the prefix cache.
nlohmann::json UsageJson(int prompt_tokens, int completion_tokens, int cached_tokens = 0);

// Thread safety: not thread-safe; one HTTP thread owns it.
class ResponseBuilder {
 public:
  ResponseBuilder(ResponseFormat format, const model::Tokenizer& tokenizer);

  // Streaming: each returns one SSE event "data: {...}\n\n".
  std::string RoleChunk() const;              // chat only: the assistant role delta
  std::string Chunk(const TextDelta& delta);  // text, logprobs and finish reason
  std::string UsageChunk(int prompt_tokens, int completion_tokens, int cached_tokens = 0) const;
  static std::string DoneEvent() { return "data: [DONE]\n\n"; }

  // Non-streaming: accumulate every delta, then render the whole response.
  void Accumulate(const TextDelta& delta);
  std::string Final(int prompt_tokens, int completion_tokens, int cached_tokens = 0) const;

 private:
  nlohmann::json Logprobs(const TextDelta& delta);  // null when logprobs were not asked for
  nlohmann::json Base(const char* object) const;
  static nlohmann::json StopReason(const TextDelta& delta);
  // The chat delta objects of one engine delta: reasoning and content first, then one per
  // tool-call piece.
  std::vector<nlohmann::json> ChatDeltas(const TextDelta& delta);
  // "stop" becomes "tool_calls" when the reply called a tool.
  static std::string FinishReason(const std::string& reason, int num_tool_calls);

  const ResponseFormat format_;
  const model::Tokenizer& tokenizer_;
  ReasoningSplitter splitter_;  // streaming chat: reasoning vs content so far
  ToolCallParser tool_parser_;  // streaming chat: content vs tool calls so far
  size_t text_offset_ = 0;      // completions logprobs: text_offset of the next token
  std::string text_;            // accumulated (non-streaming)
  nlohmann::json logprobs_;     // accumulated (non-streaming)
  std::string finish_reason_;
  nlohmann::json stop_reason_;
};

}  // namespace pd::server
