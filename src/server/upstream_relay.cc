#include "server/upstream_relay.h"

#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "server/client_stream.h"
#include "server/drain.h"
#include "server/http_response_parser.h"
#include "server/openai_protocol.h"

namespace pd::server {

namespace {

using SteadyClock = std::chrono::steady_clock;

// True when an idle kept-alive connection can carry another request: nothing to read (an idle
// connection turns readable only when the peer closed it or sent something unasked).
bool Reusable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

std::string FormatRequest(const RelayRequest& r, const std::string& host) {
  std::string out = r.method + " " + r.path + " HTTP/1.1\r\nHost: " + host + "\r\n" + r.headers;
  if (r.method != "GET") {
    out += "Content-Type: application/json\r\nContent-Length: " + std::to_string(r.body.size()) +
           "\r\n";
  }
  out += "\r\n";
  out += r.body;
  return out;
}

}  // namespace

Result<std::unique_ptr<UpstreamTarget>> ResolveUpstream(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  if (url.compare(0, kScheme.size(), kScheme) != 0)
    return InvalidArgument("decode instance URL must start with http://: " + url);
  std::string host_port = url.substr(kScheme.size());
  if (!host_port.empty() && host_port.back() == '/') host_port.pop_back();
  const size_t colon = host_port.rfind(':');
  const std::string host = colon == std::string::npos ? host_port : host_port.substr(0, colon);
  const std::string port = colon == std::string::npos ? "80" : host_port.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return InvalidArgument("decode instance " + url + ": " + ::gai_strerror(rc));
  auto target = std::make_unique<UpstreamTarget>();
  target->url = url;
  target->host = host_port;
  std::memcpy(&target->addr, found->ai_addr, found->ai_addrlen);
  target->addr_len = found->ai_addrlen;
  ::freeaddrinfo(found);
  return target;
}

// One relayed request. Loop thread only; freed by UpstreamRelay::Finished after it finishes.
class UpstreamRelay::Exchange {
 public:
  Exchange(UpstreamRelay& relay, UpstreamTarget* target, RelayRequest request,
           std::function<void()> on_done)
      : relay_(relay),
        target_(target),
        request_(std::move(request)),
        wire_(FormatRequest(request_, target->host)),
        on_done_(std::move(on_done)) {}
  ~Exchange() { Finish(); }
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  void Begin(int client_fd, int requests_left) {
    ClientStream::Options co;
    co.write_timeout_ms = relay_.options_.write_timeout_ms;
    if (requests_left > 0 && relay_.options_.give_back) {
      co.on_reusable = [give_back = relay_.options_.give_back, requests_left](int fd) {
        give_back(fd, requests_left);
      };
    }
    co.on_closed = [this](bool clean) {
      if (!clean && !forwarded_) {
        relay_.unforwarded_.fetch_add(1);  // the request never reached the decode instance whole
      }
      if (!clean && counted_) relay_.clients_gone_.fetch_add(1);  // before its answer ended
      if (!clean) CloseUpstream(false);  // client gone: the decode instance aborts
      Finish();
    };
    co.on_drained = [this] { ResumeReading(); };
    client_ = std::make_unique<ClientStream>(*relay_.loop_, client_fd, std::move(co));
    Trace("router upstream send");
    Connect(/*allow_idle=*/true);
  }

  void Tick(SteadyClock::time_point now) {
    if (finished_) return;
    client_->CheckStalled(now);
    if (finished_ || up_fd_ < 0 || paused_) return;
    const auto timeout = std::chrono::milliseconds(relay_.options_.upstream_timeout_ms);
    if (now - last_upstream_ > timeout) {
      retried_ = true;  // not worth another try
      UpstreamFailed("no answer for " + std::to_string(relay_.options_.upstream_timeout_ms) +
                     " ms");
    }
  }

 private:
  void Trace(const char* what) {
    if (request_.stream) TraceInstant(relay_.options_.tracer, what, "http");
  }

  void Connect(bool allow_idle) {
    int fd = allow_idle ? relay_.TakeIdle(target_) : -1;
    reused_ = fd >= 0;
    connecting_ = false;
    if (fd < 0) {
      fd = ::socket(target_->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) return UpstreamFailed(std::string("socket: ") + std::strerror(errno));
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      relay_.connections_.fetch_add(1);
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&target_->addr), target_->addr_len) !=
              0 &&
          errno != EINPROGRESS) {
        const std::string why = std::string("connect: ") + std::strerror(errno);
        ::close(fd);
        return ConnectFailed(why);
      }
      connecting_ = true;
    }
    up_fd_ = fd;
    sent_ = 0;
    forwarded_ = false;
    got_bytes_ = false;
    parser_ = HttpResponseParser();
    last_upstream_ = SteadyClock::now();
    up_token_ = relay_.loop_->Watch(fd, EPOLLOUT, [this](uint32_t ev) { OnUpstream(ev); });
    if (up_token_ == 0) UpstreamFailed(std::string("epoll_ctl: ") + std::strerror(errno));
  }

  void OnUpstream(uint32_t events) {
    if (connecting_) {
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(up_fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return ConnectFailed(std::string("connect: ") + std::strerror(err));
      connecting_ = false;
    }
    if (sent_ < wire_.size()) return SendRequest();
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) ReadUpstream();
  }

  void SendRequest() {
    while (sent_ < wire_.size()) {
      const ssize_t n = ::send(up_fd_, wire_.data() + sent_, wire_.size() - sent_, MSG_NOSIGNAL);
      if (n > 0) {
        sent_ += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;  // EPOLLOUT again
      } else {
        return UpstreamFailed(std::string("send: ") + std::strerror(errno));
      }
    }
    forwarded_ = true;
    last_upstream_ = SteadyClock::now();
    relay_.loop_->Modify(up_token_, EPOLLIN);
  }

  void ReadUpstream() {
    char buf[64 << 10];
    for (int reads = 0; reads < 4 && up_fd_ >= 0 && !paused_; ++reads) {
      const ssize_t n = ::recv(up_fd_, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      std::vector<std::string> pieces;
      if (n <= 0) {  // closed or reset
        if (parser_.FinishAtEof(&pieces)) return Deliver(pieces);
        return UpstreamFailed(n == 0 ? "the connection closed before the answer ended"
                                     : std::string("recv: ") + std::strerror(errno));
      }
      got_bytes_ = true;
      last_upstream_ = SteadyClock::now();
      if (Status s = parser_.Feed(std::string_view(buf, static_cast<size_t>(n)), &pieces);
          !s.ok()) {
        retried_ = true;
        return UpstreamFailed("malformed answer: " + s.message());
      }
      Deliver(pieces);
    }
  }

  // Writes what the parser produced to the client; ends the exchange when the answer is whole.
  void Deliver(std::vector<std::string>& pieces) {
    if (parser_.head_done() && !status_seen_ && parser_.status() == 503 &&
        !parser_.Header(kDrainingHeader).empty()) {
      // It did not start the request: draining, shutting down or too many connections.
      return Reroute("it turned the request away unstarted (draining or overloaded)");
    }
    if (parser_.head_done() && !status_seen_) {
      status_seen_ = true;
      Trace("router upstream status");
      if (parser_.chunked()) {
        head_written_ = true;
        client_->WriteHead(parser_.status(), HeadFields() + "Cache-Control: no-cache\r\n" +
                                                 "Transfer-Encoding: chunked\r\n");
      }
    }
    for (std::string& piece : pieces) {
      if (!parser_.chunked()) {
        whole_ += piece;
        continue;
      }
      if (!first_read_) Trace("router first chunk read");
      first_read_ = true;
      client_->WriteChunk(piece);
      if (!first_written_) Trace("router first chunk written");
      first_written_ = true;
    }
    if (finished_) return;  // the client went away while written to
    if (parser_.done()) {
      CloseUpstream(parser_.keep_alive());  // pooled before the client sees the end
      ReleaseCounts();
      if (parser_.chunked()) return client_->EndChunked();
      head_written_ = true;
      client_->WriteHead(parser_.status(), HeadFields() + "Content-Length: " +
                                               std::to_string(whole_.size()) + "\r\n");
      client_->Write(whole_);
      return client_->End();
    }
    if (client_->above_high_water()) {  // the client reads slower than the decode writes
      paused_ = true;
      relay_.loop_->Modify(up_token_, 0);
    }
  }

  std::string HeadFields() const {
    std::string h;
    const std::string type = parser_.Header("Content-Type");
    if (!type.empty()) h += "Content-Type: " + type + "\r\n";
    const std::string retry = parser_.Header("Retry-After");
    if (!retry.empty()) h += "Retry-After: " + retry + "\r\n";
    return h;
  }

  void ResumeReading() {
    if (!paused_ || up_fd_ < 0) return;
    paused_ = false;
    forwarded_ = true;
    last_upstream_ = SteadyClock::now();
    relay_.loop_->Modify(up_token_, EPOLLIN);
  }

  // A connection of our own (not a kept-alive one) failed before the request went out: the
  // decode instance never saw it, so another one may take it.
  void ConnectFailed(const std::string& why) {
    if (reused_ || sent_ > 0) return UpstreamFailed(why);
    Reroute(why);
  }

  // The decode instance did not take the request (refused the connection, or is draining): new
  // requests avoid it for a while, and this one moves to another instance if there is one.
  void Reroute(const std::string& why) {
    target_->refused_at_ns.store(SteadyClock::now().time_since_epoch().count());
    CloseUpstream(false);
    if (finished_) return;
    UpstreamTarget* next = nullptr;
    if (relay_.options_.reroute && reroutes_ < relay_.options_.max_reroutes) {
      next = relay_.options_.reroute(target_);
    }
    if (next == nullptr || next == target_) return UpstreamFailed(why);
    ++reroutes_;
    if (counted_) {
      target_->outstanding.fetch_sub(1);
      next->outstanding.fetch_add(1);
    }
    target_ = next;
    whole_.clear();
    wire_ = FormatRequest(request_, target_->host);
    Connect(/*allow_idle=*/true);
  }

  void UpstreamFailed(const std::string& why) {
    const bool retry = reused_ && !got_bytes_ && !retried_;
    CloseUpstream(false);
    if (finished_) return;
    if (retry) {  // a kept-alive connection the decode instance closed meanwhile: a fresh one
      retried_ = true;
      return Connect(/*allow_idle=*/false);
    }
    relay_.failures_.fetch_add(1);
    FailClient(502, "decode instance " + target_->url + ": " + why);
  }

 public:
  // Ends the exchange now with `status` and `message` (an SSE error event and a clean end
  // mid-stream); the decode connection is closed, so the decode instance aborts the request.
  void FailClient(int status, const std::string& message) {
    if (finished_ || client_->ending()) return;
    CloseUpstream(false);
    ReleaseCounts();
    if (head_written_) {  // mid-stream: an error event, then a clean end
      client_->WriteChunk("data: " + ErrorBody(status, message) + "\n\n");
      return client_->EndChunked();
    }
    const std::string body = ErrorBody(status, message);
    head_written_ = true;
    client_->WriteHead(status, "Content-Type: application/json\r\nContent-Length: " +
                                   std::to_string(body.size()) + "\r\n");
    client_->Write(body);
    client_->End();
  }

 private:
  void CloseUpstream(bool keep) {
    if (up_fd_ < 0) return;
    relay_.loop_->Unwatch(up_token_);
    if (keep) {
      relay_.GiveBack(target_, up_fd_);
    } else {
      ::close(up_fd_);
    }
    up_fd_ = -1;
  }

  // The exchange no longer counts as outstanding or open: its answer is complete (only the
  // client's copy may still be in flight) or it is over. Before the client can see the end, so
  // a client that reads the counters after its answer sees them released.
  void ReleaseCounts() {
    if (!counted_) return;
    counted_ = false;
    target_->outstanding.fetch_sub(1);
    if (on_done_) on_done_();
  }

  void Finish() {
    if (finished_) return;
    finished_ = true;
    CloseUpstream(false);
    ReleaseCounts();
    relay_.Finished(this);
  }

  UpstreamRelay& relay_;
  UpstreamTarget* target_;  // changes only when a refused connection is rerouted
  const RelayRequest request_;
  std::string wire_;  // the request as sent (to target_)
  int reroutes_ = 0;
  std::function<void()> on_done_;
  std::unique_ptr<ClientStream> client_;
  int up_fd_ = -1;
  uint64_t up_token_ = 0;
  size_t sent_ = 0;
  bool connecting_ = false;
  bool forwarded_ = false;  // the request was written whole on the current connection
  bool reused_ = false;
  bool retried_ = false;
  bool got_bytes_ = false;
  bool paused_ = false;
  bool status_seen_ = false;
  bool head_written_ = false;
  bool first_read_ = false;
  bool first_written_ = false;
  bool finished_ = false;
  bool counted_ = true;  // in target_->outstanding and the caller's count (on_done_ not run)
  HttpResponseParser parser_;
  std::string whole_;  // a body that is not chunked, until it is complete
  SteadyClock::time_point last_upstream_;
};

UpstreamRelay::UpstreamRelay(const UpstreamRelayOptions& options) : options_(options) {}

UpstreamRelay::~UpstreamRelay() { Stop(); }

Result<std::unique_ptr<UpstreamRelay>> UpstreamRelay::Create(const UpstreamRelayOptions& options) {
  std::unique_ptr<UpstreamRelay> relay(new UpstreamRelay(options));
  EventLoopOptions lo;
  lo.thread_name = "pd-relay";
  lo.tick_ms = 250;
  lo.on_tick = [raw = relay.get()] { raw->Tick(); };
  ASSIGN_OR_RETURN(relay->loop_, EventLoop::Create(lo));
  return relay;
}

void UpstreamRelay::Relay(UpstreamTarget* target, int client_fd, int requests_left,
                          RelayRequest request, std::function<void()> on_done) {
  loop_->Post([this, target, client_fd, requests_left, request = std::move(request),
               on_done = std::move(on_done)]() mutable {
    auto exchange =
        std::make_unique<Exchange>(*this, target, std::move(request), std::move(on_done));
    Exchange* raw = exchange.get();
    exchanges_.emplace(raw, std::move(exchange));
    raw->Begin(client_fd, requests_left);
  });
}

void UpstreamRelay::EndAll(const std::string& why) {
  if (loop_ == nullptr) return;
  loop_->Post([this, why] {
    std::vector<Exchange*> all;
    for (auto& [raw, e] : exchanges_) all.push_back(raw);
    for (Exchange* e : all) e->FailClient(503, why);  // Finished() only posts
  });
}

void UpstreamRelay::Stop() {
  if (loop_ == nullptr) return;
  loop_->Post([this] {
    exchanges_.clear();
    for (auto& [target, conns] : idle_) {
      for (const IdleConnection& c : conns) ::close(c.fd);
    }
    idle_.clear();
  });
  loop_->Stop();
  loop_.reset();
}

int UpstreamRelay::TakeIdle(UpstreamTarget* target) {
  std::vector<IdleConnection>& conns = idle_[target];
  const auto now = SteadyClock::now();
  const auto max_idle = std::chrono::duration<double>(options_.upstream_idle_s);
  while (!conns.empty()) {
    IdleConnection c = conns.back();
    conns.pop_back();
    if (now - c.since < max_idle && Reusable(c.fd)) return c.fd;
    ::close(c.fd);
  }
  return -1;
}

void UpstreamRelay::GiveBack(UpstreamTarget* target, int fd) {
  std::vector<IdleConnection>& conns = idle_[target];
  if (static_cast<int>(conns.size()) >= options_.max_idle_upstream) {
    ::close(fd);
    return;
  }
  conns.push_back({fd, SteadyClock::now()});
}

void UpstreamRelay::Finished(Exchange* exchange) {
  loop_->Post([this, exchange] { exchanges_.erase(exchange); });
}

void UpstreamRelay::Tick() {
  const auto now = SteadyClock::now();
  std::vector<Exchange*> all;
  all.reserve(exchanges_.size());
  for (auto& [raw, e] : exchanges_) all.push_back(raw);
  for (Exchange* e : all) e->Tick(now);  // Finished() only posts: every pointer stays valid
}

}  // namespace pd::server
