// A client connection that an HTTP thread handed over (LimitedHttpServer::DetachCurrentConnection)
// once the request was read: the event loop writes the response as it comes, without blocking,
// and notices when the client goes away. When the response ends the connection is closed, or
// with keep_alive handed back (on_reusable) for the client's next request.
//
// Thread safety: loop thread only (create it in a task posted to the loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "server/event_loop.h"

namespace pd::server {

class ClientStream {
 public:
  struct Options {
    int write_timeout_ms = 30000;  // the client read nothing for this long with bytes pending
    // Called once, when the connection is closed: clean after End() was written out; not clean
    // when the client closed or reset it, or stalled past write_timeout_ms. Must not destroy
    // the ClientStream synchronously (post that to the loop).
    std::function<void(bool clean)> on_closed;
    // Called when pending bytes fell back under kLowWater after reaching kHighWater.
    std::function<void()> on_drained;
    // Set: the head says "Connection: keep-alive", and once the response is written whole the
    // descriptor goes to on_reusable (before on_closed(true)) instead of being closed. The
    // client's next request is then left unread.
    std::function<void(int fd)> on_reusable;
  };
  static constexpr size_t kHighWater = 1u << 20;
  static constexpr size_t kLowWater = 64u << 10;

  // Takes `fd` (made non-blocking) and watches it on `loop`.
  ClientStream(EventLoop& loop, int fd, Options options);
  ~ClientStream();  // closes the connection if open (on_closed is not called then)
  ClientStream(const ClientStream&) = delete;
  ClientStream& operator=(const ClientStream&) = delete;

  // A response head: status line, `headers` ("Name: value\r\n" each) and Connection.
  void WriteHead(int status, std::string_view headers);
  void Write(std::string_view bytes);
  void WriteChunk(std::string_view data);  // one chunk of a chunked body (none when empty)
  void End();                              // close once everything is written
  void EndChunked() {
    Write("0\r\n\r\n");
    End();
  }

  bool open() const { return fd_ >= 0; }
  bool ending() const { return ending_; }
  size_t pending_bytes() const { return out_.size() - out_off_; }
  bool above_high_water() const { return pending_bytes() >= kHighWater; }
  // From the loop's tick: closes a connection whose client stopped reading.
  void CheckStalled(std::chrono::steady_clock::time_point now);

 private:
  void OnEvents(uint32_t events);
  void Flush();
  void Close(bool clean);

  EventLoop& loop_;
  int fd_;
  const Options options_;
  uint64_t token_ = 0;
  std::string out_;
  size_t out_off_ = 0;
  bool ending_ = false;
  bool was_high_ = false;
  bool reading_ = true;  // watching for the client's close (or next request)
  std::chrono::steady_clock::time_point last_progress_;
};

// "OK", "Bad Gateway", ... for a status line.
const char* ReasonPhrase(int status);

}  // namespace pd::server
