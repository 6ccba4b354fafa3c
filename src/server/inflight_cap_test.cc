#include "server/inflight_cap.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace pd::server {
namespace {

TEST(InflightCapTest, AdmitsUpToTheCapAndAgainAfterARelease) {
  InflightCap cap(2);
  auto a = cap.TryAcquireSlot();
  auto b = cap.TryAcquireSlot();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(cap.TryAcquireSlot(), nullptr);
  EXPECT_EQ(cap.held(), 2);
  a.reset();
  EXPECT_EQ(cap.held(), 1);
  EXPECT_NE(cap.TryAcquireSlot(), nullptr);
  InflightCap none(0);
  std::vector<std::unique_ptr<InflightCap::Slot>> many;
  for (int i = 0; i < 1000; ++i) many.push_back(none.TryAcquireSlot());
  EXPECT_EQ(none.held(), 1000);
}

// Threads released together all try for the last few slots: never more than the cap are held at
// once, and every slot is given back.
TEST(InflightCapTest, ConcurrentAcquirersNeverExceedTheCap) {
  constexpr int kCap = 3;
  constexpr int kThreads = 8;
  InflightCap cap(kCap);
  std::atomic<int> peak{0};
  std::atomic<int> admitted{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      while (!go.load()) {
      }
      for (int i = 0; i < 20000; ++i) {
        auto slot = cap.TryAcquireSlot();
        if (slot == nullptr) continue;
        admitted.fetch_add(1);
        int now = cap.held();
        int seen = peak.load();
        while (now > seen && !peak.compare_exchange_weak(seen, now)) {
        }
      }
    });
  }
  go.store(true);
  for (auto& t : threads) t.join();
  EXPECT_LE(peak.load(), kCap);
  EXPECT_GT(admitted.load(), 0);
  EXPECT_EQ(cap.held(), 0);
}

}  // namespace
}  // namespace pd::server
