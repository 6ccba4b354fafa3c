// cpp-httplib with explicit limits. Debian's cpp-httplib 0.11 is a compiled library: its
// compile-time limits (CPPHTTPLIB_HEADER_MAX_LENGTH = 8192 bytes per header line, no limit on
// the number of headers, no limit on chunked or length-less bodies, an unbounded connection
// queue) cannot be changed by defining macros in our code. So LimitedHttpServer replaces the
// per-connection loop and the socket stream:
//  - every request gets a byte budget: max_header_bytes for the request line and headers
//    (too many or too large headers -> 431), then max_body_bytes (+ chunk framing) for the body
//    whatever its framing (Content-Length over the limit -> 413 before reading it; chunked or
//    length-less bodies are cut off at the budget -> 413) and the connection is closed;
//  - at most max_header_count headers (431);
//  - read / write timeouts per socket operation, a keep-alive timeout and request count;
//  - a total deadline per request: its head within read_timeout_ms, and the whole request (head
//    and body) within request_timeout_ms of its first byte, else 408 and the connection closed
//    (a client trickling a byte every few seconds holds a thread no longer than that);
//  - a fixed pool of num_threads HTTP threads and at most max_queued_connections accepted
//    connections waiting for one; beyond that a connection is answered 503 + Retry-After at once;
//  - a connection with nothing to read (a new one whose request has not come yet, or a kept-alive
//    one between requests) holds no thread: it waits on one event-loop thread
//    (server/idle_connections.h) until it turns readable, and is closed after
//    keep_alive_timeout_ms; at most max_idle_connections wait so (a new one beyond it is answered
//    503, a kept-alive one closed), so the connections the server holds are bounded by
//    num_threads + max_queued_connections + max_idle_connections;
//  - a handler may take the connection over (DetachCurrentConnection) and answer it elsewhere.
// Error responses of these limits use OpenAI's error shape.
//
// Thread safety: configure before Listen; the handlers run on the pool's threads.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "common/mutex.h"

namespace pd::server {

struct HttpLimits {
  size_t max_body_bytes = 4u << 20;     // decoded request body
  size_t max_header_bytes = 16u << 10;  // request line + all header lines
  int max_header_count = 100;
  int read_timeout_ms = 30000;       // per read of a request, and for its whole head
  int request_timeout_ms = 60000;    // the whole request, head and body; beyond it 408
  int write_timeout_ms = 30000;      // per write of a response
  int keep_alive_timeout_ms = 5000;  // idle time between requests on one connection
  int keep_alive_max_requests = 100;
  int num_threads = 64;              // HTTP threads (each reads one request at a time)
  int max_queued_connections = 256;  // accepted, waiting for a thread
  int max_idle_connections = 4096;   // open without a request in progress; beyond it 503/closed
  int retry_after_s = 1;             // Retry-After on 429/503
};

// Which limit a connection ran into (kDeadline: request_timeout_ms, or read_timeout_ms for the
// head).
enum class LimitHit { kNone, kHeaders, kBody, kDeadline };

class LimitedHttpServer : public httplib::Server {
 public:
  explicit LimitedHttpServer(const HttpLimits& limits);
  ~LimitedHttpServer() override;

  const HttpLimits& limits() const { return limits_; }
  int64_t num_rejected_connections() const { return rejected_.load(); }
  // Requests refused for `hit` so far (kDeadline: answered 408).
  int64_t num_limit_hits(LimitHit hit) const { return hits_[static_cast<int>(hit)].load(); }
  // Prometheus text: pdserve:http_refused_total{reason="headers|body|timeout|connections"} and
  // the gauge pdserve:http_idle_connections.
  std::string RefusedMetricsText() const;
  // HTTP threads serving a connection now, and connections waiting idle on the idle loop.
  int num_busy_threads() EXCLUDES(pool_mu_);
  int num_parked_connections() const;

  // For handlers: hands the connection over to `take` once the request is done with. The
  // response the handler sets is discarded; after the library has finished with the request,
  // take(fd, requests_left) runs on this HTTP thread and owns the descriptor from then on (it
  // writes the response), and the thread serves the next connection. requests_left > 0: the
  // connection may carry that many more requests; once the answer is written whole, the taker
  // gives it back with ResumeConnection (or closes it). 0: the taker closes it after the answer
  // ("Connection: close"). False outside a handler.
  using Taker = std::function<void(int fd, int requests_left)>;
  static bool DetachCurrentConnection(Taker take);
  // A detached connection whose answer is complete: it waits for its next request, then is
  // served by the pool. Any thread.
  void ResumeConnection(int fd, int requests_left);
  // After bind: the listen backlog (the library's is 5, too small for a burst of clients).
  void SetListenBacklog(int backlog);
  // After listen_after_bind started on another thread: waits until the HTTP threads exist.
  bool WaitListening(std::chrono::milliseconds timeout) EXCLUDES(pool_mu_);

 private:
  bool process_and_close_socket(socket_t sock) override;
  // Serves up to `requests_left` requests on `sock`, then closes it (or parks or detaches it).
  // `fresh`: accepted just now (no request served on it yet).
  bool ServeConnection(int sock, int requests_left, bool fresh);
  // Hands `fd` to the idle loop; beyond max_idle_connections it is refused (503 when fresh) and
  // closed.
  void Park(int fd, int requests_left, bool fresh);
  // From the idle loop: `fd` has its next request (or closed); back to the pool.
  void Resume(int fd, int requests_left) EXCLUDES(pool_mu_);
  // Answers 503 without reading the request (the queue is full, or the pool is shutting down).
  void RejectUnread(socket_t sock, bool shutting_down);
  // Writes a small error response without blocking and closes `sock` (408, 503); `not_started`:
  // the request was never read, so kDrainingHeader tells a router it may go elsewhere.
  void WriteErrorAndClose(int sock, int status, const std::string& message,
                          bool not_started = false);
  // Counts and logs (rate-limited, per client address) a request that ran into a limit.
  void CountLimitHit(LimitHit hit, const std::string& client, const std::string& message);
  bool WaitForRequest(class BudgetedSocketStream& stream);

  const HttpLimits limits_;
  std::atomic<int64_t> rejected_{0};
  std::atomic<int64_t> hits_[4] = {};  // by LimitHit
  Mutex pool_mu_;
  CondVar pool_cv_;                                               // pool_ set
  class BoundedThreadPool* pool_ GUARDED_BY(pool_mu_) = nullptr;  // set while listening
  std::unique_ptr<class IdleConnections> idle_;
};

}  // namespace pd::server
