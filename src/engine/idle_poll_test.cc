#include "engine/idle_poll.h"

#include <gtest/gtest.h>

#include <thread>

namespace pd::engine {
namespace {

// A clock that moves step_ns every time it is read.
struct FakeClock {
  int64_t now = 1'000'000;
  int64_t step_ns = 1000;
  int64_t reads = 0;
  std::function<int64_t()> Fn() {
    return [this] {
      ++reads;
      now += step_ns;
      return now;
    };
  }
};

TEST(IdlePollTest, ASetFlagReturnsAtOnceWithoutReadingTheClock) {
  std::atomic<bool> flag{true};
  FakeClock clock;
  IdlePollOptions o;
  o.budget_ns = 1'000'000;
  const IdlePollResult r = PollForFlag(flag, o, clock.Fn());
  EXPECT_TRUE(r.flag_seen);
  EXPECT_EQ(clock.reads, 0);
}

TEST(IdlePollTest, NoBudgetMeansNoSpin) {
  std::atomic<bool> flag{false};
  FakeClock clock;
  IdlePollOptions o;
  o.budget_ns = 0;
  const IdlePollResult r = PollForFlag(flag, o, clock.Fn());
  EXPECT_FALSE(r.flag_seen);
  EXPECT_EQ(clock.reads, 0);
}

// With nothing arriving it spins until the clock has moved the budget, then gives up; it yields
// the core once per yield_every_ns of spinning.
TEST(IdlePollTest, GivesUpWhenTheBudgetIsSpentAndYieldsOnTheWay) {
  std::atomic<bool> flag{false};
  FakeClock clock;  // 1 us per read
  IdlePollOptions o;
  o.budget_ns = 200'000;
  o.checks_per_clock_read = 4;
  o.yield_every_ns = 50'000;
  const IdlePollResult r = PollForFlag(flag, o, clock.Fn());
  EXPECT_FALSE(r.flag_seen);
  EXPECT_EQ(clock.reads, 201);  // the start, then one per microsecond up to the budget
  EXPECT_EQ(r.clock_reads, clock.reads);
  EXPECT_EQ(r.yields, 3);  // at 50, 100 and 150 us; at 200 us the budget is spent first
}

TEST(IdlePollTest, NeverYieldsWhenToldNotTo) {
  std::atomic<bool> flag{false};
  FakeClock clock;
  IdlePollOptions o;
  o.budget_ns = 100'000;
  o.yield_every_ns = 0;
  EXPECT_EQ(PollForFlag(flag, o, clock.Fn()).yields, 0);
}

// The clock stops moving: only the flag, set by another thread, can end the spin.
TEST(IdlePollTest, SeesAFlagSetByAnotherThread) {
  std::atomic<bool> flag{false};
  IdlePollOptions o;
  o.budget_ns = 1;
  std::atomic<int64_t> reads{0};
  std::thread setter([&] {
    while (reads.load() < 3) std::this_thread::yield();
    flag.store(true, std::memory_order_release);
  });
  const IdlePollResult r = PollForFlag(flag, o, [&] {
    reads.fetch_add(1);
    return int64_t{0};
  });
  setter.join();
  EXPECT_TRUE(r.flag_seen);
  EXPECT_GE(reads.load(), 3);
}

TEST(IdlePollTest, ComputeCpusAreDedicatedOnlyWhenBothListsAreGivenAndDisjoint) {
  EXPECT_TRUE(ComputeCpusAreDedicated({0}, {1}));
  EXPECT_TRUE(ComputeCpusAreDedicated({0, 2}, {1, 3}));
  EXPECT_FALSE(ComputeCpusAreDedicated({1}, {1}));
  EXPECT_FALSE(ComputeCpusAreDedicated({0, 1}, {1, 2}));
  EXPECT_FALSE(ComputeCpusAreDedicated({}, {1}));  // unpinned
  EXPECT_FALSE(ComputeCpusAreDedicated({0}, {}));  // I/O threads anywhere, CPU 0 too
}

TEST(IdlePollTest, SteadyNowNsMovesForward) {
  const int64_t a = SteadyNowNs();
  const int64_t b = SteadyNowNs();
  EXPECT_GT(a, 0);
  EXPECT_GE(b, a);
}

}  // namespace
}  // namespace pd::engine
