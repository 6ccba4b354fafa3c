#include "engine/thread_pool.h"

#include <immintrin.h>

#include "common/check.h"

namespace pd::engine {
namespace {
// Waiting: a few pause-spins (jobs of a forward pass come microseconds apart), then yields (so an
// oversubscribed machine still makes progress), then, for idle workers, sleep on the condvar.
constexpr int kPauseRounds = 64;
constexpr int kYieldRounds = 2000;

// Returns true once done() holds; false after the spin budget when may_give_up.
template <typename Done>
bool SpinUntil(Done done, bool may_give_up) {
  for (int i = 0;; ++i) {
    if (done()) return true;
    if (i < kPauseRounds) {
      for (int p = 0; p < 8; ++p) _mm_pause();
    } else if (may_give_up && i >= kPauseRounds + kYieldRounds) {
      return false;
    } else {
      std::this_thread::yield();
    }
  }
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  workers_.reserve(num_threads_ - 1);
  for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.SignalAll();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::RunChunk(int thread) {
  const int64_t begin = job_n_ * thread / num_threads_;
  const int64_t end = job_n_ * (thread + 1) / num_threads_;
  if (begin < end) job_fn_(job_ctx_, begin, end, thread);
}

void ThreadPool::Run(int64_t n, RawFn fn, void* ctx) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1) {
    fn(ctx, 0, n, 0);
    return;
  }
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_n_ = n;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1);  // seq_cst: pairs with the sleeper's increment
  if (sleepers_.load() > 0) {
    MutexLock lock(&mu_);  // orders the notify after a sleeper's check
    cv_.SignalAll();
  }
  RunChunk(0);
  SpinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; }, false);
}

void ThreadPool::WorkerLoop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = seen;
    const bool got = SpinUntil(
        [&] { return (gen = generation_.load(std::memory_order_acquire)) != seen; }, true);
    if (!got) {
      MutexLock lock(&mu_);
      sleepers_.fetch_add(1);
      while (generation_.load() == seen) cv_.Wait(&mu_);
      sleepers_.fetch_sub(1, std::memory_order_acq_rel);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    RunChunk(thread);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace pd::engine
