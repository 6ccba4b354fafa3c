// Immediate-data counters: the receiver of one-sided writes says "I expect N writes carrying imm
// X" and learns, by callback or by polling, when they have all landed — in any order, without the
// writer telling it. Arrivals for an imm nobody expects yet are kept, so a counter registered late
// still fires at the right count — but only for a while and only so many: an imm value kept longer
// than Options::unclaimed_ttl_s, or beyond the Options::max_unclaimed_imms most recent ones, is
// dropped (oldest first) and counted in expired_arrivals(). A counter registered after its imm's
// arrivals expired counts only the arrivals after that. (The decode messenger registers every
// counter before it asks for the writes, so what it leaves unclaimed are late writes of attempts it
// already gave up on: they must never count towards a later transfer.)
//
// Thread safety: every method may be called from any thread. Domain workers call OnArrival;
// callbacks run on the thread whose call completed the count (a worker, or Expect's caller when
// the writes had already landed) and must not block; a counter's callback has returned before
// its waiter reports the count reached.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <unordered_map>

#include "common/clock.h"
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
  struct Options {
    // How long arrivals for an imm nobody expects are kept, from the first of them.
    double unclaimed_ttl_s = 30.0;
    // How many distinct unclaimed imm values are kept at once; a new one beyond this drops the
    // oldest.
    size_t max_unclaimed_imms = 4096;
    const Clock* clock = nullptr;  // SystemClock when null
  };

  ImmCounterTable() : ImmCounterTable(Options{}) {}
  explicit ImmCounterTable(Options options);

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
  // Distinct imm values with arrivals kept.
  size_t num_unclaimed_imms() const EXCLUDES(mu_);
  // Arrivals dropped unclaimed (too old, or too many distinct imms) over the table's life.
  uint64_t expired_arrivals() const EXCLUDES(mu_);

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

  struct Unclaimed {
    uint64_t count = 0;
    double first_arrival_s = 0.0;
    std::list<uint32_t>::iterator order;  // its place in unclaimed_order_
  };
  // Drops unclaimed entries older than the TTL; returns the arrivals dropped.
  uint64_t ExpireOld(double now_s) REQUIRES(mu_);
  // Keeps one arrival for `imm` (no counter), expiring old entries and the oldest beyond the cap;
  // returns the arrivals dropped.
  uint64_t KeepUnclaimed(uint32_t imm, double now_s) REQUIRES(mu_);
  // Drops the oldest unclaimed entry; returns its arrivals.
  uint64_t DropOldest() REQUIRES(mu_);
  void EraseUnclaimed(std::unordered_map<uint32_t, Unclaimed>::iterator it) REQUIRES(mu_);
  // Logs (rate-limited) that `arrivals` unclaimed arrivals were dropped; called without mu_.
  static void ReportExpired(uint64_t arrivals, size_t kept);

  const Options options_;
  const Clock& clock_;
  mutable Mutex mu_;
  std::unordered_map<uint32_t, Entry> active_ GUARDED_BY(mu_);
  std::unordered_map<uint32_t, Unclaimed> unclaimed_ GUARDED_BY(mu_);
  std::list<uint32_t> unclaimed_order_ GUARDED_BY(mu_);  // oldest first arrival first
  uint64_t expired_arrivals_ GUARDED_BY(mu_) = 0;
};

}  // namespace pd::transfer
