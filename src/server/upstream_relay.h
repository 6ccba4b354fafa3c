// The router's relay: one event-loop thread carries every relayed request, streamed or not,
// between its client's connection (handed over by the HTTP thread that read the request) and a
// decode instance, over non-blocking sockets. Open streams cost two descriptors and their
// buffers, never a thread.
//
// Per exchange: a kept-alive connection to the decode instance is reused (or a new one opened),
// the request written, the answer's head read and written to the client with the same status,
// Content-Type and Retry-After. A chunked (SSE) answer is relayed one whole chunk (event) at a
// time as it arrives; any other answer is read whole, then written with its length. The decode
// connection goes back to the pool before the client sees the end, so the client's next request
// can reuse it. A client that goes away closes the decode connection (the decode instance aborts
// the request); a decode instance that refuses the connection (dead, restarting) has the request
// sent to another one (options.reroute), and so does one that answers 503 with kDrainingHeader
// (server/drain.h: it did not start the request: draining, shutting down or overloaded); one that
// fails before answering gets the client a 502 in OpenAI's error shape, and one that dies
// mid-stream an SSE error event and a clean end of the stream.
// A client that reads nothing for write_timeout_ms, or a decode instance silent for
// upstream_timeout_ms, ends the exchange the same ways.
//
// Thread safety: Relay and the counters from any thread; everything else on the loop thread.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/trace.h"
#include "server/event_loop.h"

namespace pd::server {

// A decode instance as the relay reaches it.
struct UpstreamTarget {
  std::string url;   // "http://127.0.0.1:8001"
  std::string host;  // its Host header, "127.0.0.1:8001"
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  std::atomic<int> outstanding{0};  // exchanges with it in flight
  // A fresh connection to it failed (steady clock, ns): nothing listens there (a decode instance
  // that died or is restarting); the router sends new requests elsewhere until this + 1 s.
  std::atomic<int64_t> refused_at_ns{-1};
};

// "http://host:port" (a trailing "/" allowed), resolved once.
Result<std::unique_ptr<UpstreamTarget>> ResolveUpstream(const std::string& url);

struct RelayRequest {
  std::string method = "POST";
  std::string path;
  std::string headers;  // extra request headers, "Name: value\r\n" each
  std::string body;
  bool stream = false;  // the client asked for SSE (traced milestones)
};

struct UpstreamRelayOptions {
  int upstream_timeout_ms = 600000;  // per read from a decode instance
  int write_timeout_ms = 30000;      // per write to a client
  int max_idle_upstream = 32;        // kept-alive decode connections per instance
  double upstream_idle_s = 2.0;      // reused only within this long of their last answer
  Tracer* tracer = nullptr;          // borrowed, may be null
  // A client connection whose answer is written whole and that may carry requests_left more
  // requests goes here (the HTTP server's ResumeConnection); empty: it is closed.
  std::function<void(int fd, int requests_left)> give_back;
  // Called (on the loop thread) when a fresh connection to `refused` fails: it never saw the
  // request. The exchange moves to the target returned (its outstanding count with it), at most
  // max_reroutes times; null, or empty: the client gets the 502.
  std::function<UpstreamTarget*(UpstreamTarget* refused)> reroute;
  int max_reroutes = 2;
};

class UpstreamRelay {
 public:
  static Result<std::unique_ptr<UpstreamRelay>> Create(const UpstreamRelayOptions& options);
  ~UpstreamRelay();  // Stop()

  // Relays `request` to `target` and its answer to the client on `client_fd`, which the relay
  // owns from now on (and gives back when it may carry `requests_left` > 0 more requests). `target`
  // outlives the relay; its outstanding count is released and `on_done` runs (on the loop thread)
  // when the answer is complete, before the client can see its end, or when the exchange ends
  // otherwise.
  void Relay(UpstreamTarget* target, int client_fd, int requests_left, RelayRequest request,
             std::function<void()> on_done);
  // Ends every exchange still open with `why` (a 503 in OpenAI's error shape, or an SSE error
  // event and a clean end mid-stream); their decode connections close.
  void EndAll(const std::string& why);
  // Closes every exchange and idle connection and ends the loop thread. Idempotent.
  void Stop();

  uint64_t connections_opened() const { return connections_.load(); }
  uint64_t failures() const { return failures_.load(); }
  // Exchanges whose client went away before their request was written whole to a decode
  // instance: the decode instance never saw them.
  uint64_t unforwarded() const { return unforwarded_.load(); }
  // Exchanges whose client went away before the answer was complete (streamed or not): their
  // decode connection was closed, so the decode instance aborted the request.
  uint64_t clients_gone() const { return clients_gone_.load(); }

 private:
  class Exchange;
  struct IdleConnection {
    int fd = -1;
    std::chrono::steady_clock::time_point since;
  };
  explicit UpstreamRelay(const UpstreamRelayOptions& options);
  int TakeIdle(UpstreamTarget* target);           // -1: none usable
  void GiveBack(UpstreamTarget* target, int fd);  // to the pool or closed
  void Finished(Exchange* exchange);              // frees it after the current event
  void Tick();

  const UpstreamRelayOptions options_;
  std::unique_ptr<EventLoop> loop_;
  std::atomic<uint64_t> connections_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> unforwarded_{0};
  std::atomic<uint64_t> clients_gone_{0};
  // Loop thread only.
  std::unordered_map<Exchange*, std::unique_ptr<Exchange>> exchanges_;
  std::unordered_map<UpstreamTarget*, std::vector<IdleConnection>> idle_;  // newest last
};

}  // namespace pd::server
