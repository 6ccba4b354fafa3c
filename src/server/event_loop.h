// One thread that waits on many sockets (epoll, level-triggered) and runs their handlers, so that
// thousands of open streams cost file descriptors and buffers, not threads. Other threads hand it
// work with Post (an eventfd wakes it); a tick runs every tick_ms for timeouts.
//
// Handlers are found by a token that is never reused, so an event of a socket unwatched (and its
// descriptor number reused) earlier in the same batch is dropped, not delivered to a stranger.
//
// Thread safety: Post and Stop from any thread; Watch, Modify, Unwatch only on the loop thread
// (from a handler, a posted task or the tick).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/mutex.h"
#include "common/status.h"

namespace pd::server {

struct EventLoopOptions {
  std::string thread_name = "pd-loop";
  int tick_ms = 250;
  std::function<void()> on_tick;  // runs on the loop thread every tick_ms (may be empty)
};

class EventLoop {
 public:
  using Handler = std::function<void(uint32_t events)>;  // EPOLLIN | EPOLLOUT | ... that fired

  static Result<std::unique_ptr<EventLoop>> Create(const EventLoopOptions& options);
  ~EventLoop();  // Stop()
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Runs `task` on the loop thread. Tasks posted before Stop run before the thread ends; later
  // ones are dropped.
  void Post(std::function<void()> task) EXCLUDES(mu_);
  // Runs the tasks posted so far, then ends the thread. Idempotent.
  void Stop() EXCLUDES(mu_);
  bool InLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }

  // Loop thread only. Watch returns a token (0 when epoll_ctl fails).
  uint64_t Watch(int fd, uint32_t events, Handler handler);
  void Modify(uint64_t token, uint32_t events);
  void Unwatch(uint64_t token);  // before the descriptor is closed
  size_t num_watched() const { return watched_.size(); }

 private:
  struct Watched {
    int fd = -1;
    uint32_t events = 0;
    std::shared_ptr<Handler> handler;  // kept alive while it runs, even if unwatched meanwhile
  };
  EventLoop(const EventLoopOptions& options, int epoll_fd, int wake_fd);
  void Run();
  void RunPosted();

  const EventLoopOptions options_;
  const int epoll_fd_;
  const int wake_fd_;
  std::thread thread_;
  Mutex mu_;
  std::deque<std::function<void()>> posted_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  bool exited_ GUARDED_BY(mu_) = false;
  // Loop thread only.
  std::unordered_map<uint64_t, Watched> watched_;
  uint64_t next_token_ = 1;
  std::chrono::steady_clock::time_point next_tick_;
};

}  // namespace pd::server
