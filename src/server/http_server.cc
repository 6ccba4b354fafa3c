#include "server/http_server.h"

#include <chrono>
#include <cstdio>
#include <ctime>

#include "common/log.h"
#include "common/rate_limited_log.h"
#include "common/thread_util.h"
#include "constrain/token_texts.h"
#include "server/auth.h"
#include "server/drain.h"
#include "server/generation.h"
#include "server/kv_events_wire.h"
#include "server/openai_response.h"
#include "server/prompt_tokens.h"

namespace pd::server {

using json = nlohmann::json;

namespace {

int64_t UnixSeconds() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace

// What a generation response keeps between calls of its content provider.
struct StreamState {
  std::unique_ptr<Generation> generation;
  std::unique_ptr<ResponseBuilder> builder;
  std::unique_ptr<InflightCap::Slot> slot;
  bool stream = false;
  bool role_sent = false;
  bool include_usage = false;
  bool first_token_written = false;
};

struct OpenAiServer::Answer {
  std::shared_ptr<StreamState> state;
  std::unique_ptr<ClientStream> client;
  // Set by the engine's callback when it posts a pump, cleared by the pump: one post per burst.
  std::shared_ptr<std::atomic<bool>> pump_posted = std::make_shared<std::atomic<bool>>(false);
  bool ended = false;
};

OpenAiServer::OpenAiServer(const ServerOptions& options, engine::AsyncEngine* engine,
                           const model::Tokenizer* tokenizer)
    : options_(options),
      engine_(engine),
      tokenizer_(tokenizer),
      metrics_(options.served_model_name),
      http_(options.http),
      inflight_(options.max_inflight_requests),
      start_time_(UnixSeconds()) {
  limits_.served_model_name = options.served_model_name;
  limits_.max_model_len = options.max_model_len;
  limits_.vocab_size = tokenizer->vocab_size();
  limits_.max_logprobs = options.max_logprobs;
  token_texts_ = constrain::TokenTextsOf(*tokenizer);
  structured_ = std::make_unique<constrain::StructuredOutputCompiler>(token_texts_);
}

Status OpenAiServer::ApplyStructuredOutput(GenerateRequest* request, ResponseFormat* format) const {
  if (request->structured.kind == constrain::StructuredOutput::Kind::kNone) return OkStatus();
  if (request->sampling.constraint != nullptr)
    return InvalidArgument("'" + request->structured.field +
                           "' cannot be combined with a forced tool call (tool_choice)");
  ASSIGN_OR_RETURN(request->sampling.constraint, structured_->Compile(request->structured));
  // The reply is the structured text from its first token: no reasoning part to split off.
  format->reasoning_parser = ReasoningParser::kNone;
  return OkStatus();
}

Status OpenAiServer::ApplyToolChoice(GenerateRequest* request, ResponseFormat* format) const {
  if (request->kind != ApiKind::kChat || request->chat.tools.is_null() ||
      request->tool_choice.mode == ToolChoice::Mode::kNone) {
    return OkStatus();
  }
  format->tool_call_format = options_.tool_call_format;
  format->tools = request->chat.tools;
  if (!request->tool_choice.forces_call()) return OkStatus();
  std::vector<std::string> names;
  if (request->tool_choice.mode == ToolChoice::Mode::kFunction) {
    names.push_back(request->tool_choice.function);
  } else {
    for (const auto& t : request->chat.tools) names.push_back(t["function"]["name"]);
  }
  ASSIGN_OR_RETURN(request->sampling.constraint,
                   ForcedCallConstraint(options_.tool_call_format, names, token_texts_));
  // The reply is the call by construction: no reasoning part to split off.
  format->reasoning_parser = ReasoningParser::kNone;
  return OkStatus();
}

Result<std::unique_ptr<OpenAiServer>> OpenAiServer::Create(const ServerOptions& options,
                                                           engine::AsyncEngine* engine,
                                                           const model::Tokenizer* tokenizer) {
  if (engine == nullptr || tokenizer == nullptr)
    return InvalidArgument("server: engine and tokenizer are required");
  if (options.served_model_name.empty())
    return InvalidArgument("server: served model name is empty");
  if (options.max_model_len < 2) return InvalidArgument("server: max_model_len must be at least 2");
  if (options.http.num_threads < 1)
    return InvalidArgument("server: at least one HTTP thread is required");
  std::unique_ptr<OpenAiServer> server(new OpenAiServer(options, engine, tokenizer));
  if (options.kv_events != nullptr)
    server->tokenizer_fingerprint_ = TokenizerFingerprint(*tokenizer);
  server->metrics_.registry.AddCollectHook([s = server.get()] {
    const engine::EngineStats stats = s->engine_->stats();
    const Labels labels = s->metrics_.model_labels();
    s->metrics_.num_running->Set(labels, stats.num_running);
    s->metrics_.num_waiting->Set(labels, stats.num_waiting);
    s->metrics_.kv_cache_usage->Set(labels, stats.kv_cache_usage());
    s->metrics_.prefix_cache_queries->SetTotal(labels,
                                               static_cast<double>(stats.prefix_cache_queries));
    s->metrics_.prefix_cache_hits->SetTotal(labels, static_cast<double>(stats.prefix_cache_hits));
    const engine::SpecDecodeCounters& spec = stats.spec_decode;
    s->metrics_.spec_decode_num_drafts->SetTotal(labels, static_cast<double>(spec.num_drafts));
    s->metrics_.spec_decode_num_draft_tokens->SetTotal(labels,
                                                       static_cast<double>(spec.num_draft_tokens));
    s->metrics_.spec_decode_num_accepted_tokens->SetTotal(
        labels, static_cast<double>(spec.num_accepted_tokens));
    s->metrics_.spec_decode_draft_prompt_tokens->SetTotal(
        labels, static_cast<double>(spec.num_draft_prompt_tokens));
    for (size_t pos = 0; pos < spec.accepted_per_pos.size(); ++pos) {
      Labels l = labels;
      l.emplace_back("position", std::to_string(pos));
      s->metrics_.spec_decode_num_accepted_tokens_per_pos->SetTotal(
          l, static_cast<double>(spec.accepted_per_pos[pos]));
    }
  });
  EventLoopOptions lo;
  lo.thread_name = "pd-answers";
  lo.on_tick = [s = server.get()] {
    const auto now = std::chrono::steady_clock::now();
    for (auto& [id, stream] : s->answers_) stream->client->CheckStalled(now);
  };
  ASSIGN_OR_RETURN(server->answer_loop_, EventLoop::Create(lo));
  server->RegisterRoutes();
  return server;
}

OpenAiServer::~OpenAiServer() { Stop(); }

Status OpenAiServer::Start() {
  if (options_.port == 0) {
    port_ = http_.bind_to_any_port(options_.host);
    if (port_ <= 0) return Unavailable("server: cannot bind " + options_.host + " to any port");
  } else {
    if (!http_.bind_to_port(options_.host, options_.port))
      return Unavailable("server: cannot bind " + options_.host + ":" +
                         std::to_string(options_.port));
    port_ = options_.port;
  }
  http_.SetListenBacklog(1024);
  listen_thread_ = std::thread([this] {
    (void)SetCurrentThreadLatencySensitive();  // best effort: it accepts every connection
    http_.listen_after_bind();
  });
  // Every thread exists once Start returns (so a caller can see, pin or count them).
  if (!http_.WaitListening(std::chrono::seconds(10)))
    return Internal("server: HTTP threads did not start");
  PD_LOG_INFO("serving {} on http://{}:{}", options_.served_model_name, options_.host, port_);
  return OkStatus();
}

void OpenAiServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (options_.kv_events != nullptr) options_.kv_events->Close();  // ends the waiting polls
  http_.stop();
  if (listen_thread_.joinable()) listen_thread_.join();
  if (answer_loop_ != nullptr) {  // after the HTTP threads: none hands a stream over any more
    // Destroying a stream's generation aborts its engine request; its client sees the close.
    answer_loop_->Post([this] { answers_.clear(); });
    answer_loop_->Stop();
  }
}

void OpenAiServer::EndRunning(const std::string& why) {
  answer_loop_->Post([this, why] {
    for (auto& [id, answer] : answers_) {
      if (answer->ended) continue;
      answer->ended = true;
      ClientStream& client = *answer->client;
      if (answer->state->stream) {
        client.WriteChunk("data: " + ErrorBody(503, why) + "\n\n");
        client.EndChunked();
      } else {
        const std::string body = ErrorBody(503, why);
        client.WriteHead(503, "Content-Type: application/json\r\nContent-Length: " +
                                  std::to_string(body.size()) + "\r\n");
        client.Write(body);
        client.End();
      }
    }
  });
}

void OpenAiServer::SendError(httplib::Response& res, int http_status,
                             const std::string& message) const {
  res.status = http_status;
  if (http_status == 429 || http_status == 503)
    res.set_header("Retry-After", std::to_string(options_.http.retry_after_s));
  if (http_status == 401 || http_status == 429 || http_status == 503) {  // refusals, not mistakes
    PD_LOG_WARN_EVERY_N_SEC(10.0, std::to_string(http_status), "http: answered {}: {}", http_status,
                            message);
  }
  res.set_content(ErrorBody(http_status, message), "application/json");
}

void OpenAiServer::SendStatus(httplib::Response& res, const Status& status) const {
  SendError(res, HttpStatusFor(status), status.message());
}

bool OpenAiServer::Authorized(const httplib::Request& req, httplib::Response& res) const {
  if (options_.api_key.empty()) return true;
  if (BearerMatches(req.get_header_value("Authorization"), options_.api_key)) return true;
  SendError(res, 401,
            req.has_header("Authorization") ? "invalid API key"
                                            : "missing 'Authorization: Bearer <api key>' header");
  return false;
}

void OpenAiServer::RegisterRoutes() {
  http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping_) return SendError(res, 503, "server is shutting down");
    if (draining_) return SendError(res, 503, "server is draining (shutting down)");
    res.status = 200;
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string text = metrics_.registry.Render() + http_.RefusedMetricsText();
    if (options_.extra_metrics) text += options_.extra_metrics();
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });
  http_.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (Authorized(req, res)) HandleModels(res);
  });
  http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(ApiKind::kCompletion, req, res);
  });
  http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(ApiKind::kChat, req, res);
  });
  http_.Get("/v1/kv_events", [this](const httplib::Request& req, httplib::Response& res) {
    if (Authorized(req, res)) HandleKvEvents(options_.kv_events, tokenizer_fingerprint_, req, res);
  });
  http_.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    HandleTokenize(req, res);
  });
  http_.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    HandleDetokenize(req, res);
  });
}

void OpenAiServer::HandleModels(httplib::Response& res) const {
  json model = {{"id", options_.served_model_name},
                {"object", "model"},
                {"created", start_time_},
                {"owned_by", "pdserve"},
                {"root", options_.model_path},
                {"parent", nullptr},
                {"max_model_len", options_.max_model_len}};
  res.set_content(DumpJson(json{{"object", "list"}, {"data", json::array({model})}}),
                  "application/json");
}

std::vector<int32_t> OpenAiServer::EncodePrompt(const std::string& text,
                                                bool add_special_tokens) const {
  return EncodePromptText(*tokenizer_, text, add_special_tokens);
}

Result<std::vector<int32_t>> OpenAiServer::Tokenize(const GenerateRequest& request) const {
  return PromptTokens(*tokenizer_, request);
}

void OpenAiServer::HandleGenerate(ApiKind kind, const httplib::Request& req,
                                  httplib::Response& res) {
  std::shared_ptr<StreamState> state = StartGeneration(kind, req, res);
  if (state == nullptr) return;  // the error response is set
  const bool detached = LimitedHttpServer::DetachCurrentConnection([this, state](
                                                                       int fd, int requests_left) {
    answer_loop_->Post([this, state, fd, requests_left] { StartAnswer(fd, requests_left, state); });
  });
  if (!detached) return SendError(res, 500, "the request cannot be handed to the answer loop");
  res.status = 200;  // the answer loop writes the real answer
}

std::shared_ptr<StreamState> OpenAiServer::StartGeneration(ApiKind kind,
                                                           const httplib::Request& req,
                                                           httplib::Response& res) {
  TraceInstant(options_.tracer, "http request", "http");
  if (!Authorized(req, res)) return nullptr;
  if (draining_) {  // not started: a router may send it to another instance
    res.set_header(kDrainingHeader, "1");
    SendError(res, 503, "server is draining (shutting down); retry on another instance");
    return nullptr;
  }
  if (req.body.size() > options_.http.max_body_bytes) {
    SendError(res, 413,
              "request body exceeds the limit of " + std::to_string(options_.http.max_body_bytes) +
                  " bytes");
    return nullptr;
  }
  auto parsed = ParseGenerateRequest(kind, req.body, limits_);
  if (!parsed.ok()) return SendStatus(res, parsed.status()), nullptr;
  GenerateRequest request = std::move(parsed).value();
  ResponseFormat format;
  format.reasoning_parser = options_.reasoning_parser;
  if (Status st = ApplyToolChoice(&request, &format); !st.ok()) return SendStatus(res, st), nullptr;
  if (Status st = ApplyStructuredOutput(&request, &format); !st.ok())
    return SendStatus(res, st), nullptr;
  auto ids = Tokenize(request);
  if (!ids.ok()) return SendStatus(res, ids.status()), nullptr;
  TraceInstant(options_.tracer, "tokenized", "http");
  if (Status st = FinalizeGenerateRequest(*ids, limits_, &request); !st.ok())
    return SendStatus(res, st), nullptr;
  if (stopping_) return SendError(res, 503, "server is shutting down"), nullptr;
  auto state = std::make_shared<StreamState>();
  state->slot = inflight_.TryAcquireSlot();  // checked and taken at once
  if (state->slot == nullptr) {
    SendError(res, 503,
              "server overloaded: " + std::to_string(options_.max_inflight_requests) +
                  " requests in flight (--max-inflight-requests); retry later");
    return nullptr;
  }
  auto started =
      Generation::Start(*engine_, *tokenizer_, metrics_, std::move(ids).value(), request);
  if (!started.ok()) {
    const Status& st = started.status();
    if (st.code() == StatusCode::kResourceExhausted) {
      SendError(res, 429, "server overloaded: " + st.message() + "; retry later");
    } else {
      SendStatus(res, st);
    }
    return nullptr;
  }
  TraceInstant(options_.tracer, "engine submitted", "http");
  format.kind = kind;
  char id[48];
  std::snprintf(id, sizeof(id), "%s-%016llx%08llx", kind == ApiKind::kChat ? "chatcmpl" : "cmpl",
                static_cast<unsigned long long>(next_id_.fetch_add(1)),
                static_cast<unsigned long long>(start_time_ & 0xffffffff));
  format.id = id;
  format.created = UnixSeconds();
  format.model = options_.served_model_name;
  format.num_logprobs = request.num_logprobs;
  format.return_tokens_as_token_ids = request.return_tokens_as_token_ids;
  format.include_usage = request.include_usage;
  state->generation = std::move(started).value();
  state->builder = std::make_unique<ResponseBuilder>(format, *tokenizer_);
  state->stream = request.stream;
  state->include_usage = request.include_usage;
  state->role_sent = kind != ApiKind::kChat;
  return state;
}

void OpenAiServer::StartAnswer(int fd, int requests_left, std::shared_ptr<StreamState> state) {
  const uint64_t id = next_answer_id_++;
  auto stream = std::make_unique<Answer>();
  stream->state = std::move(state);
  ClientStream::Options co;
  co.write_timeout_ms = options_.http.write_timeout_ms;
  if (requests_left > 0) {  // kept alive: the client's next request goes back to the HTTP pool
    co.on_reusable = [this, requests_left](int conn) {
      http_.ResumeConnection(conn, requests_left);
    };
  }
  // Closed: written out, or the client went away. Freed after this event; destroying the
  // generation aborts an unfinished engine request.
  co.on_closed = [this, id](bool) { answer_loop_->Post([this, id] { answers_.erase(id); }); };
  stream->client = std::make_unique<ClientStream>(*answer_loop_, fd, std::move(co));
  if (stream->state->stream) {
    stream->client->WriteHead(200,
                              "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                              "Transfer-Encoding: chunked\r\n");
  }
  Answer* raw = stream.get();
  answers_.emplace(id, std::move(stream));
  raw->state->generation->SetOnNews(
      [this, id, loop = answer_loop_.get(), posted = raw->pump_posted] {
        if (!posted->exchange(true)) loop->Post([this, id] { PumpAnswer(id); });
      });
  PumpAnswer(id);  // the role chunk, and whatever arrived already
}

void OpenAiServer::PumpAnswer(uint64_t id) {
  auto it = answers_.find(id);
  if (it == answers_.end() || it->second->ended) return;
  Answer& stream = *it->second;
  stream.pump_posted->store(false);
  if (WriteReadyEvents(*stream.state, *stream.client)) stream.ended = true;
}

// Writes every SSE event the generation has ready, without waiting; true when the stream ended
// (the connection closes once it is written out).
bool OpenAiServer::WriteReadyEvents(StreamState& state, ClientStream& client) {
  if (!state.stream) return WriteWholeIfDone(state, client);
  if (!state.role_sent) {
    state.role_sent = true;
    client.WriteChunk(state.builder->RoleChunk());
  }
  Generation& gen = *state.generation;
  // The request's engine id on the instant (the messenger's "prefill request sent" names it
  // too), so a trace pairs a request's first and last token with its client (issue #7).
  auto trace_written = [&](std::string_view what) {
    if (options_.tracer != nullptr)
      options_.tracer->Instant(what, "http", {{"request", gen.request_id()}});
  };
  for (const TextDelta& delta : gen.Next(std::chrono::milliseconds(0))) {
    client.WriteChunk(
        delta.finish_reason == "error"
            ? "data: " + ErrorBody(500, "generation failed: " + delta.error.message()) + "\n\n"
            : state.builder->Chunk(delta));
    if (!state.first_token_written) trace_written("first token written");
    state.first_token_written = true;
    if (!delta.finished) continue;
    trace_written("last token written");
    const auto stats = gen.stats();
    if (state.include_usage)
      client.WriteChunk(state.builder->UsageChunk(stats.prompt_tokens, stats.completion_tokens,
                                                  stats.cached_tokens));
    client.WriteChunk(ResponseBuilder::DoneEvent());
    client.EndChunked();
    return true;
  }
  return false;
}

namespace {

void WriteJson(ClientStream& client, int status, const std::string& body) {
  client.WriteHead(status, "Content-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n");
  client.Write(body);
  client.End();
}

}  // namespace

bool OpenAiServer::WriteWholeIfDone(StreamState& state, ClientStream& client) {
  Generation& gen = *state.generation;
  for (const TextDelta& delta : gen.Next(std::chrono::milliseconds(0))) {
    if (delta.finished && delta.finish_reason == "error") {
      WriteJson(client, 500, ErrorBody(500, "generation failed: " + delta.error.message()));
      return true;
    }
    state.builder->Accumulate(delta);
  }
  if (!gen.finished()) return false;
  const auto stats = gen.stats();
  WriteJson(
      client, 200,
      state.builder->Final(stats.prompt_tokens, stats.completion_tokens, stats.cached_tokens));
  return true;
}

void OpenAiServer::HandleTokenize(const httplib::Request& req, httplib::Response& res) {
  auto parsed = ParseTokenizeRequest(req.body, limits_);
  if (!parsed.ok()) return SendStatus(res, parsed.status());
  std::vector<int32_t> ids;
  if (parsed->prompt) {
    ids = EncodePrompt(*parsed->prompt, parsed->add_special_tokens);
  } else {
    auto text = tokenizer_->ApplyChatTemplate(parsed->chat);
    if (!text.ok())
      return SendError(res, 400, "cannot apply the chat template: " + text.status().message());
    ids = tokenizer_->Encode(*text);
  }
  json body = {{"count", ids.size()}, {"max_model_len", options_.max_model_len}, {"tokens", ids}};
  res.set_content(DumpJson(body), "application/json");
}

void OpenAiServer::HandleDetokenize(const httplib::Request& req, httplib::Response& res) {
  auto ids = ParseDetokenizeRequest(req.body, limits_);
  if (!ids.ok()) return SendStatus(res, ids.status());
  auto text = tokenizer_->Decode(*ids);
  if (!text.ok()) return SendStatus(res, text.status());
  res.set_content(DumpJson(json{{"prompt", *text}}), "application/json");
}

}  // namespace pd::server
