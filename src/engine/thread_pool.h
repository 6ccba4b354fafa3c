// A persistent pool of worker threads for the forward pass: threads are started once, and each
// ParallelFor hands them a range without allocating.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/mutex.h"

namespace pd::engine {

// Thread safety: ParallelFor is called by one thread at a time (the owner); it blocks until every
// chunk has run. The calling thread runs chunk 0 itself.
class ThreadPool {
 public:
  // num_threads counts the caller: 1 means no workers (everything runs inline).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Splits [0, n) into at most num_threads() contiguous chunks and calls fn(begin, end) or
  // fn(begin, end, thread) for each non-empty one; `thread` in [0, num_threads()) is unique per
  // chunk of this call (for per-thread scratch). Chunk t is [n*t/T, n*(t+1)/T).
  template <typename Fn>
  void ParallelFor(int64_t n, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    Run(n, &Trampoline<F>, const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using RawFn = void (*)(void* ctx, int64_t begin, int64_t end, int thread);

  template <typename F>
  static void Trampoline(void* ctx, int64_t begin, int64_t end, int thread) {
    F& f = *static_cast<F*>(ctx);
    if constexpr (std::is_invocable_v<F&, int64_t, int64_t, int>) {
      f(begin, end, thread);
    } else {
      f(begin, end);
    }
  }

  void Run(int64_t n, RawFn fn, void* ctx);
  void WorkerLoop(int thread);
  void RunChunk(int thread);

  const int num_threads_;
  std::vector<std::thread> workers_;
  // The current job, published by bumping generation_ (release) after writing these.
  RawFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_n_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // workers that have not finished the current job
  std::atomic<bool> stop_{false};
  // Guards no field (the job is published through the atomics): a sleeper checks generation_
  // under it and Run notifies under it, so a wake-up cannot slip in between the two.
  Mutex mu_;
  CondVar cv_;  // workers sleep here after spinning a while
  std::atomic<int> sleepers_{0};
};

}  // namespace pd::engine
