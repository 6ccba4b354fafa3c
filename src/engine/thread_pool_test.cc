#include "engine/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace pd::engine {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << i;
    }
  }
}

TEST(ThreadPoolTest, ThreadIndexIsUniquePerChunk) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> used(4);
  std::atomic<int> chunks{0};
  pool.ParallelFor(10, [&](int64_t b, int64_t e, int thread) {
    ASSERT_GE(thread, 0);
    ASSERT_LT(thread, 4);
    EXPECT_EQ(b, 10 * thread / 4);
    EXPECT_EQ(e, 10 * (thread + 1) / 4);
    used[thread].fetch_add(1);
    chunks.fetch_add(1);
  });
  EXPECT_EQ(chunks.load(), 4);
  for (auto& u : used) EXPECT_EQ(u.load(), 1);
}

TEST(ThreadPoolTest, ManyBackToBackCallsSumCorrectly) {
  ThreadPool pool(3);
  std::vector<int64_t> partial(3);
  int64_t total = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::fill(partial.begin(), partial.end(), 0);
    pool.ParallelFor(100 + iter % 7, [&](int64_t b, int64_t e, int t) {
      for (int64_t i = b; i < e; ++i) partial[t] += i;
    });
    for (int64_t p : partial) total += p;
  }
  int64_t expected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const int64_t n = 100 + iter % 7;
    expected += n * (n - 1) / 2;
  }
  EXPECT_EQ(total, expected);
}

TEST(ThreadPoolTest, NonPositiveThreadCountMeansInline) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  int calls = 0;
  pool.ParallelFor(5, [&](int64_t b, int64_t e) {
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 5);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace pd::engine
