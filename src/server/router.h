// The router of a disaggregated deployment: the OpenAI API in front of decode instances. Every
// generation request (streaming or not) goes to the decode instance with the least outstanding
// requests; its answer is relayed as it comes (SSE chunks unbuffered). A client that goes away
// closes the upstream connection, so the decode instance aborts the request. /health answers when
// at least one decode instance is healthy; /metrics reports the router's own counters;
// GET /v1/models is forwarded.
//
// Thread safety: Start/Stop from one thread; handlers run on the HTTP pool's threads.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/trace.h"
#include "server/http_transport.h"

namespace pd::server {

struct RouterOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                    // 0: any free port
  std::vector<std::string> backends;  // decode instances' base URLs, "http://127.0.0.1:8001"
  int upstream_timeout_s = 600;       // per read from a decode instance
  // Connections to decode instances are kept alive and reused: at most this many idle ones per
  // decode instance, each reused only within upstream_idle_s of its last answer (below the
  // decode instance's keep-alive timeout, 5 s by default, so it has not closed it meanwhile).
  int max_idle_upstream = 32;
  double upstream_idle_s = 2.0;
  HttpLimits http;
  // Borrowed, may be null: instants per streamed request ("router request", "router upstream
  // sent", "router upstream status", "router first chunk read", "router first chunk written").
  Tracer* tracer = nullptr;
};

class Router {
 public:
  static Result<std::unique_ptr<Router>> Create(const RouterOptions& options);
  ~Router();
  Status Start();
  void Stop();
  int port() const { return port_; }
  // Requests in flight per backend, in options order.
  std::vector<int> outstanding() const;
  // Upstream connections opened so far (reusing a kept-alive one opens none).
  uint64_t upstream_connections() const { return connections_.load(); }

 private:
  struct Backend;
  class Upstream;
  explicit Router(const RouterOptions& options);
  int Pick();
  void Forward(const httplib::Request& req, httplib::Response& res);
  void ForwardStream(Backend& b, const httplib::Request& req, httplib::Response& res);

  const RouterOptions options_;
  std::vector<std::unique_ptr<Backend>> backends_;
  LimitedHttpServer http_;
  std::thread listen_thread_;
  int port_ = 0;
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> round_robin_{0};
  std::atomic<uint64_t> connections_{0};
};

}  // namespace pd::server
