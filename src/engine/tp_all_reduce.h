// Private to src/engine: the all-reduce that joins the partial sums of a tensor-parallel
// instance's ranks (tp_model_runner.h), each rank a thread of this process.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace pd::engine {

// A barrier whose waiters spin a little, then yield, and never sleep: ranks meet twice per layer,
// microseconds apart, and a futex sleep's wake-up costs a scheduler tick on a loaded machine.
// Thread safety: any num_ranks threads, each calling ArriveAndWait once per phase.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void ArriveAndWait() {
    const uint64_t gen = generation_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);  // publishes every arriver's writes
      return;
    }
    for (int i = 0; generation_.load(std::memory_order_acquire) == gen; ++i) {
      if (i < 256) {
        _mm_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<uint64_t> generation_{0};
};

// Sum of the ranks' partial outputs in a fixed rank order (deterministic, and bit-identical on
// every rank). Collective: every rank calls Arrive, reads Parts(), then calls Depart.
// Thread safety: each rank calls from its own thread; parts_[r] is written only by rank r before
// the first barrier and read by all between the two barriers.
class TpAllReduce {
 public:
  explicit TpAllReduce(int num_ranks) : parts_(num_ranks, nullptr), barrier_(num_ranks) {}
  int num_ranks() const { return static_cast<int>(parts_.size()); }
  // Publishes rank's partial and waits until every rank has published.
  void Arrive(int rank, const float* partial) {
    parts_[rank] = partial;
    barrier_.ArriveAndWait();
  }
  const std::vector<const float*>& Parts() const { return parts_; }
  // Waits until every rank is done reading the partials (they may be overwritten after).
  void Depart() { barrier_.ArriveAndWait(); }

 private:
  std::vector<const float*> parts_;
  SpinBarrier barrier_;
};

}  // namespace pd::engine
