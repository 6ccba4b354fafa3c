// Pieces both messenger sides share: frame encoding with a per-process session and sequence
// numbers, replay refusal per sender, and the task queue that feeds each side's own thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/mutex.h"
#include "common/status.h"
#include "messenger/wire.h"

namespace pd::messenger {

// Frames of one process: its session (random, drawn at start) names it as the sender of every
// frame and as the recipient it accepts. Thread safety: Encode from any thread; Decode and
// CheckRecipient are const and thread-safe.
class FrameCodec {
 public:
  // `session` 0: a random nonzero one.
  explicit FrameCodec(std::string secret, uint64_t session = 0);
  uint64_t session() const { return session_; }
  // A frame from our session to `recipient_session` (0 for a Hello: the peer's is not known yet).
  // sender_seq starts from the wall clock in ns, so a restarted process keeps increasing.
  std::string Encode(const Message& message, uint64_t recipient_session);
  // Header, limits, MAC and body (wire.h DecodeFrame).
  Result<Frame> Decode(std::string_view bytes) const;
  // FailedPrecondition unless the frame is meant for our session; a Hello may name none (0).
  Status CheckRecipient(const Frame& frame) const;

 private:
  const std::string secret_;
  const uint64_t session_;
  std::atomic<uint64_t> next_seq_;
};

// Refuses a frame whose sender_seq was already seen from that sender, or that is older than the
// window. Senders are keys the caller chooses (a peer's session; its fabric address for the
// handshake, whose sequence numbers keep increasing across restarts). Thread safety: not
// thread-safe (the owning messenger thread).
class ReplayGuard {
 public:
  static constexpr uint64_t kWindow = 4096;
  Status Check(const std::string& sender, uint64_t seq);
  void Forget(const std::string& sender) { senders_.erase(sender); }

 private:
  struct Seen {
    uint64_t high = 0;
    std::set<uint64_t> recent;  // seqs within the window below high
  };
  std::unordered_map<std::string, Seen> senders_;
};

// A queue of tasks run by one thread. Thread safety: Post and Stop from any thread.
class TaskQueue {
 public:
  void Post(std::function<void()> task) EXCLUDES(mu_);
  // Runs every queued task; waits up to `timeout` for one (or a Wake) when none is queued. False
  // once stopped.
  bool RunFor(std::chrono::milliseconds timeout) EXCLUDES(mu_);
  // Ends the current or next RunFor's wait without a task (a wake-up is never lost: it is kept
  // until a RunFor consumes it). Any thread.
  void Wake() EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);

 private:
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
  bool woken_ GUARDED_BY(mu_) = false;
  bool stopped_ GUARDED_BY(mu_) = false;
};

double NowSeconds();  // steady clock, for deadlines

}  // namespace pd::messenger
