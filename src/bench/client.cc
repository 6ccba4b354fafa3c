#include "bench/client.h"

#include <httplib.h>
#include <sched.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/clock.h"

namespace pd::bench {

using json = nlohmann::json;

Result<Endpoint> ParseBaseUrl(const std::string& base_url) {
  std::string rest = base_url;
  const std::string scheme = "http://";
  if (rest.rfind(scheme, 0) != 0)
    return InvalidArgument("--base-url must start with http://, got '" + base_url + "'");
  rest = rest.substr(scheme.size());
  rest = rest.substr(0, rest.find('/'));
  Endpoint e;
  size_t colon = rest.rfind(':');
  if (colon == std::string::npos) {
    e.host = rest;
    e.port = 80;
  } else {
    e.host = rest.substr(0, colon);
    char* end = nullptr;
    long port = std::strtol(rest.c_str() + colon + 1, &end, 10);
    if (*end != '\0' || port <= 0 || port > 65535)
      return InvalidArgument("--base-url: bad port in '" + base_url + "'");
    e.port = static_cast<int>(port);
  }
  if (e.host.empty()) return InvalidArgument("--base-url: no host in '" + base_url + "'");
  return e;
}

std::string RequestBody(const GenerationRequest& r) {
  json body = {{"model", r.model},
               {"max_tokens", r.max_tokens},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"ignore_eos", r.ignore_eos},
               {"temperature", 0.0}};
  if (r.path.find("chat") != std::string::npos) {
    json messages = json::array();
    for (const auto& [user, reply] : r.history) {
      messages.push_back({{"role", "user"}, {"content", user}});
      messages.push_back({{"role", "assistant"}, {"content", reply}});
    }
    messages.push_back({{"role", "user"}, {"content", r.prompt_text}});
    body["messages"] = std::move(messages);
  } else if (!r.prompt_ids.empty()) {
    body["prompt"] = r.prompt_ids;
  } else {
    std::string prompt;
    for (const auto& [user, reply] : r.history) prompt += user + "\n" + reply + "\n";
    body["prompt"] = prompt + r.prompt_text;
  }
  return body.dump();
}

void SseTimer::Feed(const char* data, size_t size, double now) {
  buffer_.append(data, size);
  size_t end;
  while ((end = buffer_.find("\n\n")) != std::string::npos) {
    std::string event = buffer_.substr(0, end);
    buffer_.erase(0, end + 2);
    if (event.rfind("data: ", 0) == 0) OnEvent(event.substr(6), now);
  }
}

void SseTimer::OnEvent(const std::string& payload, double now) {
  if (payload == "[DONE]") {
    done_ = true;
    return;
  }
  json j = json::parse(payload, nullptr, false);
  if (j.is_discarded()) {
    error_ = "unparsable SSE event";
    return;
  }
  if (j.contains("error")) {
    error_ = j["error"].value("message", "error event");
    return;
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    prompt_tokens_ = j["usage"].value("prompt_tokens", -1);
    completion_tokens_ = j["usage"].value("completion_tokens", -1);
  }
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
  // Every chunk that carries a choice is a token arrival, as in vllm bench serve, even when its
  // text is empty (a special token, or the first bytes of a multi-byte character held back by the
  // server); only the chat API's opening role chunk is not.
  const json& c = j["choices"][0];
  if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("role")) return;
  if (c.contains("text") && c["text"].is_string()) text_ += c["text"].get<std::string>();
  if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
      c["delta"]["content"].is_string())
    text_ += c["delta"]["content"].get<std::string>();
  ++token_chunks_;
  if (first_ < 0) {
    first_ = now;
  } else {
    itl_.push_back(now - last_);
  }
  last_ = now;
}

void SseTimer::Finish(RequestResult* r) const {
  if (!error_.empty()) r->error = error_;
  if (first_ >= 0) {
    r->ttft = first_ - start_;
    r->first_token_time = first_;
    r->latency = last_ - start_;
  }
  r->itl = itl_;
  r->text = text_;
  if (prompt_tokens_ >= 0) r->prompt_len = prompt_tokens_;
  r->output_len = completion_tokens_ >= 0 ? completion_tokens_ : token_chunks_;
  r->success = done_ && error_.empty() && r->http_status == 200;
  if (!r->success && r->error.empty())
    r->error = done_ ? "HTTP " + std::to_string(r->http_status) : "stream ended early";
}

namespace {

// The calling thread's total time runnable but not running (ns, /proc/thread-self/schedstat's
// second field); -1 when the kernel does not say.
int64_t CurrentThreadRunDelayNs() {
  FILE* f = std::fopen("/proc/thread-self/schedstat", "r");
  if (f == nullptr) return -1;
  unsigned long long run_ns = 0, delay_ns = 0;
  const int n = std::fscanf(f, "%llu %llu", &run_ns, &delay_ns);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(delay_ns) : -1;
}

}  // namespace

RequestResult SendStreaming(const Endpoint& endpoint, const GenerationRequest& request) {
  RequestResult result;
  result.prompt_len = request.prompt_len;
  httplib::Client cli(endpoint.host, endpoint.port);
  cli.set_connection_timeout(endpoint.timeout_s, 0);
  cli.set_read_timeout(endpoint.timeout_s, 0);
  cli.set_keep_alive(false);
  cli.set_tcp_nodelay(true);  // the request goes out at once, not after a delayed ACK
  httplib::Request req;
  req.method = "POST";
  req.path = request.path;
  req.body = RequestBody(request);
  req.set_header("Content-Type", "application/json");
  if (!endpoint.api_key.empty()) req.set_header("Authorization", "Bearer " + endpoint.api_key);
  Clock& clock = SystemClock::Get();
  const double start = clock.NowSeconds();
  SseTimer timer(start);
  int64_t delay_at_headers_ns = -1;
  std::string error_body;
  req.response_handler = [&](const httplib::Response& res) {
    delay_at_headers_ns = CurrentThreadRunDelayNs();
    result.http_status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (result.http_status != 200) {
      if (error_body.size() < 4096) error_body.append(data, n);
      return true;
    }
    const bool had_first = timer.has_first_token();
    timer.Feed(data, n, clock.NowSeconds());
    if (!had_first && timer.has_first_token()) {
      const int64_t delay_ns = CurrentThreadRunDelayNs();
      if (delay_ns >= 0 && delay_at_headers_ns >= 0)
        result.client_run_delay_to_first = (delay_ns - delay_at_headers_ns) * 1e-9;
      result.client_cpu_at_first = sched_getcpu();
    }
    return true;
  };
  auto res = cli.send(req);
  if (!res && result.http_status == 0) {
    result.error = "connection failed: " + httplib::to_string(res.error());
    return result;
  }
  timer.Finish(&result);
  if (result.http_status != 200) {
    json j = json::parse(error_body, nullptr, false);
    result.error =
        "HTTP " + std::to_string(result.http_status) + ": " +
        (!j.is_discarded() && j.contains("error") ? j["error"].value("message", error_body)
                                                  : error_body);
  }
  return result;
}

Result<ServerInfo> GetServerInfo(const Endpoint& endpoint) {
  httplib::Client cli(endpoint.host, endpoint.port);
  cli.set_connection_timeout(10, 0);
  httplib::Headers headers;
  if (!endpoint.api_key.empty()) headers.emplace("Authorization", "Bearer " + endpoint.api_key);
  auto res = cli.Get("/v1/models", headers);
  if (!res)
    return Unavailable("cannot reach http://" + endpoint.host + ":" +
                       std::to_string(endpoint.port) + ": " + httplib::to_string(res.error()));
  if (res->status != 200)
    return Unavailable("GET /v1/models: HTTP " + std::to_string(res->status) + ": " + res->body);
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty())
    return Unavailable("GET /v1/models: unexpected body: " + res->body);
  ServerInfo info;
  info.model_id = j["data"][0].value("id", "");
  info.max_model_len = j["data"][0].value("max_model_len", 0);
  return info;
}

}  // namespace pd::bench
