// One streamed generation request, timed from the SSE stream like `vllm bench serve` does.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench/report.h"
#include "common/status.h"

namespace pd::bench {

struct Endpoint {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  int timeout_s = 600;
};

// "http://host:port" (path ignored). InvalidArgument when it is not one.
Result<Endpoint> ParseBaseUrl(const std::string& base_url);

struct GenerationRequest {
  std::string path = "/v1/completions";  // or /v1/chat/completions
  std::string model;
  std::vector<int32_t> prompt_ids;  // completions
  std::string prompt_text;          // chat (and completions when prompt_ids is empty)
  int prompt_len = 0;               // expected; the server's usage overrides it
  int max_tokens = 16;
  bool ignore_eos = false;
  // A multi-turn conversation (>= 0; bench/workloads.h) and this request's turn in it: a turn
  // after the first is sent once the one before it completed, after `history`, the conversation
  // so far as (user message, reply) pairs, filled in then.
  int conversation = -1;
  int turn = 0;
  std::vector<std::pair<std::string, std::string>> history;
};

// The JSON body for the request (stream: true with include_usage). With a history, chat sends it
// as alternating user and assistant messages before the request's own, completions as the texts
// joined by newlines.
std::string RequestBody(const GenerationRequest& request);

// Feeds SSE bytes and times the chunks that carry text.
class SseTimer {
 public:
  explicit SseTimer(double start_time) : start_(start_time) {}
  // Consumes bytes received at `now` (seconds, same clock as start).
  void Feed(const char* data, size_t size, double now);
  bool done() const { return done_; }
  bool has_first_token() const { return first_ >= 0; }
  // Fills ttft, itl, latency, lengths and errors into *result.
  void Finish(RequestResult* result) const;

 private:
  void OnEvent(const std::string& payload, double now);
  double start_;
  std::string buffer_;
  double first_ = -1, last_ = -1;
  std::vector<double> itl_;
  int token_chunks_ = 0;
  int prompt_tokens_ = -1, completion_tokens_ = -1;
  std::string text_;  // the reply's text so far
  std::string error_;
  bool done_ = false;
};

// Sends the request and reads its stream. Never throws; failures are in the result.
RequestResult SendStreaming(const Endpoint& endpoint, const GenerationRequest& request);

// GET /v1/models: the served model's id and max_model_len.
struct ServerInfo {
  std::string model_id;
  int max_model_len = 0;
};
Result<ServerInfo> GetServerInfo(const Endpoint& endpoint);

}  // namespace pd::bench
