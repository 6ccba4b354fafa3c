// Kept-alive connections between two requests (and new ones whose first request has not come
// yet), watched by one event-loop thread instead of each holding an HTTP thread: one that turns
// readable (its next request, or its close) is handed back to `resume`; one idle for
// idle_timeout_ms is closed.
//
// Thread safety: Park, Stop and num_parked from any thread; `resume` runs on the loop thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <unordered_map>

#include "common/status.h"
#include "server/event_loop.h"

namespace pd::server {

class IdleConnections {
 public:
  // Takes over `fd` again; `requests_left` is what Park was given.
  using Resume = std::function<void(int fd, int requests_left)>;

  // At most `max_parked` connections wait at once (<= 0: no limit).
  static Result<std::unique_ptr<IdleConnections>> Create(int idle_timeout_ms, int max_parked,
                                                         Resume resume);
  ~IdleConnections();  // Stop()

  // Owns `fd` until it is resumed or closed; false (the caller keeps `fd`) when max_parked
  // connections wait already.
  [[nodiscard]] bool Park(int fd, int requests_left);
  // Closes every parked connection and ends the loop thread. Idempotent.
  void Stop();
  int num_parked() const { return num_parked_.load(); }

 private:
  struct Parked {
    uint64_t token = 0;
    int requests_left = 0;
    std::chrono::steady_clock::time_point deadline;
  };
  IdleConnections(int idle_timeout_ms, int max_parked, Resume resume);
  void Wake(int fd);
  void CloseExpired();

  const std::chrono::milliseconds idle_timeout_;
  const int max_parked_;
  const Resume resume_;
  std::unique_ptr<EventLoop> loop_;
  std::atomic<int> num_parked_{0};
  std::unordered_map<int, Parked> parked_;  // loop thread only; by descriptor
};

}  // namespace pd::server
