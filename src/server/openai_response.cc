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

json UsageJson(int prompt_tokens, int completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

ResponseBuilder::ResponseBuilder(ResponseFormat format, const model::Tokenizer& tokenizer)
    : format_(std::move(format)),
      tokenizer_(tokenizer),
      splitter_(format_.kind == ApiKind::kChat ? format_.reasoning_parser
                                               : ReasoningParser::kNone) {}

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
  json choice;
  if (format_.kind == ApiKind::kChat) {
    json d = json::object();
    ReasoningSplitter::Split split = splitter_.Feed(delta.text);
    if (delta.finished) {
      ReasoningSplitter::Split rest = splitter_.Finish();
      split.reasoning += rest.reasoning;
      split.content += rest.content;
    }
    if (!split.reasoning.empty()) d["reasoning_content"] = split.reasoning;
    if (!split.content.empty() || (split.reasoning.empty() && !delta.finished)) {
      d["content"] = split.content;
    }
    choice = {{"index", 0}, {"delta", d}, {"logprobs", Logprobs(delta)}, {"finish_reason", finish}};
  } else {
    choice = {{"index", 0},
              {"text", delta.text},
              {"logprobs", Logprobs(delta)},
              {"finish_reason", finish}};
  }
  if (delta.finished) choice["stop_reason"] = StopReason(delta);
  json chunk = Base(format_.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array({choice});
  if (format_.include_usage) chunk["usage"] = nullptr;
  return Event(chunk);
}

std::string ResponseBuilder::UsageChunk(int prompt_tokens, int completion_tokens) const {
  json chunk = Base(format_.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array();
  chunk["usage"] = UsageJson(prompt_tokens, completion_tokens);
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

std::string ResponseBuilder::Final(int prompt_tokens, int completion_tokens) const {
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
    if (format_.reasoning_parser != ReasoningParser::kNone) {
      ReasoningSplitter splitter(format_.reasoning_parser);
      ReasoningSplitter::Split split = splitter.Feed(text_);
      ReasoningSplitter::Split rest = splitter.Finish();
      split.reasoning += rest.reasoning;
      split.content += rest.content;
      message["content"] = split.content.empty() ? json(nullptr) : json(split.content);
      message["reasoning_content"] =
          split.reasoning.empty() ? json(nullptr) : json(split.reasoning);
    }
    choice = {{"index", 0},
              {"message", message},
              {"logprobs", logprobs},
              {"finish_reason", finish_reason_},
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
  response["usage"] = UsageJson(prompt_tokens, completion_tokens);
  return DumpJson(response);
}

}  // namespace pd::server
