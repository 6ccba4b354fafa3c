#include "messenger/channel.h"

#include <utility>
#include <vector>

namespace pd::messenger {

FrameCodec::FrameCodec(std::string secret)
    : secret_(std::move(secret)),
      next_seq_(static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch() /
                                      std::chrono::nanoseconds(1))) {}

std::string FrameCodec::Encode(const Message& message) {
  Frame frame{next_seq_.fetch_add(1), message};
  std::vector<uint8_t> bytes = EncodeFrame(frame, secret_);
  return std::string(bytes.begin(), bytes.end());
}

Result<Frame> FrameCodec::Decode(std::string_view bytes) const {
  return DecodeFrame(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), secret_);
}

Status ReplayGuard::Check(const std::string& sender, uint64_t seq) {
  Seen& s = senders_[sender];
  if (s.high >= kWindow && seq <= s.high - kWindow) {
    return FailedPrecondition("frame " + std::to_string(seq) +
                              " is older than the replay window (replay?)");
  }
  if (!s.recent.insert(seq).second) {
    return FailedPrecondition("frame " + std::to_string(seq) + " was already received (replay)");
  }
  if (seq > s.high) s.high = seq;
  while (!s.recent.empty() && s.high >= kWindow && *s.recent.begin() <= s.high - kWindow) {
    s.recent.erase(s.recent.begin());
  }
  return OkStatus();
}

void TaskQueue::Post(std::function<void()> task) {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    tasks_.push_back(std::move(task));
  }
  cv_.Signal();
}

bool TaskQueue::RunFor(std::chrono::milliseconds timeout) {
  std::deque<std::function<void()>> tasks;
  {
    MutexLock lock(&mu_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!stopped_ && !woken_ && tasks_.empty()) {
      if (!cv_.WaitUntil(&mu_, deadline)) break;
    }
    if (stopped_) return false;
    woken_ = false;
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task();
  return true;
}

void TaskQueue::Wake() {
  {
    MutexLock lock(&mu_);
    woken_ = true;
  }
  cv_.Signal();
}

void TaskQueue::Stop() {
  {
    MutexLock lock(&mu_);
    stopped_ = true;
    tasks_.clear();
  }
  cv_.SignalAll();
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace pd::messenger
