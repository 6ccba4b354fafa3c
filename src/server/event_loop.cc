#include "server/event_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "common/thread_util.h"

namespace pd::server {

namespace {
constexpr uint64_t kWakeToken = 0;
}  // namespace

Result<std::unique_ptr<EventLoop>> EventLoop::Create(const EventLoopOptions& options) {
  const int epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) return Internal(std::string("epoll_create1: ") + std::strerror(errno));
  const int wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    ::close(epoll_fd);
    return Internal(std::string("eventfd: ") + std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeToken;
  if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &ev) != 0) {
    const std::string why = std::strerror(errno);
    ::close(wake_fd);
    ::close(epoll_fd);
    return Internal("epoll_ctl(eventfd): " + why);
  }
  std::unique_ptr<EventLoop> loop(new EventLoop(options, epoll_fd, wake_fd));
  loop->thread_ = std::thread([raw = loop.get()] { raw->Run(); });
  return loop;
}

EventLoop::EventLoop(const EventLoopOptions& options, int epoll_fd, int wake_fd)
    : options_(options), epoll_fd_(epoll_fd), wake_fd_(wake_fd) {}

EventLoop::~EventLoop() {
  Stop();
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

void EventLoop::Post(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    if (exited_) return;
    posted_.push_back(std::move(task));
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void EventLoop::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable() && !InLoopThread()) thread_.join();
  MutexLock lock(&mu_);
  posted_.clear();
}

uint64_t EventLoop::Watch(int fd, uint32_t events, Handler handler) {
  const uint64_t token = next_token_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) return 0;
  watched_[token] = Watched{fd, events, std::make_shared<Handler>(std::move(handler))};
  return token;
}

void EventLoop::Modify(uint64_t token, uint32_t events) {
  auto it = watched_.find(token);
  if (it == watched_.end() || it->second.events == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, it->second.fd, &ev) == 0) it->second.events = events;
}

void EventLoop::Unwatch(uint64_t token) {
  auto it = watched_.find(token);
  if (it == watched_.end()) return;
  (void)::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
  watched_.erase(it);
}

void EventLoop::RunPosted() {
  uint64_t count = 0;
  (void)!::read(wake_fd_, &count, sizeof(count));
  std::deque<std::function<void()>> tasks;
  {
    MutexLock lock(&mu_);
    tasks.swap(posted_);
  }
  for (auto& task : tasks) task();
}

void EventLoop::Run() {
  SetCurrentThreadName(options_.thread_name);
  // Best effort: the loop writes every stream's tokens, so it should run as soon as it wakes.
  (void)SetCurrentThreadLatencySensitive();
  const auto period = std::chrono::milliseconds(std::max(1, options_.tick_ms));
  next_tick_ = std::chrono::steady_clock::now() + period;
  std::array<epoll_event, 256> events;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_tick_) {
      next_tick_ = now + period;
      if (options_.on_tick) options_.on_tick();
    }
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_tick_ - now).count() + 1;
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                               static_cast<int>(wait));
    for (int i = 0; i < n; ++i) {
      const uint64_t token = events[i].data.u64;
      if (token == kWakeToken) continue;  // tasks run below, after the sockets' events
      auto it = watched_.find(token);
      if (it == watched_.end()) continue;  // unwatched earlier in this batch
      std::shared_ptr<Handler> handler = it->second.handler;
      (*handler)(events[i].events);
    }
    RunPosted();
    MutexLock lock(&mu_);
    if (stopping_ && posted_.empty()) {
      exited_ = true;
      return;
    }
  }
}

}  // namespace pd::server
