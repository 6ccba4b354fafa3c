#include "server/openai_protocol.h"

#include <limits>

#include "server/chat_request.h"
#include "server/structured_request.h"

namespace pd::server {

using json = nlohmann::json;

namespace {

std::string TypeOf(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

Status WrongType(std::string_view field, std::string_view expected, const json& v) {
  return InvalidArgument("'" + std::string(field) + "' must be " + std::string(expected) +
                         ", got " + TypeOf(v));
}

// Each getter leaves *out untouched when the field is absent or null.
Status GetInt(const json& obj, const char* field, std::optional<int64_t>* out) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return OkStatus();
  if (!it->is_number_integer()) return WrongType(field, "an integer", *it);
  if (it->is_number_unsigned() &&
      it->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    return InvalidArgument("'" + std::string(field) + "' is out of range");
  *out = it->get<int64_t>();
  return OkStatus();
}

Status GetNumber(const json& obj, const char* field, std::optional<double>* out) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return OkStatus();
  if (!it->is_number()) return WrongType(field, "a number", *it);
  *out = it->get<double>();
  return OkStatus();
}

Status GetBool(const json& obj, const char* field, bool* out) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return OkStatus();
  if (!it->is_boolean()) return WrongType(field, "a boolean", *it);
  *out = it->get<bool>();
  return OkStatus();
}

Status GetString(const json& obj, const char* field, std::string* out) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return OkStatus();
  if (!it->is_string()) return WrongType(field, "a string", *it);
  *out = it->get<std::string>();
  return OkStatus();
}

Result<json> ParseObject(std::string_view body) {
  json doc;
  try {
    doc = json::parse(body);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("request body is not valid JSON: ") + e.what());
  }
  if (!doc.is_object())
    return InvalidArgument("request body must be a JSON object, got " + TypeOf(doc));
  return doc;
}

Status CheckModel(const json& doc, const ProtocolLimits& limits, std::string* model) {
  RETURN_IF_ERROR(GetString(doc, "model", model));
  if (!model->empty() && *model != limits.served_model_name) {
    return NotFound("The model `" + *model + "` does not exist (this server serves `" +
                    limits.served_model_name + "`)");
  }
  return OkStatus();
}

Status ParseTokenIds(const json& arr, std::string_view field, const ProtocolLimits& limits,
                     std::vector<int32_t>* ids) {
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& v = arr[i];
    std::string name = std::string(field) + "[" + std::to_string(i) + "]";
    if (!v.is_number_integer()) return WrongType(name, "a token id (integer)", v);
    int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)
                     ? std::numeric_limits<int64_t>::max()
                     : v.get<int64_t>();
    if (id < 0 || id >= limits.vocab_size) {
      return InvalidArgument("'" + name + "' = " + v.dump() + " is outside the vocabulary [0, " +
                             std::to_string(limits.vocab_size) + ")");
    }
    ids->push_back(static_cast<int32_t>(id));
  }
  return OkStatus();
}

Status ParsePrompt(const json& doc, const ProtocolLimits& limits, GenerateRequest* req) {
  auto it = doc.find("prompt");
  if (it == doc.end() || it->is_null()) return InvalidArgument("'prompt' is required");
  const json& p = *it;
  if (p.is_string()) {
    req->prompt_text = p.get<std::string>();
  } else if (p.is_array()) {
    if (p.empty()) return InvalidArgument("'prompt' must not be empty");
    if (p[0].is_string()) {
      if (p.size() != 1)
        return InvalidArgument("'prompt' with " + std::to_string(p.size()) +
                               " strings is not supported: send one prompt per request");
      req->prompt_text = p[0].get<std::string>();
    } else if (p[0].is_array()) {
      if (p.size() != 1)
        return InvalidArgument("'prompt' with " + std::to_string(p.size()) +
                               " token lists is not supported: send one prompt per request");
      if (p[0].empty()) return InvalidArgument("'prompt' must not be empty");
      RETURN_IF_ERROR(ParseTokenIds(p[0], "prompt[0]", limits, &req->prompt_ids));
    } else {
      RETURN_IF_ERROR(ParseTokenIds(p, "prompt", limits, &req->prompt_ids));
    }
  } else {
    return WrongType("prompt", "a string, a list of one string or a list of token ids", p);
  }
  if (req->prompt_text && req->prompt_text->empty())
    return InvalidArgument("'prompt' must not be empty");
  return OkStatus();
}

Status ParseStop(const json& doc, const ProtocolLimits& limits, std::vector<std::string>* stop) {
  auto it = doc.find("stop");
  if (it == doc.end() || it->is_null()) return OkStatus();
  if (it->is_string()) {
    stop->push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      if (!(*it)[i].is_string())
        return WrongType("stop[" + std::to_string(i) + "]", "a string", (*it)[i]);
      stop->push_back((*it)[i].get<std::string>());
    }
  } else {
    return WrongType("stop", "a string or a list of strings", *it);
  }
  if (stop->size() > static_cast<size_t>(limits.max_stop_strings))
    return InvalidArgument("'stop' has " + std::to_string(stop->size()) + " strings; at most " +
                           std::to_string(limits.max_stop_strings) + " are allowed");
  for (const std::string& s : *stop) {
    if (s.empty()) return InvalidArgument("'stop' strings must not be empty");
    if (s.size() > limits.max_stop_string_bytes)
      return InvalidArgument("'stop' strings must be at most " +
                             std::to_string(limits.max_stop_string_bytes) + " bytes");
  }
  return OkStatus();
}

// Values we do not support: n and best_of other than 1, penalties other than 0, a non-empty
// logit_bias (each would otherwise be ignored silently).
Status CheckUnsupported(const json& doc) {
  auto bias = doc.find("logit_bias");
  if (bias != doc.end() && !bias->is_null() && !(bias->is_object() && bias->empty()))
    return InvalidArgument("'logit_bias' is not supported (only an empty object or null)");
  std::optional<int64_t> n, best_of;
  RETURN_IF_ERROR(GetInt(doc, "n", &n));
  if (n && *n != 1)
    return InvalidArgument("'n' = " + std::to_string(*n) + " is not supported (only n = 1)");
  RETURN_IF_ERROR(GetInt(doc, "best_of", &best_of));
  if (best_of && *best_of != 1)
    return InvalidArgument("'best_of' = " + std::to_string(*best_of) +
                           " is not supported (only 1)");
  for (const char* penalty : {"presence_penalty", "frequency_penalty"}) {
    std::optional<double> v;
    RETURN_IF_ERROR(GetNumber(doc, penalty, &v));
    if (v && *v != 0.0)
      return InvalidArgument(std::string("'") + penalty + "' is not supported (only 0)");
  }
  return OkStatus();
}

// max_tokens (chat also takes max_completion_tokens), temperature, top_p, top_k, seed, ignore_eos.
Status ParseSampling(const json& doc, const ProtocolLimits& limits, GenerateRequest* req) {
  std::optional<int64_t> max_tokens, top_k, seed;
  RETURN_IF_ERROR(GetInt(doc, "max_tokens", &max_tokens));
  if (req->kind == ApiKind::kChat && !max_tokens)
    RETURN_IF_ERROR(GetInt(doc, "max_completion_tokens", &max_tokens));
  if (max_tokens) {
    if (*max_tokens < 1)
      return InvalidArgument("'max_tokens' must be at least 1, got " + std::to_string(*max_tokens));
    if (*max_tokens > std::numeric_limits<int>::max() / 2)
      return InvalidArgument("'max_tokens' = " + std::to_string(*max_tokens) + " is too large");
    req->max_tokens = static_cast<int>(*max_tokens);
  }
  std::optional<double> temperature, top_p;
  RETURN_IF_ERROR(GetNumber(doc, "temperature", &temperature));
  if (temperature) {
    if (!(*temperature >= 0.0 && *temperature <= 100.0))
      return InvalidArgument("'temperature' must be in [0, 100], got " +
                             std::to_string(*temperature));
    req->sampling.temperature = static_cast<float>(*temperature);
  }
  RETURN_IF_ERROR(GetNumber(doc, "top_p", &top_p));
  if (top_p) {
    if (!(*top_p > 0.0 && *top_p <= 1.0))
      return InvalidArgument("'top_p' must be in (0, 1], got " + std::to_string(*top_p));
    req->sampling.top_p = static_cast<float>(*top_p);
  }
  RETURN_IF_ERROR(GetInt(doc, "top_k", &top_k));
  if (top_k) {
    if (*top_k < -1 || *top_k > limits.vocab_size)
      return InvalidArgument("'top_k' must be -1, 0 or in [1, vocab size], got " +
                             std::to_string(*top_k));
    req->sampling.top_k = static_cast<int>(*top_k);
  }
  RETURN_IF_ERROR(GetInt(doc, "seed", &seed));
  if (seed) req->sampling.seed = static_cast<uint64_t>(*seed);
  RETURN_IF_ERROR(GetBool(doc, "ignore_eos", &req->sampling.ignore_eos));
  return OkStatus();
}

// Fields shared by both APIs: sampling, streaming and the unsupported-value checks.
Status ParseCommon(const json& doc, const ProtocolLimits& limits, GenerateRequest* req) {
  RETURN_IF_ERROR(CheckUnsupported(doc));
  RETURN_IF_ERROR(ParseSampling(doc, limits, req));
  RETURN_IF_ERROR(GetBool(doc, "return_tokens_as_token_ids", &req->return_tokens_as_token_ids));
  RETURN_IF_ERROR(GetBool(doc, "skip_special_tokens", &req->skip_special_tokens));
  RETURN_IF_ERROR(ParseStop(doc, limits, &req->stop));
  auto stop_ids = doc.find("stop_token_ids");
  if (stop_ids != doc.end() && !stop_ids->is_null()) {
    if (!stop_ids->is_array()) return WrongType("stop_token_ids", "a list of token ids", *stop_ids);
    if (stop_ids->size() > static_cast<size_t>(limits.max_stop_token_ids))
      return InvalidArgument("'stop_token_ids' has " + std::to_string(stop_ids->size()) +
                             " ids; at most " + std::to_string(limits.max_stop_token_ids) +
                             " are allowed");
    RETURN_IF_ERROR(
        ParseTokenIds(*stop_ids, "stop_token_ids", limits, &req->sampling.stop_token_ids));
  }
  RETURN_IF_ERROR(GetBool(doc, "stream", &req->stream));
  auto so = doc.find("stream_options");
  if (so != doc.end() && !so->is_null()) {
    if (!req->stream)
      return InvalidArgument("'stream_options' can only be set when 'stream' is true");
    if (!so->is_object()) return WrongType("stream_options", "an object", *so);
    RETURN_IF_ERROR(GetBool(*so, "include_usage", &req->include_usage));
  }
  return OkStatus();
}

Status ParseLogprobs(const json& doc, const ProtocolLimits& limits, GenerateRequest* req) {
  std::optional<int64_t> n;
  if (req->kind == ApiKind::kCompletion) {
    RETURN_IF_ERROR(GetInt(doc, "logprobs", &n));
  } else {
    bool want = false;
    RETURN_IF_ERROR(GetBool(doc, "logprobs", &want));
    RETURN_IF_ERROR(GetInt(doc, "top_logprobs", &n));
    if (n && !want) return InvalidArgument("'top_logprobs' requires 'logprobs' to be true");
    if (want && !n) n = 0;
  }
  if (!n) return OkStatus();
  const char* field = req->kind == ApiKind::kCompletion ? "logprobs" : "top_logprobs";
  if (*n < 0 || *n > limits.max_logprobs)
    return InvalidArgument(std::string("'") + field + "' must be in [0, " +
                           std::to_string(limits.max_logprobs) + "], got " + std::to_string(*n));
  req->num_logprobs = static_cast<int>(*n);
  return OkStatus();
}

}  // namespace

Result<GenerateRequest> ParseGenerateRequest(ApiKind kind, std::string_view body,
                                             const ProtocolLimits& limits) {
  ASSIGN_OR_RETURN(json doc, ParseObject(body));
  GenerateRequest req;
  req.kind = kind;
  RETURN_IF_ERROR(CheckModel(doc, limits, &req.model));
  if (kind == ApiKind::kCompletion) {
    bool echo = false;
    RETURN_IF_ERROR(GetBool(doc, "echo", &echo));
    if (echo) return InvalidArgument("'echo' = true is not supported");
    std::string suffix;
    RETURN_IF_ERROR(GetString(doc, "suffix", &suffix));
    if (!suffix.empty()) return InvalidArgument("'suffix' is not supported");
    RETURN_IF_ERROR(ParsePrompt(doc, limits, &req));
  } else {
    ASSIGN_OR_RETURN(req.chat, ParseChatInput(body, &req.tool_choice));
  }
  ASSIGN_OR_RETURN(req.structured, ParseStructuredOutput(doc, body));
  RETURN_IF_ERROR(ParseCommon(doc, limits, &req));
  RETURN_IF_ERROR(ParseLogprobs(doc, limits, &req));
  return req;
}

Status FinalizeGenerateRequest(const std::vector<int32_t>& prompt_ids, const ProtocolLimits& limits,
                               GenerateRequest* request) {
  if (prompt_ids.empty()) return InvalidArgument("the prompt is empty after tokenisation");
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    if (prompt_ids[i] < 0 || prompt_ids[i] >= limits.vocab_size)
      return InvalidArgument("prompt token " + std::to_string(i) + " = " +
                             std::to_string(prompt_ids[i]) + " is outside the vocabulary [0, " +
                             std::to_string(limits.vocab_size) + ")");
  }
  const int prompt_len = static_cast<int>(prompt_ids.size());
  int max_tokens = 0;
  if (request->max_tokens) {
    max_tokens = *request->max_tokens;
  } else if (request->kind == ApiKind::kCompletion) {
    max_tokens = std::max(1, std::min(16, limits.max_model_len - prompt_len));
  } else {
    max_tokens = std::max(1, limits.max_model_len - prompt_len);
  }
  if (int64_t(prompt_len) + max_tokens > limits.max_model_len) {
    const char* what = request->kind == ApiKind::kChat ? "messages" : "prompt";
    return InvalidArgument(
        "This model's maximum context length is " + std::to_string(limits.max_model_len) +
        " tokens. However, you requested " + std::to_string(int64_t(prompt_len) + max_tokens) +
        " tokens (" + std::to_string(prompt_len) + " in the " + what + ", " +
        std::to_string(max_tokens) + " for 'max_tokens'). Please reduce the length of the " + what +
        " or 'max_tokens'.");
  }
  request->sampling.max_tokens = max_tokens;
  request->sampling.logprobs = request->num_logprobs;
  return OkStatus();
}

Result<TokenizeRequest> ParseTokenizeRequest(std::string_view body, const ProtocolLimits& limits) {
  ASSIGN_OR_RETURN(json doc, ParseObject(body));
  std::string model;
  RETURN_IF_ERROR(CheckModel(doc, limits, &model));
  TokenizeRequest req;
  RETURN_IF_ERROR(GetBool(doc, "add_special_tokens", &req.add_special_tokens));
  bool has_prompt = doc.contains("prompt") && !doc["prompt"].is_null();
  bool has_messages = doc.contains("messages") && !doc["messages"].is_null();
  if (has_prompt == has_messages)
    return InvalidArgument("exactly one of 'prompt' and 'messages' is required");
  if (has_prompt) {
    std::string prompt;
    RETURN_IF_ERROR(GetString(doc, "prompt", &prompt));
    req.prompt = std::move(prompt);
  } else {
    ASSIGN_OR_RETURN(req.chat, ParseChatInput(body));
  }
  return req;
}

Result<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body,
                                                    const ProtocolLimits& limits) {
  ASSIGN_OR_RETURN(json doc, ParseObject(body));
  std::string model;
  RETURN_IF_ERROR(CheckModel(doc, limits, &model));
  auto it = doc.find("tokens");
  if (it == doc.end() || it->is_null()) return InvalidArgument("'tokens' is required");
  if (!it->is_array()) return WrongType("tokens", "a list of token ids", *it);
  std::vector<int32_t> ids;
  RETURN_IF_ERROR(ParseTokenIds(*it, "tokens", limits, &ids));
  return ids;
}

int HttpStatusFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    case StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

std::string_view ErrorTypeFor(int http_status) {
  switch (http_status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    default:
      return http_status < 500 ? "invalid_request_error" : "internal_server_error";
  }
}

std::string ErrorBody(int http_status, std::string_view message) {
  json err = {{"message", std::string(message)},
              {"type", std::string(ErrorTypeFor(http_status))},
              {"param", nullptr},
              {"code", http_status}};
  return DumpJson(json{{"error", err}});
}

std::string DumpJson(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace pd::server
