// The OpenAI-compatible HTTP server of one colocated instance:
//   POST /v1/completions, POST /v1/chat/completions (JSON or SSE streams ending "data: [DONE]"),
//   GET /v1/models, GET /health, GET /metrics, POST /tokenize, POST /detokenize, and
//   GET /v1/kv_events (the prefix cache's keys, kv_events_wire.h).
// HTTP threads read, validate and tokenise a request and submit it to the AsyncEngine, then hand
// the connection to the answer loop: one event-loop thread for every request in flight, woken by
// the engine's callback (through a per-request channel) to write new SSE events, or a whole JSON
// answer once it is complete. No request holds an HTTP thread while it generates, so a few HTTP
// threads serve thousands of open streams. A client that disconnects has its request aborted at
// once.
//
// Thread safety: Start/Stop from one thread; handlers run on the HTTP pool's threads.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/status.h"
#include "common/trace.h"
#include "engine/async_engine.h"
#include "model/tokenizer.h"
#include "server/client_stream.h"
#include "server/event_loop.h"
#include "server/http_transport.h"
#include "server/inflight_cap.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace pd::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see port())
  std::string served_model_name;
  std::string model_path;  // reported by /v1/models
  std::string api_key;     // non-empty: /v1/* need "Authorization: Bearer <api_key>"
  int max_model_len = 4096;
  int max_inflight_requests = 0;  // generation requests in flight; 0: limited by the engine only
  int max_logprobs = 20;
  ReasoningParser reasoning_parser = ReasoningParser::kNone;  // chat replies' reasoning_content
  // Chat replies' tool_calls (--tool-call-parser); with kNone, tool_choice "required" or a named
  // function is a 400.
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
  HttpLimits http;
  // Appended to /metrics (Prometheus text), e.g. a decode instance's KV transfer metrics.
  std::function<std::string()> extra_metrics;
  // Borrowed, may be null: instants along each generation request ("http request", "tokenized",
  // "engine submitted"; a streamed one's "first token written" and "last token written", each
  // with its engine request id as "request").
  Tracer* tracer = nullptr;
  // Borrowed, may be null: the prefix cache's keys, served at GET /v1/kv_events for KV-aware
  // routing (kv_events_wire.h); the server closes it when it stops.
  engine::KvEventLog* kv_events = nullptr;
};

struct StreamState;

class OpenAiServer {
 public:
  // engine and tokenizer are borrowed and must outlive the server.
  static Result<std::unique_ptr<OpenAiServer>> Create(const ServerOptions& options,
                                                      engine::AsyncEngine* engine,
                                                      const model::Tokenizer* tokenizer);
  ~OpenAiServer();

  // Binds and serves on a background thread. Unavailable when the address cannot be bound.
  Status Start();
  // Stops accepting, aborts in-flight requests and joins the HTTP threads. Idempotent.
  void Stop();
  int port() const { return port_; }
  ServingMetrics& metrics() { return metrics_; }

  // Graceful drain (server/drain.h): from BeginDrain on, new generation requests get 503 with
  // Retry-After and kDrainingHeader, and /health 503; requests in flight go on. EndRunning ends
  // every answer still running with a 503 error (an SSE error event and the end of the stream, or
  // a JSON error) carrying `why`, which aborts its engine request.
  void BeginDrain() { draining_ = true; }
  int inflight() const { return inflight_.held(); }
  void EndRunning(const std::string& why);

 private:
  OpenAiServer(const ServerOptions& options, engine::AsyncEngine* engine,
               const model::Tokenizer* tokenizer);
  void RegisterRoutes();
  bool Authorized(const httplib::Request& req, httplib::Response& res) const;
  void HandleGenerate(ApiKind kind, const httplib::Request& req, httplib::Response& res);
  // Validates, tokenises and submits; nullptr after setting an error response.
  std::shared_ptr<StreamState> StartGeneration(ApiKind kind, const httplib::Request& req,
                                               httplib::Response& res);
  // The answer loop's side of a request in flight (loop thread only).
  struct Answer;
  void StartAnswer(int fd, int requests_left, std::shared_ptr<StreamState> state);
  void PumpAnswer(uint64_t id);
  // Write what the generation has ready, without waiting; true when the answer ended.
  bool WriteReadyEvents(StreamState& state, ClientStream& client);
  bool WriteWholeIfDone(StreamState& state, ClientStream& client);
  void HandleTokenize(const httplib::Request& req, httplib::Response& res);
  void HandleDetokenize(const httplib::Request& req, httplib::Response& res);
  void HandleModels(httplib::Response& res) const;
  Result<std::vector<int32_t>> Tokenize(const struct GenerateRequest& request) const;
  // Chat with tools: how the reply is parsed (format) and, for a forced call, the constraint the
  // request decodes under (request->sampling.constraint).
  Status ApplyToolChoice(GenerateRequest* request, struct ResponseFormat* format) const;
  // response_format / guided_*: the compiled constraint (request->sampling.constraint).
  Status ApplyStructuredOutput(GenerateRequest* request, struct ResponseFormat* format) const;
  std::vector<int32_t> EncodePrompt(const std::string& text, bool add_special_tokens) const;
  void SendError(httplib::Response& res, int http_status, const std::string& message) const;
  void SendStatus(httplib::Response& res, const Status& status) const;

  const ServerOptions options_;
  engine::AsyncEngine* const engine_;
  const model::Tokenizer* const tokenizer_;
  ProtocolLimits limits_;
  // Each token's bytes, for forced tool calls and structured outputs; built once.
  std::shared_ptr<const engine::TokenTexts> token_texts_;
  std::unique_ptr<constrain::StructuredOutputCompiler> structured_;  // thread-safe
  ServingMetrics metrics_;
  LimitedHttpServer http_;
  std::thread listen_thread_;
  std::unique_ptr<EventLoop> answer_loop_;
  std::unordered_map<uint64_t, std::unique_ptr<Answer>> answers_;  // stream loop only
  uint64_t next_answer_id_ = 0;                                    // stream loop only
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};
  InflightCap inflight_;
  std::atomic<uint64_t> next_id_{0};
  const int64_t start_time_;
  uint64_t tokenizer_fingerprint_ = 0;  // TokenizerFingerprint, for /v1/kv_events
};

}  // namespace pd::server
