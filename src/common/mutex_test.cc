#include "common/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace pd {
namespace {

using Clock = std::chrono::steady_clock;

// Whether another thread can take `mu` right now (it gives it back at once).
bool FreeForOthers(Mutex* mu) {
  bool took = false;
  std::thread([&] {
    if (mu->TryLock()) {
      took = true;
      mu->Unlock();
    }
  }).join();
  return took;
}

TEST(MutexTest, TryLockFailsWhileAnotherThreadHoldsIt) {
  Mutex mu;
  if (!mu.TryLock()) FAIL() << "TryLock failed on a free mutex";
  EXPECT_FALSE(FreeForOthers(&mu));
  mu.Unlock();
  EXPECT_TRUE(FreeForOthers(&mu));
}

TEST(MutexLockTest, UnlockAndLockInsideTheScope) {
  Mutex mu;
  {
    MutexLock lock(&mu);
    EXPECT_FALSE(FreeForOthers(&mu));
    lock.Unlock();
    EXPECT_TRUE(FreeForOthers(&mu));
    lock.Lock();
    EXPECT_FALSE(FreeForOthers(&mu));
  }
  EXPECT_TRUE(FreeForOthers(&mu));
}

// A scope that ends unlocked must not unlock `mu` again, even when someone else took it meanwhile.
// Clang's analysis models the scope's end as releasing `mu` whoever holds it, so it would reject
// the very sequence this checks at run time.
void EndScopeUnlockedWhileTheMutexIsTaken(Mutex* mu,
                                          bool* destructor_left_it) NO_THREAD_SAFETY_ANALYSIS {
  {
    MutexLock lock(mu);
    lock.Unlock();
    if (!mu->TryLock()) {
      *destructor_left_it = false;
      return;
    }
  }
  *destructor_left_it = !FreeForOthers(mu);
  mu->Unlock();
}

TEST(MutexLockTest, ScopeEndingUnlockedDoesNotUnlockAgain) {
  Mutex mu;
  bool destructor_left_it = false;
  EndScopeUnlockedWhileTheMutexIsTaken(&mu, &destructor_left_it);
  EXPECT_TRUE(destructor_left_it);
  EXPECT_TRUE(FreeForOthers(&mu));
}

TEST(CondVarTest, WaitUntilTimesOutWithTheLockHeld) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  const auto deadline = Clock::now() + std::chrono::milliseconds(20);
  bool woken = true;
  while (woken) woken = cv.WaitUntil(&mu, deadline);  // true only on a spurious wake-up
  EXPECT_GE(Clock::now(), deadline);
  EXPECT_FALSE(FreeForOthers(&mu));
}

TEST(CondVarTest, WaitForTimesOut) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  const auto start = Clock::now();
  while (cv.WaitFor(&mu, std::chrono::milliseconds(5))) {
  }
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(5));
  EXPECT_FALSE(FreeForOthers(&mu));
}

struct Handoff {
  Mutex mu;
  CondVar waiting_cv;
  CondVar ready_cv;
  bool waiting GUARDED_BY(mu) = false;
  bool ready GUARDED_BY(mu) = false;
};

TEST(CondVarTest, SignalWakesAWaiter) {
  Handoff h;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  bool timed_out = false;
  std::thread waiter([&] {
    MutexLock lock(&h.mu);
    h.waiting = true;
    h.waiting_cv.Signal();
    while (!h.ready) {
      if (!h.ready_cv.WaitUntil(&h.mu, deadline)) {
        timed_out = true;
        break;
      }
    }
  });
  bool saw_waiter = true;
  {
    MutexLock lock(&h.mu);
    // Once `waiting` is seen under the lock, the waiter is inside WaitUntil: it set the flag and
    // released the lock only by waiting.
    while (!h.waiting) {
      if (!h.waiting_cv.WaitUntil(&h.mu, deadline)) {
        saw_waiter = h.waiting;
        break;
      }
    }
    h.ready = true;
  }
  h.ready_cv.Signal();
  waiter.join();
  EXPECT_TRUE(saw_waiter);
  EXPECT_FALSE(timed_out);
  EXPECT_LT(Clock::now(), deadline);
}

}  // namespace
}  // namespace pd
