// OpenAI-compatible request parsing and validation (completions, chat completions, tokenize,
// detokenize) and the OpenAI error shape. Pure functions: no engine, no HTTP.
//
// Errors are Status values whose message names the field and the problem; HttpStatusFor maps a
// Status code to the HTTP status the server answers with.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "constrain/structured_output.h"
#include "engine/request.h"
#include "model/tokenizer.h"
#include "server/chat_request.h"

namespace pd::server {

enum class ApiKind { kCompletion, kChat };

// What the server knows when it validates a request.
struct ProtocolLimits {
  std::string served_model_name;
  int max_model_len = 4096;
  int vocab_size = 0;
  int max_logprobs = 20;  // largest top-N accepted
  int max_stop_strings = 16;
  size_t max_stop_string_bytes = 256;
  int max_stop_token_ids = 64;  // the engine checks each one after every sampled token
};

// A completion or chat request after JSON validation, before tokenisation.
struct GenerateRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;                       // as sent (may be empty)
  std::optional<std::string> prompt_text;  // completions: the prompt as text ...
  std::vector<int32_t> prompt_ids;         // ... or as token ids
  model::ChatInput chat;                   // chat: messages, tools, template kwargs
  ToolChoice tool_choice;                  // chat
  std::optional<int> max_tokens;    // absent: 16 (completions) / the rest of the context (chat)
  engine::SamplingParams sampling;  // everything except max_tokens and logprobs
  constrain::StructuredOutput structured;  // response_format, guided_*: compiled by the server
  int num_logprobs = -1;                   // -1: none; 0: the chosen token's; N: top N too
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool return_tokens_as_token_ids = false;
  bool skip_special_tokens = true;
};

// Parses the body of POST /v1/completions or /v1/chat/completions. InvalidArgument names the
// problem ("'max_tokens' must be an integer, got string"), NotFound an unknown model.
Result<GenerateRequest> ParseGenerateRequest(ApiKind kind, std::string_view body,
                                             const ProtocolLimits& limits);

// After tokenisation: checks the ids (non-empty, in the vocabulary), fills sampling.max_tokens
// and sampling.logprobs, and checks prompt + max_tokens <= max_model_len.
Status FinalizeGenerateRequest(const std::vector<int32_t>& prompt_ids, const ProtocolLimits& limits,
                               GenerateRequest* request);

// POST /tokenize: {"prompt": "..."} or {"messages": [...]} with the chat fields of a chat
// request (tools, add_generation_prompt, chat_template_kwargs), optional "add_special_tokens".
struct TokenizeRequest {
  std::optional<std::string> prompt;
  model::ChatInput chat;  // without a prompt
  bool add_special_tokens = true;
};
Result<TokenizeRequest> ParseTokenizeRequest(std::string_view body, const ProtocolLimits& limits);
// POST /detokenize: {"tokens": [ids]}; ids are checked against the vocabulary.
Result<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body,
                                                    const ProtocolLimits& limits);

// The HTTP status for an error Status: InvalidArgument/OutOfRange 400, NotFound 404,
// ResourceExhausted 429, Unavailable 503, DeadlineExceeded 504, others 500.
int HttpStatusFor(const Status& status);
// OpenAI's error body: {"error": {"message", "type", "param", "code"}}; code is the HTTP status.
std::string ErrorBody(int http_status, std::string_view message);
// The OpenAI error type for an HTTP status ("invalid_request_error", "authentication_error", ...).
std::string_view ErrorTypeFor(int http_status);

// JSON text that never throws on invalid UTF-8 (invalid bytes become U+FFFD).
std::string DumpJson(const nlohmann::json& value);

}  // namespace pd::server
