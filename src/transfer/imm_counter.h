// Immediate-data counters: the receiver of one-sided writes says "I expect N writes carrying imm
// X" and learns, by callback or by polling, when they have all landed — in any order, without the
// writer telling it. Arrivals for an imm nobody expects yet are kept, so a counter registered late
// still fires at the right count.
//
// Thread safety: every method may be called from any thread. Domain workers call OnArrival;
// callbacks run on the thread whose call completed the count (a worker, or Expect's caller when
// the writes had already landed) and must not block; a counter's callback has returned before
// its waiter reports the count reached.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

#include "common/mutex.h"
#include "common/status.h"

namespace pd::transfer {

// The pollable side of one counter. Shared between the table and whoever waits.
class ImmWaiter {
 public:
  bool reached() const EXCLUDES(mu_);
  uint64_t received() const EXCLUDES(mu_);
  // Waits until the count is reached or `timeout_s` passes; returns reached().
  bool WaitFor(double timeout_s) const EXCLUDES(mu_);

 private:
  friend class ImmCounterTable;
  mutable Mutex mu_;
  mutable CondVar cv_;
  bool reached_ GUARDED_BY(mu_) = false;
  uint64_t received_ GUARDED_BY(mu_) = 0;
};

class ImmCounterTable {
 public:
  using Callback = std::function<void()>;

  // Expects `count` (> 0) writes carrying `imm`. Fails with AlreadyExists if a counter for `imm`
  // is active. Fires at once when earlier arrivals already make the count.
  Result<std::shared_ptr<const ImmWaiter>> Expect(uint32_t imm, uint64_t count,
                                                  Callback callback = {}) EXCLUDES(mu_);
  // Cancels the counter for `imm`: its callback never fires and arrivals kept for it are dropped.
  // Returns false when no counter and no kept arrivals existed.
  bool Remove(uint32_t imm) EXCLUDES(mu_);
  // Counts one landed write carrying `imm`.
  void OnArrival(uint32_t imm) EXCLUDES(mu_);

  size_t num_active() const EXCLUDES(mu_);
  // Arrivals kept for imm values nobody expects (yet).
  uint64_t unclaimed(uint32_t imm) const EXCLUDES(mu_);

 private:
  struct Entry {
    uint64_t expected = 0;
    uint64_t received = 0;
    Callback callback;
    std::shared_ptr<ImmWaiter> waiter;
  };
  // Runs the callback, then marks the waiter reached; called without mu_ (the callback may call
  // Expect or Remove).
  static void Fire(Entry& entry);
  // Publishes `received` to the waiter's pollers.
  static void SetReceived(ImmWaiter* waiter, uint64_t received);

  mutable Mutex mu_;
  std::unordered_map<uint32_t, Entry> active_ GUARDED_BY(mu_);
  std::unordered_map<uint32_t, uint64_t> unclaimed_ GUARDED_BY(mu_);
};

}  // namespace pd::transfer
