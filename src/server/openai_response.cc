#include "server/openai_response.h"

namespace pd::server {

using json = nlohmann::json;

namespace {

json BytesArray(const std::string& s) {
  json arr = json::array();
  for (unsigned char c : s) arr.push_back(static_cast<int>(c));
  return arr;
}

std::string Event(const json& j) { return "data: " + DumpJson(j) + "\n\n"; }

}  // namespace

json UsageJson(int prompt_tokens, int completion_tokens, int cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

ResponseBuilder::ResponseBuilder(ResponseFormat format, const model::Tokenizer& tokenizer)
    : format_(std::move(format)),
      tokenizer_(tokenizer),
      splitter_(format_.kind == ApiKind::kChat ? format_.reasoning_parser : ReasoningParser::kNone),
      tool_parser_(
          format_.kind == ApiKind::kChat ? format_.tool_call_format : ToolCallFormat::kNone,
          format_.tools) {}

std::string ResponseBuilder::FinishReason(const std::string& reason, int num_tool_calls) {
  return num_tool_calls > 0 && reason == "stop" ? "tool_calls" : reason;
}

static json ToolCallDeltaJson(const ToolCallDelta& call) {
  json tc = {{"index", call.index}};
  if (!call.id.empty()) {
    tc["id"] = call.id;
    tc["type"] = "function";
    tc["function"] = {{"name", call.name}, {"arguments", ""}};
  } else {
    tc["function"] = {{"arguments", call.arguments}};
  }
  return tc;
}

std::vector<json> ResponseBuilder::ChatDeltas(const TextDelta& delta) {
  ReasoningSplitter::Split split = splitter_.Feed(delta.text);
  if (delta.finished) {
    ReasoningSplitter::Split rest = splitter_.Finish();
    split.reasoning += rest.reasoning;
    split.content += rest.content;
  }
  ToolParse parsed = tool_parser_.Feed(split.content);
  if (delta.finished) {
    ToolParse rest = tool_parser_.Finish();
    parsed.content += rest.content;
    for (ToolCallDelta& c : rest.calls) parsed.calls.push_back(std::move(c));
  }
  std::vector<json> out;
  json d = json::object();
  if (!split.reasoning.empty()) d["reasoning_content"] = split.reasoning;
  if (!parsed.content.empty() ||
      (split.reasoning.empty() && parsed.calls.empty() && !delta.finished)) {
    d["content"] = parsed.content;
  }
  if (!d.empty() || parsed.calls.empty()) out.push_back(d);
  for (const ToolCallDelta& c : parsed.calls) {
    out.push_back({{"tool_calls", json::array({ToolCallDeltaJson(c)})}});
  }
  return out;
}

json ResponseBuilder::Base(const char* object) const {
  return {{"id", format_.id},
          {"object", object},
          {"created", format_.created},
          {"model", format_.model}};
}

json ResponseBuilder::StopReason(const TextDelta& delta) {
  if (delta.stop_string) return *delta.stop_string;
  if (delta.stop_token_id) return *delta.stop_token_id;
  return nullptr;
}

json ResponseBuilder::Logprobs(const TextDelta& delta) {
  if (format_.num_logprobs < 0) return nullptr;
  const bool ids = format_.return_tokens_as_token_ids;
  if (format_.kind == ApiKind::kChat) {
    json content = json::array();
    for (const auto& lp : delta.logprobs) {
      std::string token = TokenDisplay(tokenizer_, lp.token_id, ids);
      json top = json::array();
      for (size_t i = 0; i < lp.top.size() && static_cast<int>(i) < format_.num_logprobs; ++i) {
        std::string t = TokenDisplay(tokenizer_, lp.top[i].first, ids);
        top.push_back({{"token", t}, {"logprob", lp.top[i].second}, {"bytes", BytesArray(t)}});
      }
      content.push_back({{"token", token},
                         {"logprob", lp.logprob},
                         {"bytes", BytesArray(token)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  for (const auto& lp : delta.logprobs) {
    std::string token = TokenDisplay(tokenizer_, lp.token_id, ids);
    tokens.push_back(token);
    token_logprobs.push_back(lp.logprob);
    json top = json::object();
    for (size_t i = 0; i < lp.top.size() && static_cast<int>(i) < format_.num_logprobs; ++i)
      top[TokenDisplay(tokenizer_, lp.top[i].first, ids)] = lp.top[i].second;
    if (!top.contains(token)) top[token] = lp.logprob;  // the sampled token is always listed
    top_logprobs.push_back(top);
    offsets.push_back(text_offset_);
    text_offset_ += ids ? 0 : token.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", offsets}};
}

std::string ResponseBuilder::RoleChunk() const {
  json chunk = Base("chat.completion.chunk");
  chunk["choices"] = json::array({{{"index", 0},
                                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
  if (format_.include_usage) chunk["usage"] = nullptr;
  return Event(chunk);
}

std::string ResponseBuilder::Chunk(const TextDelta& delta) {
  json finish = delta.finished ? json(delta.finish_reason) : json(nullptr);
  const char* object = format_.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion";
  if (format_.kind != ApiKind::kChat) {
    json choice = {{"index", 0},
                   {"text", delta.text},
                   {"logprobs", Logprobs(delta)},
                   {"finish_reason", finish}};
    if (delta.finished) choice["stop_reason"] = StopReason(delta);
    json chunk = Base(object);
    chunk["choices"] = json::array({choice});
    if (format_.include_usage) chunk["usage"] = nullptr;
    return Event(chunk);
  }
  std::vector<json> deltas = ChatDeltas(delta);
  if (delta.finished) {  // the calls this delta completed count too
    finish = FinishReason(delta.finish_reason, tool_parser_.num_calls());
  }
  std::string events;
  for (size_t i = 0; i < deltas.size(); ++i) {
    const bool last = i + 1 == deltas.size();
    json choice = {{"index", 0},
                   {"delta", deltas[i]},
                   {"logprobs", i == 0 ? Logprobs(delta) : json(nullptr)},
                   {"finish_reason", last ? finish : json(nullptr)}};
    if (last && delta.finished) choice["stop_reason"] = StopReason(delta);
    json chunk = Base(object);
    chunk["choices"] = json::array({choice});
    if (format_.include_usage) chunk["usage"] = nullptr;
    events += Event(chunk);
  }
  return events;
}

std::string ResponseBuilder::UsageChunk(int prompt_tokens, int completion_tokens,
                                        int cached_tokens) const {
  json chunk = Base(format_.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array();
  chunk["usage"] = UsageJson(prompt_tokens, completion_tokens, cached_tokens);
  return Event(chunk);
}

void ResponseBuilder::Accumulate(const TextDelta& delta) {
  text_ += delta.text;
  json lp = Logprobs(delta);
  if (!lp.is_null()) {
    if (logprobs_.is_null()) {
      logprobs_ = lp;
    } else {
      for (auto& [key, value] : lp.items())
        for (auto& v : value) logprobs_[key].push_back(v);
    }
  }
  if (delta.finished) {
    finish_reason_ = delta.finish_reason;
    stop_reason_ = StopReason(delta);
  }
}

std::string ResponseBuilder::Final(int prompt_tokens, int completion_tokens,
                                   int cached_tokens) const {
  json logprobs = logprobs_;
  if (format_.num_logprobs >= 0 && logprobs.is_null()) {
    logprobs = format_.kind == ApiKind::kChat ? json{{"content", json::array()}}
                                              : json{{"tokens", json::array()},
                                                     {"token_logprobs", json::array()},
                                                     {"top_logprobs", json::array()},
                                                     {"text_offset", json::array()}};
  }
  json choice;
  json response;
  if (format_.kind == ApiKind::kChat) {
    response = Base("chat.completion");
    json message = {{"role", "assistant"}, {"content", text_}};
    ReasoningSplitter splitter(format_.reasoning_parser);
    ReasoningSplitter::Split split = splitter.Feed(text_);
    ReasoningSplitter::Split rest = splitter.Finish();
    split.reasoning += rest.reasoning;
    split.content += rest.content;
    if (format_.reasoning_parser != ReasoningParser::kNone) {
      message["content"] = split.content.empty() ? json(nullptr) : json(split.content);
      message["reasoning_content"] =
          split.reasoning.empty() ? json(nullptr) : json(split.reasoning);
    }
    int num_calls = 0;
    if (format_.tool_call_format != ToolCallFormat::kNone) {
      ToolCallParser parser(format_.tool_call_format, format_.tools);
      ToolParse parsed = parser.Feed(split.content);
      ToolParse tail = parser.Finish();
      parsed.content += tail.content;
      for (ToolCallDelta& c : tail.calls) parsed.calls.push_back(std::move(c));
      json calls = json::array();
      for (const ToolCallDelta& c : parsed.calls) {
        if (!c.id.empty()) {
          calls.push_back({{"id", c.id},
                           {"type", "function"},
                           {"function", {{"name", c.name}, {"arguments", ""}}}});
        } else {
          calls.back()["function"]["arguments"] =
              calls.back()["function"]["arguments"].get<std::string>() + c.arguments;
        }
      }
      num_calls = parser.num_calls();
      message["content"] = parsed.content.empty() && (num_calls > 0 || format_.reasoning_parser !=
                                                                           ReasoningParser::kNone)
                               ? json(nullptr)
                               : json(parsed.content);
      if (num_calls > 0) message["tool_calls"] = calls;
    }
    choice = {{"index", 0},
              {"message", message},
              {"logprobs", logprobs},
              {"finish_reason", FinishReason(finish_reason_, num_calls)},
              {"stop_reason", stop_reason_}};
  } else {
    response = Base("text_completion");
    choice = {{"index", 0},
              {"text", text_},
              {"logprobs", logprobs},
              {"finish_reason", finish_reason_},
              {"stop_reason", stop_reason_}};
  }
  response["choices"] = json::array({choice});
  response["usage"] = UsageJson(prompt_tokens, completion_tokens, cached_tokens);
  return DumpJson(response);
}

}  // namespace pd::server
