// The router's KV index: snapshots, events in sequence, gaps and epochs that unsync a backend,
// removal, cached-prefix lengths, the wire format, and the KV-aware cost choice.
#include "server/kv_index.h"

#include <gtest/gtest.h>

#include <vector>

#include "server/kv_events_wire.h"

namespace pd::server {
namespace {

engine::KvEventBatch Snapshot(uint64_t epoch, uint64_t seq, std::vector<uint64_t> keys) {
  engine::KvEventBatch b;
  b.epoch = epoch;
  b.root = 5;
  b.page_size = 16;
  b.snapshot = true;
  b.seq = seq;
  b.keys = std::move(keys);
  return b;
}

engine::KvEventBatch Events(uint64_t epoch, std::vector<engine::KvEvent> events) {
  engine::KvEventBatch b;
  b.epoch = epoch;
  b.events = std::move(events);
  b.seq = b.events.empty() ? 0 : b.events.back().seq;
  return b;
}

TEST(KvIndexTest, SnapshotThenEventsGivePrefixLengths) {
  KvIndex index;
  const std::string a = "http://a", b = "http://b";
  EXPECT_EQ(index.CachedPages(a, std::vector<uint64_t>{1}), -1);  // unknown: not synced
  index.ApplySnapshot(a, Snapshot(7, 10, {1, 2, 3}));
  index.ApplySnapshot(b, Snapshot(8, 0, {1}));
  const std::vector<uint64_t> prompt = {1, 2, 3, 4};
  EXPECT_EQ(index.CachedPages(a, prompt), 3);
  EXPECT_EQ(index.CachedPages(b, prompt), 1);
  ASSERT_TRUE(index.ApplyEvents(a, Events(7, {{11, true, 4}, {12, false, 2}})).ok());
  EXPECT_EQ(index.CachedPages(a, prompt), 1);  // the prefix breaks at page 1
  EXPECT_EQ(index.State(a).seq, 12u);
  EXPECT_EQ(index.State(a).num_keys, 3u);
  EXPECT_EQ(index.State(a).root, 5u);
  EXPECT_EQ(index.State(a).page_size, 16);
  ASSERT_TRUE(index.ApplyEvents(a, Events(7, {})).ok());  // an empty poll
  EXPECT_EQ(index.State(a).seq, 12u);
}

TEST(KvIndexTest, AGapOrAnotherEpochUnsyncsUntilTheNextSnapshot) {
  KvIndex index;
  const std::string a = "http://a";
  index.ApplySnapshot(a, Snapshot(7, 10, {1, 2}));
  Status gap = index.ApplyEvents(a, Events(7, {{12, true, 3}}));
  EXPECT_EQ(gap.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(gap.message().find("gap"), std::string::npos) << gap.message();
  EXPECT_FALSE(index.State(a).synced);
  EXPECT_EQ(index.CachedPages(a, std::vector<uint64_t>{1}), -1);
  // Events before a snapshot are refused too.
  EXPECT_FALSE(index.ApplyEvents(a, Events(7, {{11, true, 3}})).ok());
  index.ApplySnapshot(a, Snapshot(7, 12, {1, 2, 3}));
  EXPECT_EQ(index.State(a).snapshots, 2u);
  EXPECT_EQ(index.CachedPages(a, std::vector<uint64_t>{1, 2, 3}), 3);
  Status restarted = index.ApplyEvents(a, Events(9, {{13, true, 4}}));
  EXPECT_NE(restarted.message().find("restarted"), std::string::npos) << restarted.message();
  EXPECT_FALSE(index.State(a).synced);
  index.ApplySnapshot(a, Snapshot(9, 13, {4}));
  index.MarkUnsynced(a, "stream dropped");
  EXPECT_EQ(index.State(a).why_unsynced, "stream dropped");
  EXPECT_EQ(index.State(a).num_keys, 0u);
}

TEST(KvIndexTest, ARemovedBackendLeavesTheIndex) {
  KvIndex index;
  index.ApplySnapshot("http://a", Snapshot(1, 0, {1}));
  index.ApplySnapshot("http://b", Snapshot(2, 0, {1}));
  index.Remove("http://a");
  EXPECT_EQ(index.Backends(), std::vector<std::string>{"http://b"});
  EXPECT_EQ(index.CachedPages("http://a", std::vector<uint64_t>{1}), -1);
}

TEST(KvEventsWireTest, RoundTripsSnapshotsAndEvents) {
  KvEventsReply r;
  r.tokenizer = 0xfedcba9876543210ull;
  r.batch = Snapshot(0xffffffffffffffffull, 3, {0x8000000000000001ull, 2});
  auto back = ParseKvEventsJson(KvEventsJson(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tokenizer, r.tokenizer);
  EXPECT_EQ(back->batch.epoch, r.batch.epoch);
  EXPECT_TRUE(back->batch.snapshot);
  EXPECT_EQ(back->batch.keys, r.batch.keys);
  EXPECT_EQ(back->batch.page_size, 16);
  r.batch = Events(4, {{5, true, 0x8000000000000001ull}, {6, false, 9}});
  back = ParseKvEventsJson(KvEventsJson(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->batch.events.size(), 2u);
  EXPECT_EQ(back->batch.events[0].key, 0x8000000000000001ull);
  EXPECT_FALSE(back->batch.events[1].stored);
  EXPECT_EQ(back->batch.seq, 6u);
  EXPECT_FALSE(ParseKvEventsJson("{\"epoch\":1}").ok());
  EXPECT_FALSE(ParseKvEventsJson("not json").ok());
}

TEST(KvAwareChoiceTest, CacheWeighedAgainstLoad) {
  // A holds 30 of 32 pages with 2 requests in flight, B none and idle.
  std::vector<KvCandidate> c = {{32, 30, 2}, {32, 0, 0}};
  EXPECT_EQ(ChooseKvAware(c, 1.0, 4.0, 1), 0);   // 2 + 8 < 32
  EXPECT_EQ(ChooseKvAware(c, 1.0, 20.0, 0), 1);  // 2 + 40 > 32
  EXPECT_EQ(ChooseKvAware(c, 0.0, 1.0, 0), 1);   // load only: least loaded
  // Equal costs: the first from `start` on.
  std::vector<KvCandidate> tie = {{8, 0, 0}, {8, 0, 0}, {8, 0, 0}};
  EXPECT_EQ(ChooseKvAware(tie, 1.0, 1.0, 2), 2);
  EXPECT_EQ(ChooseKvAware(tie, 1.0, 1.0, 1), 1);
  EXPECT_EQ(ChooseKvAware({}, 1.0, 1.0, 0), -1);
}

TEST(KvAwareChoiceTest, AnUnsyncedBackendCompetesOnLoadAlone) {
  // B is unknown: it counts as caching what the best known one does (A's 24 of 32 pages).
  std::vector<KvCandidate> c = {{32, 24, 3}, {32, -1, 1}, {32, 0, 0}};
  EXPECT_EQ(ChooseKvAware(c, 1.0, 4.0, 0), 1);  // A 8+12, B 8+4, C 32
  c[1].load = 5;
  EXPECT_EQ(ChooseKvAware(c, 1.0, 4.0, 0), 0);  // B 8+20 > A 20
  // Nobody known: least loaded.
  std::vector<KvCandidate> unknown = {{32, -1, 2}, {32, -1, 1}};
  EXPECT_EQ(ChooseKvAware(unknown, 1.0, 4.0, 0), 1);
}

}  // namespace
}  // namespace pd::server
