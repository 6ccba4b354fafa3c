#include "cluster/http_call.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace pd::cluster {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point DeadlineIn(int timeout_ms) {
  return Clock::now() + std::chrono::milliseconds(timeout_ms);
}

int MsLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

// Waits for `events` on fd until the deadline: OK, DeadlineExceeded, or the poll error.
Status WaitFd(int fd, short events, Clock::time_point deadline, const std::string& what) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, MsLeft(deadline));
    if (n > 0) return OkStatus();
    if (n == 0) return DeadlineExceeded(what + ": timed out");
    if (errno != EINTR) return Unavailable(what + ": poll: " + std::strerror(errno));
  }
}

Result<int> Connect(const HostPort& ep, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(ep.port);
  if (int rc = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Unavailable(ep.ToString() + ": " + ::gai_strerror(rc));
  }
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(found);
    return Unavailable(std::string("socket: ") + std::strerror(errno));
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int rc = ::connect(fd, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  Status s = OkStatus();
  if (rc != 0 && errno != EINPROGRESS) {
    s = Unavailable("connect to " + ep.ToString() + ": " + std::strerror(errno));
  } else if (rc != 0) {
    s = WaitFd(fd, POLLOUT, deadline, "connect to " + ep.ToString());
    int err = 0;
    socklen_t len = sizeof(err);
    if (s.ok() && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) {
      s = Unavailable("connect to " + ep.ToString() + ": " + std::strerror(err));
    }
  }
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  return fd;
}

Status SendAll(int fd, const std::string& data, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, "send"));
    } else {
      return Unavailable(std::string("send: ") + std::strerror(errno));
    }
  }
  return OkStatus();
}

std::string FormatPost(const HostPort& ep, const std::string& path, const std::string& body,
                       bool close) {
  return "POST " + path + " HTTP/1.1\r\nHost: " + ep.ToString() +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         (close ? "\r\nConnection: close" : "") + "\r\n\r\n" + body;
}

// Reads once (waiting until the deadline) and feeds the parser. Unavailable at the end of the
// connection (after FinishAtEof).
Status ReadSome(int fd, server::HttpResponseParser* parser, Clock::time_point deadline,
                std::vector<std::string>* pieces) {
  RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, "read"));
  char buf[16 << 10];
  const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return OkStatus();
  if (n <= 0) {
    const std::string why = n == 0 ? "the connection closed" : std::strerror(errno);
    if (parser->FinishAtEof(pieces)) return OkStatus();
    return Unavailable("the answer was cut short: " + why);
  }
  return parser->Feed(std::string_view(buf, static_cast<size_t>(n)), pieces);
}

}  // namespace

Result<HostPort> ParseHostPort(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument("'" + text + "' is not HOST:PORT");
  }
  HostPort hp;
  hp.host = text.substr(0, colon);
  if (hp.host.front() == '[' && hp.host.back() == ']')
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  const std::string port = text.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      std::stoi(port) < 1 || std::stoi(port) > 65535) {
    return InvalidArgument("'" + text + "': port '" + port + "' is not a number in 1..65535");
  }
  hp.port = std::stoi(port);
  return hp;
}

Result<HttpReply> HttpPost(const HostPort& ep, const std::string& path, const std::string& body,
                           int timeout_ms) {
  const Clock::time_point deadline = DeadlineIn(timeout_ms);
  ASSIGN_OR_RETURN(int fd, Connect(ep, deadline));
  server::HttpResponseParser parser;
  std::vector<std::string> pieces;
  Status s = SendAll(fd, FormatPost(ep, path, body, /*close=*/true), deadline);
  while (s.ok() && !parser.done()) s = ReadSome(fd, &parser, deadline, &pieces);
  ::close(fd);
  if (!s.ok()) return s.WithContext("POST http://" + ep.ToString() + path);
  HttpReply reply;
  reply.status = parser.status();
  for (const std::string& p : pieces) reply.body += p;
  return reply;
}

Result<std::unique_ptr<HttpStream>> HttpStream::Open(const HostPort& ep, const std::string& path,
                                                     const std::string& body, int timeout_ms) {
  const Clock::time_point deadline = DeadlineIn(timeout_ms);
  ASSIGN_OR_RETURN(int fd, Connect(ep, deadline));
  std::unique_ptr<HttpStream> stream(new HttpStream(fd));
  std::vector<std::string> pieces;
  Status s = SendAll(fd, FormatPost(ep, path, body, /*close=*/false), deadline);
  while (s.ok() && !stream->parser_.head_done()) {
    s = ReadSome(fd, &stream->parser_, deadline, &pieces);
  }
  if (s.ok() && stream->parser_.status() != 200) {
    while (s.ok() && !stream->parser_.done()) {
      s = ReadSome(fd, &stream->parser_, deadline, &pieces);
    }
    std::string text;
    for (const std::string& p : pieces) text += p;
    return Unavailable("POST http://" + ep.ToString() + path + ": HTTP " +
                       std::to_string(stream->parser_.status()) + ": " + text.substr(0, 300));
  }
  if (!s.ok()) return s.WithContext("POST http://" + ep.ToString() + path);
  if (!pieces.empty()) stream->early_ = std::move(pieces);
  return stream;
}

HttpStream::~HttpStream() { ::close(fd_); }

Status HttpStream::Read(int timeout_ms, std::vector<std::string>* pieces) {
  if (!early_.empty()) {
    for (std::string& p : early_) pieces->push_back(std::move(p));
    early_.clear();
    return OkStatus();
  }
  if (cancelled_) return Cancelled("the stream was cancelled");
  if (parser_.done()) return Unavailable("the stream ended");
  Status s = ReadSome(fd_, &parser_, DeadlineIn(timeout_ms), pieces);
  if (cancelled_) return Cancelled("the stream was cancelled");
  if (s.code() == StatusCode::kDeadlineExceeded) return OkStatus();
  return s;
}

void HttpStream::Cancel() {
  cancelled_ = true;
  ::shutdown(fd_, SHUT_RDWR);
}

}  // namespace pd::cluster
