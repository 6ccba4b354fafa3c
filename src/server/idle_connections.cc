#include "server/idle_connections.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace pd::server {

IdleConnections::IdleConnections(int idle_timeout_ms, int max_parked, Resume resume)
    : idle_timeout_(std::max(1, idle_timeout_ms)),
      max_parked_(max_parked),
      resume_(std::move(resume)) {}

Result<std::unique_ptr<IdleConnections>> IdleConnections::Create(int idle_timeout_ms,
                                                                 int max_parked, Resume resume) {
  std::unique_ptr<IdleConnections> idle(
      new IdleConnections(idle_timeout_ms, max_parked, std::move(resume)));
  EventLoopOptions lo;
  lo.thread_name = "pd-http-idle";
  lo.tick_ms = std::clamp(idle_timeout_ms / 4, 10, 250);
  lo.on_tick = [raw = idle.get()] { raw->CloseExpired(); };
  ASSIGN_OR_RETURN(idle->loop_, EventLoop::Create(lo));
  return idle;
}

IdleConnections::~IdleConnections() { Stop(); }

bool IdleConnections::Park(int fd, int requests_left) {
  if (loop_ == nullptr) {  // stopped
    ::close(fd);
    return true;
  }
  int parked = num_parked_.load();
  do {  // checked and counted at once: concurrent callers cannot all pass the same check
    if (max_parked_ > 0 && parked >= max_parked_) return false;
  } while (!num_parked_.compare_exchange_weak(parked, parked + 1));
  loop_->Post([this, fd, requests_left] {
    Parked p;
    p.requests_left = requests_left;
    p.deadline = std::chrono::steady_clock::now() + idle_timeout_;
    p.token = loop_->Watch(fd, EPOLLIN, [this, fd](uint32_t) { Wake(fd); });
    if (p.token == 0) {  // cannot watch it: let an HTTP thread wait on it as before
      num_parked_.fetch_sub(1);
      return resume_(fd, requests_left);
    }
    parked_[fd] = p;
  });
  return true;
}

void IdleConnections::Wake(int fd) {
  auto it = parked_.find(fd);
  if (it == parked_.end()) return;
  const int left = it->second.requests_left;
  loop_->Unwatch(it->second.token);
  parked_.erase(it);
  num_parked_.fetch_sub(1);
  resume_(fd, left);
}

void IdleConnections::CloseExpired() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<int> expired;
  for (const auto& [fd, p] : parked_) {
    if (now >= p.deadline) expired.push_back(fd);
  }
  for (int fd : expired) {
    loop_->Unwatch(parked_[fd].token);
    parked_.erase(fd);
    num_parked_.fetch_sub(1);
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
  }
}

void IdleConnections::Stop() {
  if (loop_ == nullptr) return;
  loop_->Post([this] {
    for (const auto& [fd, p] : parked_) {
      loop_->Unwatch(p.token);
      ::close(fd);
    }
    num_parked_.fetch_sub(static_cast<int>(parked_.size()));
    parked_.clear();
  });
  loop_->Stop();
  loop_.reset();
}

}  // namespace pd::server
