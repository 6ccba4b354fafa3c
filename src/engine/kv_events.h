// The prefix cache's page keys as an event stream, for KV-aware routing (server/kv_index.h): a
// router asks an instance which page keys it holds (a snapshot) and then what it stored and
// evicted since (events with sequence numbers), and routes each prompt where most of its pages
// already are.
//
// The PagePool reports every key it indexes (OnStored) and every key it evicts (OnRemoved). The
// log always mirrors the set of keys held (one hash-set operation per page stored or evicted);
// events are kept only while someone listens: a Poll within the last listener_idle_ms. While
// nobody listens nothing is recorded, and a listener that comes back finds a gap and takes a
// snapshot. Memory is bounded: at most max_events events are kept (older ones are dropped, and a
// listener that fell behind them resnapshots) and the mirror holds at most one key per page.
//
// Each log has a random epoch: a listener that polls another epoch (the instance restarted) or a
// sequence number the log no longer holds gets a snapshot.
//
// Thread safety: every method locks mu_. PagePool calls OnStored/OnRemoved under its own mutex
// (lock order: the pool's, then this one's); Poll waits on the condition without the pool's.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"

namespace pd::engine {

struct KvEvent {
  uint64_t seq = 0;
  bool stored = true;  // false: removed
  uint64_t key = 0;
};

struct KvEventBatch {
  uint64_t epoch = 0;
  uint64_t root = 0;  // PrefixCacheRoot of the keys (set by the engine)
  int page_size = 0;  // tokens per keyed page; 0: the instance has no prefix cache
  bool snapshot = false;
  uint64_t seq = 0;             // the last event the batch accounts for (the next poll's `after`)
  std::vector<uint64_t> keys;   // snapshot: every key held after event `seq`
  std::vector<KvEvent> events;  // otherwise: the events after `after`, in order, up to `seq`
};

struct KvEventLogOptions {
  size_t max_events = 1 << 16;       // events kept for listeners (about 1.5 MiB)
  int64_t listener_idle_ms = 10000;  // no Poll for this long: nobody listens, nothing is kept
};

class KvEventLog {
 public:
  explicit KvEventLog(const KvEventLogOptions& options = {});

  void SetFormat(uint64_t root, int page_size) EXCLUDES(mu_);
  void OnStored(uint64_t key) EXCLUDES(mu_);
  void OnRemoved(uint64_t key) EXCLUDES(mu_);

  // What happened after event `after` of `epoch`: the events, waiting up to `wait` for the first
  // one, at most max_events of them (the next poll gets the rest); or a snapshot when the log
  // cannot account for every event since (another epoch, dropped events, a sequence number it
  // never gave). epoch 0 asks for a snapshot.
  KvEventBatch Poll(uint64_t epoch, uint64_t after, std::chrono::milliseconds wait,
                    size_t max_events) EXCLUDES(mu_);
  // Wakes every waiting Poll and makes later ones return at once (the server stops).
  void Close() EXCLUDES(mu_);

  uint64_t epoch() const { return epoch_; }
  size_t num_keys() const EXCLUDES(mu_);
  size_t num_kept_events() const EXCLUDES(mu_);

 private:
  void Record(bool stored, uint64_t key) REQUIRES(mu_);
  bool Listening(std::chrono::steady_clock::time_point now) const REQUIRES(mu_);

  const KvEventLogOptions options_;
  const uint64_t epoch_;
  mutable Mutex mu_;
  CondVar changed_;
  uint64_t root_ GUARDED_BY(mu_) = 0;
  int page_size_ GUARDED_BY(mu_) = 0;
  std::unordered_set<uint64_t> keys_ GUARDED_BY(mu_);
  uint64_t last_seq_ GUARDED_BY(mu_) = 0;  // the newest event's number (events count from 1)
  // events_ holds events first_kept_ .. last_seq_ (empty when first_kept_ == last_seq_ + 1).
  std::deque<KvEvent> events_ GUARDED_BY(mu_);
  uint64_t first_kept_ GUARDED_BY(mu_) = 1;
  std::chrono::steady_clock::time_point last_poll_ GUARDED_BY(mu_);
  bool polled_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
};

}  // namespace pd::engine
