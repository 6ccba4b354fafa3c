#include "transfer/imm_counter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>

#include "common/clock.h"
#include "transfer/memory_descriptor.h"

namespace pd::transfer {
namespace {

TEST(ImmCounterTest, FiresExactlyOnceAtTheCountUnderAnyArrivalOrder) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    ImmCounterTable table;
    std::vector<uint32_t> arrivals;  // imm 1: 7 writes, imm 2: 3 writes, imm 3: 5 (late counter)
    for (int i = 0; i < 7; ++i) arrivals.push_back(1);
    for (int i = 0; i < 3; ++i) arrivals.push_back(2);
    for (int i = 0; i < 5; ++i) arrivals.push_back(3);
    std::shuffle(arrivals.begin(), arrivals.end(), std::mt19937(seed));
    int fired1 = 0, fired2 = 0, fired3 = 0;
    auto w1 = table.Expect(1, 7, [&] { ++fired1; });
    auto w2 = table.Expect(2, 3, [&] { ++fired2; });
    ASSERT_TRUE(w1.ok() && w2.ok());
    size_t half = arrivals.size() / 2;
    for (size_t i = 0; i < half; ++i) table.OnArrival(arrivals[i]);
    auto w3 = table.Expect(3, 5, [&] { ++fired3; });  // some of its writes already landed
    ASSERT_TRUE(w3.ok());
    for (size_t i = half; i < arrivals.size(); ++i) {
      EXPECT_EQ(fired1, (*w1)->reached() ? 1 : 0);
      table.OnArrival(arrivals[i]);
    }
    EXPECT_EQ(fired1, 1);
    EXPECT_EQ(fired2, 1);
    EXPECT_EQ(fired3, 1);
    EXPECT_TRUE((*w1)->reached() && (*w2)->reached() && (*w3)->reached());
    EXPECT_EQ((*w1)->received(), 7u);
    EXPECT_EQ(table.num_active(), 0u);
  }
}

TEST(ImmCounterTest, NotReachedOneShortOfTheCount) {
  ImmCounterTable table;
  int fired = 0;
  auto w = table.Expect(9, 4, [&] { ++fired; });
  ASSERT_TRUE(w.ok());
  for (int i = 0; i < 3; ++i) table.OnArrival(9);
  table.OnArrival(8);  // another transfer's write does not count
  EXPECT_FALSE((*w)->reached());
  EXPECT_EQ((*w)->received(), 3u);
  EXPECT_EQ(fired, 0);
  EXPECT_FALSE((*w)->WaitFor(0.01));
  table.OnArrival(9);
  EXPECT_TRUE((*w)->WaitFor(0.0));
  EXPECT_EQ(fired, 1);
}

TEST(ImmCounterTest, AlreadyLandedWritesFireAtRegistration) {
  ImmCounterTable table;
  for (int i = 0; i < 5; ++i) table.OnArrival(4);
  EXPECT_EQ(table.unclaimed(4), 5u);
  int fired = 0;
  auto w = table.Expect(4, 3, [&] { ++fired; });
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(fired, 1);
  EXPECT_TRUE((*w)->reached());
  EXPECT_EQ(table.unclaimed(4), 2u);  // the surplus stays for a later counter
}

TEST(ImmCounterTest, RemoveCancelsAndRejectsDuplicatesAndZero) {
  ImmCounterTable table;
  int fired = 0;
  auto w = table.Expect(6, 2, [&] { ++fired; });
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(table.Expect(6, 1).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(table.Expect(7, 0).status().code(), StatusCode::kInvalidArgument);
  table.OnArrival(6);
  EXPECT_TRUE(table.Remove(6));
  EXPECT_FALSE(table.Remove(6));
  table.OnArrival(6);  // lands after removal: kept as unclaimed, never fires the removed callback
  EXPECT_EQ(fired, 0);
  EXPECT_FALSE((*w)->reached());
  EXPECT_EQ(table.unclaimed(6), 1u);
  EXPECT_TRUE(table.Remove(6));
  EXPECT_EQ(table.unclaimed(6), 0u);
}

TEST(ImmCounterTest, ConcurrentArrivalsFromSeveralWorkersCountExactly) {
  ImmCounterTable table;
  std::atomic<int> fired{0};
  auto w = table.Expect(1, 4000, [&] { ++fired; });
  ASSERT_TRUE(w.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) table.OnArrival(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(fired.load(), 1);
  EXPECT_EQ((*w)->received(), 4000u);
}

TEST(ImmCounterTest, UnclaimedArrivalsExpireAfterTheTtl) {
  SimClock clock;
  ImmCounterTable table({.unclaimed_ttl_s = 5.0, .max_unclaimed_imms = 100, .clock = &clock});
  for (int i = 0; i < 3; ++i) table.OnArrival(40);
  clock.Advance(4.0);
  table.OnArrival(41);
  EXPECT_EQ(table.num_unclaimed_imms(), 2u);
  clock.Advance(1.5);  // 40's first arrival is 5.5 s old, 41's 1.5 s
  table.OnArrival(42);
  EXPECT_EQ(table.unclaimed(40), 0u);
  EXPECT_EQ(table.unclaimed(41), 1u);
  EXPECT_EQ(table.expired_arrivals(), 3u);
  // A late counter for the expired imm misses the expired writes and counts only new ones.
  int fired = 0;
  auto w = table.Expect(40, 2, [&] { ++fired; });
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->received(), 0u);
  table.OnArrival(40);
  EXPECT_EQ(fired, 0);
  table.OnArrival(40);
  EXPECT_EQ(fired, 1);
  // Expect itself expires what is too old: 41 and 42 are past the TTL here.
  clock.Advance(10.0);
  auto w41 = table.Expect(41, 1);
  ASSERT_TRUE(w41.ok());
  EXPECT_FALSE((*w41)->reached());
  EXPECT_EQ(table.num_unclaimed_imms(), 0u);
  EXPECT_EQ(table.expired_arrivals(), 5u);
}

TEST(ImmCounterTest, UnclaimedImmsAreCappedOldestFirst) {
  SimClock clock;
  ImmCounterTable table({.unclaimed_ttl_s = 1e9, .max_unclaimed_imms = 4, .clock = &clock});
  for (uint32_t imm = 100; imm < 110; ++imm) {
    table.OnArrival(imm);
    table.OnArrival(imm);
    clock.Advance(0.001);
  }
  EXPECT_EQ(table.num_unclaimed_imms(), 4u);
  EXPECT_EQ(table.expired_arrivals(), 12u);
  for (uint32_t imm = 100; imm < 106; ++imm) EXPECT_EQ(table.unclaimed(imm), 0u) << imm;
  for (uint32_t imm = 106; imm < 110; ++imm) EXPECT_EQ(table.unclaimed(imm), 2u) << imm;
  // A kept imm claimed by a counter leaves room: the next new imm drops nothing.
  auto w = table.Expect(106, 2);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE((*w)->reached());
  table.OnArrival(200);
  EXPECT_EQ(table.expired_arrivals(), 12u);
  EXPECT_EQ(table.unclaimed(107), 2u);
  EXPECT_TRUE(table.Remove(107));
  EXPECT_EQ(table.num_unclaimed_imms(), 3u);
}

TEST(ImmCounterTest, StaleWritesOfAnAbandonedAttemptNeverCountForLaterOnes) {
  // The decode messenger's pattern: a counter per attempt, removed when the attempt is given up,
  // while its writes may still land. However many attempts, the table keeps a bounded number.
  SimClock clock;
  ImmCounterTable table({.unclaimed_ttl_s = 30.0, .max_unclaimed_imms = 64, .clock = &clock});
  for (uint32_t attempt = 0; attempt < 10000; ++attempt) {
    ASSERT_TRUE(table.Expect(attempt, 8).ok());
    table.OnArrival(attempt);
    EXPECT_TRUE(table.Remove(attempt));
    for (int i = 0; i < 7; ++i) table.OnArrival(attempt);  // late writes
    clock.Advance(0.001);
  }
  EXPECT_LE(table.num_unclaimed_imms(), 64u);
  EXPECT_EQ(table.num_active(), 0u);
  EXPECT_EQ(table.expired_arrivals(), (10000u - 64u) * 7u);
}

TEST(MemoryDescriptorTest, RoundTripsAndRejectsCorruption) {
  MemoryDescriptor d;
  d.addr = 0x7f0012340000;
  d.length = 1 << 30;
  d.rkey = 0xdeadbeefcafe;
  d.has_key = true;
  d.fabric_addr = std::string("\x02\x00\x12\x34\x7f\x00\x00\x01", 8) + std::string(8, '\0');
  auto back = MemoryDescriptor::FromBytes(d.ToBytes());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->addr, d.addr);
  EXPECT_EQ(back->length, d.length);
  EXPECT_EQ(back->rkey, d.rkey);
  EXPECT_EQ(back->fabric_addr, d.fabric_addr);
  std::string bytes = d.ToBytes();
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x40;
    EXPECT_FALSE(MemoryDescriptor::FromBytes(bad).ok()) << "flipped byte " << i;
  }
  EXPECT_FALSE(MemoryDescriptor::FromBytes("").ok());
  EXPECT_TRUE(d.CheckRange(0, 1 << 30).ok());
  EXPECT_EQ(d.CheckRange(1, 1 << 30).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(d.CheckRange(UINT64_MAX, 2).code(), StatusCode::kOutOfRange);
  GroupDescriptor g{{d, d}};
  g.domains[1].rkey = 5;
  auto gb = GroupDescriptor::FromBytes(g.ToBytes());
  ASSERT_TRUE(gb.ok());
  ASSERT_EQ(gb->domains.size(), 2u);
  EXPECT_EQ(gb->domains[1].rkey, 5u);
  std::string gbytes = g.ToBytes();
  gbytes[gbytes.size() / 2] ^= 1;
  EXPECT_FALSE(GroupDescriptor::FromBytes(gbytes).ok());
}

}  // namespace
}  // namespace pd::transfer
