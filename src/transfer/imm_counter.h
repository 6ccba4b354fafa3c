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

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/status.h"

namespace pd::transfer {

// The pollable side of one counter. Shared between the table and whoever waits.
class ImmWaiter {
 public:
  bool reached() const;
  uint64_t received() const;
  // Waits until the count is reached or `timeout_s` passes; returns reached().
  bool WaitFor(double timeout_s) const;

 private:
  friend class ImmCounterTable;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool reached_ = false;   // GUARDED_BY(mu_)
  uint64_t received_ = 0;  // GUARDED_BY(mu_)
};

class ImmCounterTable {
 public:
  using Callback = std::function<void()>;

  // Expects `count` (> 0) writes carrying `imm`. Fails with AlreadyExists if a counter for `imm`
  // is active. Fires at once when earlier arrivals already make the count.
  Result<std::shared_ptr<const ImmWaiter>> Expect(uint32_t imm, uint64_t count,
                                                  Callback callback = {});
  // Cancels the counter for `imm`: its callback never fires and arrivals kept for it are dropped.
  // Returns false when no counter and no kept arrivals existed.
  bool Remove(uint32_t imm);
  // Counts one landed write carrying `imm`.
  void OnArrival(uint32_t imm);

  size_t num_active() const;
  // Arrivals kept for imm values nobody expects (yet).
  uint64_t unclaimed(uint32_t imm) const;

 private:
  struct Entry {
    uint64_t expected = 0;
    uint64_t received = 0;
    Callback callback;
    std::shared_ptr<ImmWaiter> waiter;
  };
  static void Fire(Entry& entry);

  mutable std::mutex mu_;
  std::unordered_map<uint32_t, Entry> active_;        // GUARDED_BY(mu_)
  std::unordered_map<uint32_t, uint64_t> unclaimed_;  // GUARDED_BY(mu_)
};

}  // namespace pd::transfer
