#include "messenger/channel.h"

#include <random>
#include <utility>
#include <vector>

namespace pd::messenger {

namespace {

uint64_t RandomSession() {
  std::random_device rd;
  uint64_t s = 0;
  while (s == 0) s = (uint64_t{rd()} << 32) ^ rd();
  return s;
}

}  // namespace

FrameCodec::FrameCodec(std::string secret, uint64_t session)
    : secret_(std::move(secret)),
      session_(session != 0 ? session : RandomSession()),
      next_seq_(static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch() /
                                      std::chrono::nanoseconds(1))) {}

std::string FrameCodec::Encode(const Message& message, uint64_t recipient_session) {
  Frame frame{session_, recipient_session, next_seq_.fetch_add(1), message};
  std::vector<uint8_t> bytes = EncodeFrame(frame, secret_);
  return std::string(bytes.begin(), bytes.end());
}

Result<Frame> FrameCodec::Decode(std::string_view bytes) const {
  return DecodeFrame(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), secret_);
}

Status FrameCodec::CheckRecipient(const Frame& frame) const {
  if (frame.recipient_session == session_) return OkStatus();
  if (frame.recipient_session == 0 && std::holds_alternative<Hello>(frame.message)) {
    return OkStatus();
  }
  return FailedPrecondition("frame of session " + std::to_string(frame.sender_session) +
                            " is meant for session " + std::to_string(frame.recipient_session) +
                            ", not ours (" + std::to_string(session_) +
                            "): sent to another instance, or to a previous run of this one");
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
