#include "server/client_stream.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace pd::server {

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Status";
  }
}

ClientStream::ClientStream(EventLoop& loop, int fd, Options options)
    : loop_(loop), fd_(fd), options_(std::move(options)) {
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  last_progress_ = std::chrono::steady_clock::now();
  // Token 0 (epoll_ctl failed): writes are still tried; a stalled one ends at the tick.
  token_ = loop_.Watch(fd_, EPOLLIN, [this](uint32_t events) { OnEvents(events); });
}

ClientStream::~ClientStream() {
  if (fd_ < 0) return;
  loop_.Unwatch(token_);
  ::close(fd_);
}

void ClientStream::WriteHead(int status, std::string_view headers) {
  char line[64];
  std::snprintf(line, sizeof(line), "HTTP/1.1 %d %s\r\n", status, ReasonPhrase(status));
  std::string head = line;
  head.append(headers);
  head += options_.on_reusable ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  Write(head);
}

void ClientStream::Write(std::string_view bytes) {
  if (fd_ < 0 || ending_ || bytes.empty()) return;
  out_.append(bytes);
  Flush();
}

void ClientStream::WriteChunk(std::string_view data) {
  if (data.empty()) return;
  char size[24];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string framed = size;
  framed.append(data);
  framed += "\r\n";
  Write(framed);
}

void ClientStream::End() {
  if (fd_ < 0 || ending_) return;
  ending_ = true;
  Flush();
}

void ClientStream::Flush() {
  while (fd_ >= 0 && out_off_ < out_.size()) {
    const ssize_t n =
        ::send(fd_, out_.data() + out_off_, out_.size() - out_off_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out_off_ += static_cast<size_t>(n);
      last_progress_ = std::chrono::steady_clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return Close(false);  // reset or closed
  }
  if (fd_ < 0) return;
  if (out_off_ == out_.size()) {
    out_.clear();
    out_off_ = 0;
  } else if (out_off_ > (256u << 10)) {
    out_.erase(0, out_off_);
    out_off_ = 0;
  }
  if (pending_bytes() >= kHighWater) was_high_ = true;
  if (ending_ && pending_bytes() == 0) return Close(true);
  const uint32_t in = reading_ ? uint32_t{EPOLLIN} : uint32_t{EPOLLRDHUP};
  loop_.Modify(token_, pending_bytes() > 0 ? in | EPOLLOUT : in);
  if (was_high_ && pending_bytes() < kLowWater) {
    was_high_ = false;
    if (options_.on_drained) options_.on_drained();
  }
}

void ClientStream::OnEvents(uint32_t events) {
  if (events & EPOLLIN) {
    // The request was read whole; anything more is the client's next request (left for the
    // server when the connection is kept alive, dropped when it closes after this response) or
    // the client's close.
    char scratch[4096];
    const int flags = MSG_DONTWAIT | (options_.on_reusable ? MSG_PEEK : 0);
    const ssize_t n = ::recv(fd_, scratch, options_.on_reusable ? 1 : sizeof(scratch), flags);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      return Close(false);
    if (n > 0 && options_.on_reusable) {
      // The client's next request stays unread for the server; its close still shows (a FIN
      // after those bytes), so a client that leaves while its answer is computed is noticed.
      reading_ = false;
      loop_.Modify(token_, pending_bytes() > 0 ? uint32_t{EPOLLRDHUP | EPOLLOUT} : EPOLLRDHUP);
    }
  }
  if (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) return Close(false);
  if (events & EPOLLOUT) Flush();
}

void ClientStream::CheckStalled(std::chrono::steady_clock::time_point now) {
  if (fd_ < 0 || pending_bytes() == 0) return;
  if (now - last_progress_ > std::chrono::milliseconds(options_.write_timeout_ms)) Close(false);
}

void ClientStream::Close(bool clean) {
  if (fd_ < 0) return;
  loop_.Unwatch(token_);
  if (clean && options_.on_reusable) {
    options_.on_reusable(fd_);
  } else {
    if (clean) ::shutdown(fd_, SHUT_WR);
    ::close(fd_);
  }
  fd_ = -1;
  if (options_.on_closed) options_.on_closed(clean);
}

}  // namespace pd::server
