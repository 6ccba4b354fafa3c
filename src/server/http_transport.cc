#include "server/http_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/mutex.h"
#include "common/rate_limited_log.h"
#include "common/thread_util.h"
#include "server/drain.h"
#include "server/idle_connections.h"
#include "server/openai_protocol.h"

namespace pd::server {

namespace {

using SteadyClock = std::chrono::steady_clock;

int64_t MillisUntil(SteadyClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return std::max<int64_t>(0, left.count());
}

// poll() for `events`, retrying on EINTR. True when ready (or the peer hung up).
bool PollFor(int fd, short events, int64_t timeout_ms) {
  pollfd p{fd, events, 0};
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int rc = ::poll(&p, 1, static_cast<int>(MillisUntil(deadline)));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

void AddrToString(const sockaddr_storage& addr, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

}  // namespace

// A socket stream that reads through a buffer and enforces the per-request byte budget.
class BudgetedSocketStream final : public httplib::Stream {
 public:
  BudgetedSocketStream(int fd, const HttpLimits& limits) : fd_(fd), limits_(limits) {}

  void BeginRequest() {
    phase_ = LimitHit::kHeaders;
    hit_ = LimitHit::kNone;
    remaining_ = limits_.max_header_bytes;
    const auto now = SteadyClock::now();
    head_deadline_ = now + std::chrono::milliseconds(limits_.read_timeout_ms);
    request_deadline_ = now + std::chrono::milliseconds(limits_.request_timeout_ms);
    wrote_ = false;
  }
  void HeadersDone() {
    phase_ = LimitHit::kBody;
    // Chunk-size lines and CRLFs travel with a chunked body; allow them on top of the body.
    remaining_ = limits_.max_body_bytes + limits_.max_body_bytes / 8 + 4096;
  }
  LimitHit hit() const { return hit_; }
  bool wrote() const { return wrote_; }
  bool must_close() const { return must_close_; }
  void set_must_close() { must_close_ = true; }
  bool HasBuffered() const { return buf_off_ < buf_len_; }
  // After Detach, writes are dropped: the taker writes the response.
  void Detach(LimitedHttpServer::Taker take) { take_ = std::move(take); }
  bool detached() const { return take_ != nullptr; }
  LimitedHttpServer::Taker TakeTaker() { return std::move(take_); }

  bool PeerClosed() const {
    if (HasBuffered()) return false;
    char c;
    ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }

  bool is_readable() const override {
    return HasBuffered() || PollFor(fd_, POLLIN, ReadTimeoutMs());
  }
  bool is_writable() const override {
    if (detached()) return true;
    return PollFor(fd_, POLLOUT, limits_.write_timeout_ms) && !PeerClosed();
  }

  ssize_t read(char* ptr, size_t size) override {
    if (remaining_ == 0) {
      hit_ = phase_;
      must_close_ = true;
      return -1;
    }
    size = std::min(size, remaining_);
    if (!HasBuffered()) {
      if (!PollFor(fd_, POLLIN, ReadTimeoutMs())) {  // a read timeout or a deadline
        hit_ = LimitHit::kDeadline;
        must_close_ = true;
        return -1;
      }
      ssize_t n;
      do {
        n = ::recv(fd_, buf_, sizeof(buf_), 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      buf_off_ = 0;
      buf_len_ = static_cast<size_t>(n);
    }
    size_t n = std::min(size, buf_len_ - buf_off_);
    std::memcpy(ptr, buf_ + buf_off_, n);
    buf_off_ += n;
    remaining_ -= n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (detached()) return static_cast<ssize_t>(size);
    if (!PollFor(fd_, POLLOUT, limits_.write_timeout_ms)) return -1;
    ssize_t n;
    do {
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n > 0) wrote_ = true;
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      AddrToString(addr, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      AddrToString(addr, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  // The request head must arrive within read_timeout_ms in total (no slow-header trickle), the
  // whole request within request_timeout_ms (no slow-body trickle).
  int64_t ReadTimeoutMs() const {
    int64_t ms = std::min<int64_t>(limits_.read_timeout_ms, MillisUntil(request_deadline_));
    if (phase_ == LimitHit::kHeaders) ms = std::min<int64_t>(ms, MillisUntil(head_deadline_));
    return ms;
  }

  const int fd_;
  const HttpLimits& limits_;
  LimitHit phase_ = LimitHit::kHeaders;
  LimitHit hit_ = LimitHit::kNone;
  size_t remaining_ = 0;
  SteadyClock::time_point head_deadline_;
  SteadyClock::time_point request_deadline_;
  bool must_close_ = false;
  bool wrote_ = false;
  LimitedHttpServer::Taker take_;
  char buf_[4096];
  size_t buf_off_ = 0;
  size_t buf_len_ = 0;
};

namespace {

thread_local BudgetedSocketStream* tl_stream = nullptr;
// Why the connection's task runs on the accepting thread: it is turned away unread.
enum class Reject : uint8_t { kNone, kQueueFull, kShuttingDown };
thread_local Reject tl_reject = Reject::kNone;

}  // namespace

// A fixed pool of threads and a bounded queue of accepted connections. When the queue is full
// (or the pool is shutting down) the connection's task runs at once on the accepting thread with
// tl_reject set, which answers 503 without reading the request.
class BoundedThreadPool final : public httplib::TaskQueue {
 public:
  // `after_shutdown` runs once every thread has ended.
  BoundedThreadPool(int num_threads, int max_queued, std::function<void()> after_shutdown)
      : max_queued_(static_cast<size_t>(max_queued)), after_shutdown_(std::move(after_shutdown)) {
    for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Work(); });
  }

  void enqueue(std::function<void()> fn) override EXCLUDES(mu_) {
    Reject why = Reject::kQueueFull;
    {
      MutexLock lock(&mu_);
      if (!shutdown_ && jobs_.size() < max_queued_) {
        jobs_.push_back(std::move(fn));
        cv_.Signal();
        return;
      }
      if (shutdown_) why = Reject::kShuttingDown;
    }
    tl_reject = why;
    fn();
    tl_reject = Reject::kNone;
  }

  void shutdown() override EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      shutdown_ = true;
    }
    cv_.SignalAll();
    for (auto& t : threads_) t.join();
    threads_.clear();
    if (after_shutdown_) after_shutdown_();
  }

  int busy() const { return busy_.load(); }

 private:
  void Work() EXCLUDES(mu_) {
    SetCurrentThreadName("pd-http");
    // Best effort: a request's thread runs as soon as it is woken (its first token is written
    // while the engine's thread computes the next step, maybe on the same CPU).
    (void)SetCurrentThreadLatencySensitive();
    for (;;) {
      std::function<void()> fn;
      {
        MutexLock lock(&mu_);
        while (!shutdown_ && jobs_.empty()) cv_.Wait(&mu_);
        if (jobs_.empty()) return;  // shutting down and drained
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      busy_.fetch_add(1);
      fn();
      busy_.fetch_sub(1);
    }
  }

  const size_t max_queued_;
  const std::function<void()> after_shutdown_;
  std::atomic<int> busy_{0};
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> jobs_ GUARDED_BY(mu_);
  bool shutdown_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

namespace {

int LimitStatus(LimitHit hit) {
  switch (hit) {
    case LimitHit::kHeaders:
      return 431;
    case LimitHit::kBody:
      return 413;
    case LimitHit::kDeadline:
      return 408;
    case LimitHit::kNone:
      break;
  }
  return 0;
}

std::string LimitMessage(LimitHit hit, const HttpLimits& limits) {
  if (hit == LimitHit::kDeadline)
    return "request not received in time (limits: " + std::to_string(limits.read_timeout_ms) +
           " ms for its head and for each read, " + std::to_string(limits.request_timeout_ms) +
           " ms for the whole request)";
  if (hit == LimitHit::kHeaders)
    return "request headers exceed the limit of " + std::to_string(limits.max_header_bytes) +
           " bytes";
  return "request body exceeds the limit of " + std::to_string(limits.max_body_bytes) + " bytes";
}

// The status (0: none) and `message` of a request whose headers break a limit: too many headers
// (431), an unreadable Content-Length (400), or one over max_body_bytes (413).
int CheckHeaders(const httplib::Request& req, const HttpLimits& limits, std::string* message) {
  int status = 0;
  if (req.headers.size() > static_cast<size_t>(limits.max_header_count)) {
    status = 431;
    *message = "too many request headers: " + std::to_string(req.headers.size()) + " (limit " +
               std::to_string(limits.max_header_count) + ")";
  } else if (req.has_header("Content-Length")) {
    const std::string value = req.get_header_value("Content-Length");
    char* end = nullptr;
    errno = 0;
    unsigned long long length = std::strtoull(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || errno != 0) {
      status = 400;
      *message = "invalid Content-Length: " + value;
    } else if (length > limits.max_body_bytes) {
      status = 413;
      *message = "request body of " + value + " bytes exceeds the limit of " +
                 std::to_string(limits.max_body_bytes) + " bytes";
    }
  }
  return status;
}

// The message of an error response without a body; a read limit this thread's connection hit
// also sets the response's status and closes the connection.
std::string ErrorMessage(const httplib::Request& req, const HttpLimits& limits,
                         httplib::Response* res) {
  BudgetedSocketStream* stream = tl_stream;
  const LimitHit hit = stream != nullptr ? stream->hit() : LimitHit::kNone;
  std::string message;
  if (hit != LimitHit::kNone) {
    res->status = LimitStatus(hit);
    message = LimitMessage(hit, limits);
    res->set_header("Connection", "close");
  } else if (res->status == 413) {
    message = LimitMessage(LimitHit::kBody, limits);
  } else if (res->status == 404) {
    message = "no route for " + req.method + " " + req.path;
  } else if (res->status == 400) {
    message = "malformed HTTP request";
  } else {
    message = "HTTP error " + std::to_string(res->status);
  }
  return message;
}

}  // namespace

LimitedHttpServer::LimitedHttpServer(const HttpLimits& limits) : limits_(limits) {
  // Streamed tokens are small writes a few hundred microseconds apart: with Nagle's algorithm
  // each could wait for the client's (delayed) ACK of the one before.
  set_tcp_nodelay(true);
  set_payload_max_length(limits_.max_body_bytes);
  set_read_timeout(limits_.read_timeout_ms / 1000, (limits_.read_timeout_ms % 1000) * 1000);
  set_write_timeout(limits_.write_timeout_ms / 1000, (limits_.write_timeout_ms % 1000) * 1000);
  set_keep_alive_max_count(static_cast<size_t>(std::max(1, limits_.keep_alive_max_requests)));
  set_keep_alive_timeout(std::max(1, limits_.keep_alive_timeout_ms / 1000));
  new_task_queue = [this] {
    auto* pool = new BoundedThreadPool(limits_.num_threads, limits_.max_queued_connections, [this] {
      MutexLock lock(&pool_mu_);
      pool_ = nullptr;
    });
    MutexLock lock(&pool_mu_);
    pool_ = pool;
    pool_cv_.SignalAll();
    return pool;
  };
  // Without the idle loop (it could not start), threads wait on idle connections themselves.
  auto idle = IdleConnections::Create(limits_.keep_alive_timeout_ms, limits_.max_idle_connections,
                                      [this](int fd, int left) { Resume(fd, left); });
  if (idle.ok()) idle_ = std::move(idle).value();
  // Runs after the headers are read and before the body is.
  set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    BudgetedSocketStream* stream = tl_stream;
    if (stream != nullptr) stream->HeadersDone();
    std::string message;
    const int status = CheckHeaders(req, limits_, &message);
    if (status == 0) return httplib::Server::HandlerResponse::Unhandled;
    if (stream != nullptr) stream->set_must_close();  // the body stays unread
    CountLimitHit(status == 431 ? LimitHit::kHeaders : LimitHit::kBody, req.remote_addr, message);
    res.status = status;
    res.set_header("Connection", "close");
    res.set_content(ErrorBody(status, message), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
  // Every error response without a body gets one in OpenAI's shape.
  set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.is_chunked_content_provider_)
          return httplib::Server::HandlerResponse::Unhandled;
        const std::string message = ErrorMessage(req, limits_, &res);
        res.set_content(ErrorBody(res.status, message), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
}

LimitedHttpServer::~LimitedHttpServer() {
  idle_.reset();  // its loop may be resuming a connection into the pool: end it first
}

bool LimitedHttpServer::WaitListening(std::chrono::milliseconds timeout) {
  MutexLock lock(&pool_mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pool_ == nullptr) {
    if (!pool_cv_.WaitUntil(&pool_mu_, deadline)) return pool_ != nullptr;
  }
  return true;
}

int LimitedHttpServer::num_busy_threads() {
  MutexLock lock(&pool_mu_);
  return pool_ != nullptr ? pool_->busy() : 0;
}

int LimitedHttpServer::num_parked_connections() const {
  return idle_ != nullptr ? idle_->num_parked() : 0;
}

void LimitedHttpServer::ResumeConnection(int fd, int requests_left) {
  if (requests_left <= 0) {
    ::close(fd);
  } else if (idle_ != nullptr) {
    Park(fd, requests_left, /*fresh=*/false);
  } else {
    Resume(fd, requests_left);
  }
}

void LimitedHttpServer::Resume(int fd, int requests_left) {
  MutexLock lock(&pool_mu_);
  if (pool_ == nullptr || !is_running()) {  // stopped: no thread will serve it
    ::close(fd);
    return;
  }
  pool_->enqueue([this, fd, requests_left] { ServeConnection(fd, requests_left, false); });
}

bool LimitedHttpServer::DetachCurrentConnection(Taker take) {
  if (tl_stream == nullptr || take == nullptr) return false;
  tl_stream->Detach(std::move(take));
  return true;
}

void LimitedHttpServer::SetListenBacklog(int backlog) {
  socket_t sock = svr_sock_;
  if (sock != INVALID_SOCKET) ::listen(sock, backlog);  // Linux updates the backlog in place
}

bool LimitedHttpServer::WaitForRequest(BudgetedSocketStream& stream) {
  if (stream.HasBuffered()) return true;
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(limits_.keep_alive_timeout_ms);
  while (svr_sock_ != INVALID_SOCKET && is_running()) {
    int64_t left = MillisUntil(deadline);
    if (left == 0) return false;
    if (PollFor(stream.socket(), POLLIN, std::min<int64_t>(left, 100))) return true;
  }
  return false;
}

// The request is never read, so it was not started: kDrainingHeader lets a router send it to
// another instance, as it does for a draining one.
void LimitedHttpServer::RejectUnread(socket_t sock, bool shutting_down) {
  rejected_.fetch_add(1);
  // The response fits in the socket buffer of a new connection; never block the accept loop.
  if (shutting_down) {
    return WriteErrorAndClose(sock, 503, "the server is shutting down; retry on another instance",
                              /*not_started=*/true);
  }
  PD_LOG_WARN_EVERY_N_SEC(10.0, "overloaded",
                          "http: turned a connection away: {} connections wait for {} threads",
                          limits_.max_queued_connections, limits_.num_threads);
  WriteErrorAndClose(sock, 503, "server overloaded: too many connections; retry later",
                     /*not_started=*/true);
}

void LimitedHttpServer::WriteErrorAndClose(int sock, int status, const std::string& message,
                                           bool not_started) {
  const std::string body = ErrorBody(status, message);
  std::string response = "HTTP/1.1 " + std::to_string(status) +
                         (status == 503 ? " Service Unavailable" : " Request Timeout") +
                         "\r\nContent-Type: application/json\r\n";
  if (status == 503) response += "Retry-After: " + std::to_string(limits_.retry_after_s) + "\r\n";
  if (not_started) response += std::string(kDrainingHeader) + ": 1\r\n";
  response +=
      "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)::send(sock, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(sock, SHUT_WR);
  ::close(sock);
}

void LimitedHttpServer::CountLimitHit(LimitHit hit, const std::string& client,
                                      const std::string& message) {
  hits_[static_cast<int>(hit)].fetch_add(1);
  PD_LOG_WARN_EVERY_N_SEC(10.0, client, "http: request from {} refused with {}: {}", client,
                          LimitStatus(hit), message);
}

std::string LimitedHttpServer::RefusedMetricsText() const {
  std::string text =
      "# HELP pdserve:http_refused_total Requests and connections refused by an HTTP limit.\n"
      "# TYPE pdserve:http_refused_total counter\n";
  auto line = [&](const char* reason, int64_t value) {
    text += std::string("pdserve:http_refused_total{reason=\"") + reason + "\"} " +
            std::to_string(value) + "\n";
  };
  line("headers", num_limit_hits(LimitHit::kHeaders));
  line("body", num_limit_hits(LimitHit::kBody));
  line("timeout", num_limit_hits(LimitHit::kDeadline));
  line("connections", rejected_.load());
  text += "# TYPE pdserve:http_idle_connections gauge\npdserve:http_idle_connections " +
          std::to_string(num_parked_connections()) + "\n";
  return text;
}

bool LimitedHttpServer::process_and_close_socket(socket_t sock) {
  return ServeConnection(sock, std::max(1, limits_.keep_alive_max_requests), /*fresh=*/true);
}

void LimitedHttpServer::Park(int fd, int requests_left, bool fresh) {
  if (idle_->Park(fd, requests_left)) return;
  rejected_.fetch_add(1);
  PD_LOG_WARN_EVERY_N_SEC(10.0, "idle",
                          "http: {} connections wait idle already (limit): closed one",
                          limits_.max_idle_connections);
  if (fresh) {
    WriteErrorAndClose(fd, 503, "server overloaded: too many idle connections; retry later",
                       /*not_started=*/true);
  } else {
    ::close(fd);
  }
}

bool LimitedHttpServer::ServeConnection(int sock, int requests_left, bool fresh) {
  if (tl_reject != Reject::kNone) {
    RejectUnread(sock, tl_reject == Reject::kShuttingDown);
    return false;
  }
  BudgetedSocketStream stream(sock, limits_);
  tl_stream = &stream;
  bool ret = false;
  for (int left = requests_left; left > 0; --left) {
    if (idle_ != nullptr && !stream.HasBuffered() && !PollFor(sock, POLLIN, 0)) {
      // Nothing to read yet: the idle loop waits for the next request, not this thread.
      tl_stream = nullptr;
      Park(sock, left, fresh && left == requests_left);
      return ret;
    }
    if (!WaitForRequest(stream)) break;
    stream.BeginRequest();
    bool connection_closed = false;
    ret = process_request(stream, left == 1, connection_closed, nullptr);
    if (stream.detached()) {
      tl_stream = nullptr;
      // Bytes read past this request (a pipelined one) would be lost: close after the answer.
      const bool reusable =
          ret && !connection_closed && !stream.must_close() && left > 1 && !stream.HasBuffered();
      stream.TakeTaker()(sock, reusable ? left - 1 : 0);
      return ret;
    }
    if (stream.hit() != LimitHit::kNone) {
      std::string ip;
      int port = 0;
      stream.get_remote_ip_and_port(ip, port);
      CountLimitHit(stream.hit(), ip, LimitMessage(stream.hit(), limits_));
    }
    if (!ret || connection_closed || stream.must_close()) break;
  }
  tl_stream = nullptr;
  if (stream.hit() == LimitHit::kDeadline && !stream.wrote()) {
    // The request line itself did not arrive in time: the library closes without an answer.
    WriteErrorAndClose(sock, 408, LimitMessage(LimitHit::kDeadline, limits_));
    return ret;
  }
  if (stream.must_close()) {
    // Lingering close: stop writing, then drain briefly so the client reads our error response
    // instead of a reset caused by the body it is still sending.
    ::shutdown(sock, SHUT_WR);
    char drain[4096];
    auto deadline = SteadyClock::now() + std::chrono::milliseconds(500);
    size_t drained = 0;
    while (drained < (16u << 20) && PollFor(sock, POLLIN, MillisUntil(deadline))) {
      ssize_t n = ::recv(sock, drain, sizeof(drain), 0);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace pd::server
