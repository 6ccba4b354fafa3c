// Small HTTP helpers for the server's tests: raw sockets (for limits and disconnects), SSE
// parsing and waiting on conditions with a deadline.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace pd::server::testing {

// A TCP connection to 127.0.0.1:port, closed on destruction.
class RawConnection {
 public:
  explicit RawConnection(int port);
  ~RawConnection();
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool ok() const { return fd_ >= 0; }
  // Sends everything; false when the peer closed or reset the connection.
  bool Send(const std::string& data);
  // Reads until `needle` appears, the peer closes, or the deadline passes; returns all read.
  std::string ReadUntil(const std::string& needle, std::chrono::milliseconds timeout);
  // True when there is something to read (or the peer closed) right now.
  bool Readable(int timeout_ms = 0) const;
  void Close();

 private:
  int fd_ = -1;
  std::string buffer_;
};

// The `data:` payloads of an SSE body, in order.
std::vector<std::string> SseData(const std::string& body);

// Polls `condition` until it holds or `timeout` passes (no fixed sleeps: 1 ms back-off).
bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

// The value of a Prometheus sample line `name{labels} value` (exact series text), or -1.
double MetricValue(const std::string& metrics_text, const std::string& series);

// This process's thread count, from /proc/self/status (-1 when unreadable).
int ThreadCount();

}  // namespace pd::server::testing
