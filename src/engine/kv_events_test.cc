// The prefix cache's key events: what the pool reports, snapshots, sequence numbers, gaps
// (another epoch, dropped events, nobody listening) and the bound on what is kept.
#include "engine/kv_events.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/prefix_cache.h"

namespace pd::engine {
namespace {

using std::chrono::milliseconds;
constexpr int kPage = 4;

std::vector<uint64_t> Sorted(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(KvEventLogTest, SnapshotThenEventsInOrder) {
  KvEventLog log;
  log.SetFormat(77, 16);
  log.OnStored(1);  // nobody listens yet: mirrored, not kept
  EXPECT_EQ(log.num_kept_events(), 0u);
  KvEventBatch s = log.Poll(0, 0, milliseconds(0), 100);
  EXPECT_TRUE(s.snapshot);
  EXPECT_EQ(s.epoch, log.epoch());
  EXPECT_EQ(s.root, 77u);
  EXPECT_EQ(s.page_size, 16);
  EXPECT_EQ(s.keys, std::vector<uint64_t>{1});
  log.OnStored(2);
  log.OnStored(2);  // already held: no event
  log.OnRemoved(1);
  log.OnRemoved(9);  // never held: no event
  KvEventBatch e = log.Poll(s.epoch, s.seq, milliseconds(0), 100);
  ASSERT_FALSE(e.snapshot);
  ASSERT_EQ(e.events.size(), 2u);
  EXPECT_EQ(e.events[0].seq, s.seq + 1);
  EXPECT_TRUE(e.events[0].stored);
  EXPECT_EQ(e.events[0].key, 2u);
  EXPECT_FALSE(e.events[1].stored);
  EXPECT_EQ(e.events[1].key, 1u);
  EXPECT_EQ(e.seq, s.seq + 2);
  // max_events splits a batch; the rest comes next.
  log.OnStored(3);
  log.OnStored(4);
  KvEventBatch part = log.Poll(e.epoch, e.seq, milliseconds(0), 1);
  ASSERT_EQ(part.events.size(), 1u);
  EXPECT_EQ(part.events[0].key, 3u);
  KvEventBatch rest = log.Poll(part.epoch, part.seq, milliseconds(0), 10);
  ASSERT_EQ(rest.events.size(), 1u);
  EXPECT_EQ(rest.events[0].key, 4u);
  KvEventBatch none = log.Poll(rest.epoch, rest.seq, milliseconds(0), 10);
  EXPECT_FALSE(none.snapshot);
  EXPECT_TRUE(none.events.empty());
  EXPECT_EQ(none.seq, rest.seq);
}

TEST(KvEventLogTest, GapsAnswerWithASnapshot) {
  KvEventLogOptions o;
  o.max_events = 3;
  KvEventLog log(o);
  KvEventBatch s = log.Poll(0, 0, milliseconds(0), 100);
  for (uint64_t k = 10; k < 15; ++k) log.OnStored(k);  // 5 events, 3 kept: the reader fell behind
  EXPECT_EQ(log.num_kept_events(), 3u);
  KvEventBatch behind = log.Poll(s.epoch, s.seq, milliseconds(0), 100);
  EXPECT_TRUE(behind.snapshot);
  EXPECT_EQ(Sorted(behind.keys), (std::vector<uint64_t>{10, 11, 12, 13, 14}));
  // Another epoch (the instance restarted) and a number the log never gave.
  EXPECT_TRUE(log.Poll(behind.epoch + 1, behind.seq, milliseconds(0), 100).snapshot);
  EXPECT_TRUE(log.Poll(behind.epoch, behind.seq + 5, milliseconds(0), 100).snapshot);
  EXPECT_FALSE(log.Poll(behind.epoch, behind.seq, milliseconds(0), 100).snapshot);
}

TEST(KvEventLogTest, NothingIsKeptWhileNobodyListens) {
  KvEventLogOptions o;
  o.listener_idle_ms = 0;  // every listener counts as gone at once
  KvEventLog log(o);
  KvEventBatch s = log.Poll(0, 0, milliseconds(0), 100);
  log.OnStored(5);
  log.OnStored(6);
  EXPECT_EQ(log.num_kept_events(), 0u);
  EXPECT_EQ(log.num_keys(), 2u);
  KvEventBatch again = log.Poll(s.epoch, s.seq, milliseconds(0), 100);
  EXPECT_TRUE(again.snapshot);
  EXPECT_EQ(Sorted(again.keys), (std::vector<uint64_t>{5, 6}));
}

TEST(KvEventLogTest, PollWaitsForTheNextEventAndCloseWakesIt) {
  KvEventLog log;
  KvEventBatch s = log.Poll(0, 0, milliseconds(0), 100);
  std::thread writer([&] { log.OnStored(42); });
  KvEventBatch e = log.Poll(s.epoch, s.seq, milliseconds(60000), 100);
  writer.join();
  ASSERT_EQ(e.events.size(), 1u);
  EXPECT_EQ(e.events[0].key, 42u);
  std::thread closer([&] { log.Close(); });
  KvEventBatch closed = log.Poll(e.epoch, e.seq, milliseconds(60000), 100);
  closer.join();
  EXPECT_TRUE(closed.events.empty());
}

// The pool reports the keys it indexes once, and every key an eviction takes out (descendants
// included), so the log's mirror always equals the index.
TEST(KvEventLogTest, ThePoolReportsStoresAndEvictions) {
  KvEventLog log;
  PagePool pool(3, kPage);
  pool.SetEventLog(&log);
  KvEventBatch s = log.Poll(0, 0, milliseconds(0), 100);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<uint64_t> keys;
  ExtendPageKeys(9, tokens, kPage, &keys);
  auto pages = pool.Allocate(2);
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(pool.Register((*pages)[0], -1, keys[0], std::span(tokens).first(kPage)));
  ASSERT_TRUE(pool.Register((*pages)[0], -1, keys[0], std::span(tokens).first(kPage)));
  ASSERT_TRUE(pool.Register((*pages)[1], (*pages)[0], keys[1], std::span(tokens).subspan(kPage)));
  pool.Release(*pages);
  KvEventBatch stored = log.Poll(s.epoch, s.seq, milliseconds(0), 100);
  ASSERT_EQ(stored.events.size(), 2u);
  EXPECT_EQ(stored.events[0].key, keys[0]);
  EXPECT_EQ(stored.events[1].key, keys[1]);
  // Three pages wanted: the whole chain is evicted.
  ASSERT_TRUE(pool.Allocate(3).ok());
  KvEventBatch evicted = log.Poll(stored.epoch, stored.seq, milliseconds(0), 100);
  ASSERT_EQ(evicted.events.size(), 2u);
  EXPECT_FALSE(evicted.events[0].stored);
  EXPECT_FALSE(evicted.events[1].stored);
  EXPECT_EQ(Sorted({evicted.events[0].key, evicted.events[1].key}), Sorted(keys));
  EXPECT_EQ(log.num_keys(), 0u);
}

}  // namespace
}  // namespace pd::engine
