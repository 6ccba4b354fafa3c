#include "common/trace.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/file_util.h"

namespace pd {
namespace {

using nlohmann::json;

json Parse(const Tracer& t) { return json::parse(t.ToJson()); }

std::vector<json> OfPhase(const json& j, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : j.at("traceEvents"))
    if (e.at("ph") == ph) out.push_back(e);
  return out;
}

TEST(TracerTest, EmptyTraceIsValidJson) {
  Tracer t;
  json j = Parse(t);
  EXPECT_TRUE(j.at("traceEvents").is_array());
  EXPECT_TRUE(j.at("traceEvents").empty());
  EXPECT_EQ(j.at("otherData").at("dropped_events"), 0);
}

TEST(TracerTest, CompleteEventFields) {
  Tracer t;
  t.Complete("layer", "compute", 1'234'567, 1'334'568,
             {{"layer", int64_t{3}}, {"ratio", 0.5}, {"who", std::string("a\"b\\c\n")}});
  json j = Parse(t);
  ASSERT_EQ(j.at("traceEvents").size(), 1u);
  const json& e = j.at("traceEvents")[0];
  EXPECT_EQ(e.at("name"), "layer");
  EXPECT_EQ(e.at("cat"), "compute");
  EXPECT_EQ(e.at("ph"), "X");
  EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 1234.567);
  EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 100.001);
  EXPECT_EQ(e.at("pid"), static_cast<int64_t>(getpid()));
  EXPECT_EQ(e.at("tid"), Tracer::CurrentThreadId());
  EXPECT_EQ(e.at("args").at("layer"), 3);
  EXPECT_DOUBLE_EQ(e.at("args").at("ratio").get<double>(), 0.5);
  EXPECT_EQ(e.at("args").at("who"), "a\"b\\c\n");
}

TEST(TracerTest, NegativeDurationClampsToZero) {
  Tracer t;
  t.Complete("x", "c", 2000, 1000);
  EXPECT_EQ(Parse(t).at("traceEvents")[0].at("dur").get<double>(), 0.0);
}

TEST(TracerTest, InstantAndMetadata) {
  TracerOptions o;
  o.process_name = "prefill0";
  Tracer t(o);
  t.SetThreadName("engine");
  const int64_t before = Tracer::NowNs();
  t.Instant("kv ready", "kv", {{"request", int64_t{7}}});
  json j = Parse(t);
  auto inst = OfPhase(j, "i");
  ASSERT_EQ(inst.size(), 1u);
  EXPECT_EQ(inst[0].at("name"), "kv ready");
  EXPECT_EQ(inst[0].at("s"), "t");
  EXPECT_FALSE(inst[0].contains("dur"));
  EXPECT_GE(inst[0].at("ts").get<double>() + 0.001, before / 1000.0);
  auto meta = OfPhase(j, "M");
  ASSERT_EQ(meta.size(), 2u);
  std::map<std::string, std::string> names;
  for (const json& m : meta) names[m.at("name")] = m.at("args").at("name");
  EXPECT_EQ(names["process_name"], "prefill0");
  EXPECT_EQ(names["thread_name"], "engine");
  EXPECT_EQ(t.num_events(), 1u);  // metadata is not counted
}

TEST(TracerTest, NonFiniteDoubleStaysValidJson) {
  Tracer t;
  t.Instant("x", "c", {{"v", 1.0 / 0.0}});
  json j = Parse(t);
  EXPECT_TRUE(j.at("traceEvents")[0].at("args").at("v").is_string());
}

TEST(TracerTest, CapDropsAndCounts) {
  TracerOptions o;
  o.max_events = 5;
  Tracer t(o);
  for (int i = 0; i < 12; ++i) t.Complete("e", "c", i * 1000, i * 1000 + 10, {{"i", int64_t{i}}});
  EXPECT_EQ(t.num_events(), 5u);
  EXPECT_EQ(t.dropped(), 7u);
  json j = Parse(t);
  EXPECT_EQ(j.at("otherData").at("dropped_events"), 7);
  EXPECT_EQ(j.at("otherData").at("max_events"), 5);
  auto x = OfPhase(j, "X");
  ASSERT_EQ(x.size(), 5u);
  EXPECT_EQ(x.back().at("args").at("i"), 4);  // the first ones are kept
  auto inst = OfPhase(j, "i");
  ASSERT_EQ(inst.size(), 1u);
  EXPECT_EQ(inst[0].at("name"), "trace_events_dropped");
  EXPECT_EQ(inst[0].at("args").at("dropped"), 7);
}

TEST(TraceDroppedEventsTest, ReadsTheCountOffTheTail) {
  TracerOptions o;
  o.max_events = 3;
  Tracer t(o);
  EXPECT_EQ(TraceDroppedEvents(t.ToJson()), 0u);
  for (int i = 0; i < 10; ++i) t.Instant("e", "c");
  EXPECT_EQ(TraceDroppedEvents(t.ToJson()), 7u);
  // A file far longer than the tail it reads, whose events are named like the count.
  TracerOptions many;
  many.max_events = 2000;
  Tracer b(many);
  for (int i = 0; i < 2500; ++i) b.Instant("dropped_events", "c");
  const std::string big = b.ToJson();
  ASSERT_GT(big.size(), 100'000u);
  EXPECT_EQ(TraceDroppedEvents(big), 500u);
}

TEST(TraceDroppedEventsTest, NotATracersFileGivesNothing) {
  EXPECT_EQ(TraceDroppedEvents(""), std::nullopt);
  EXPECT_EQ(TraceDroppedEvents("{\"traceEvents\":[]}"), std::nullopt);
  // Cut short inside the count, or a count that is not a number.
  EXPECT_EQ(TraceDroppedEvents("{\"otherData\":{\"dropped_events\":12"), std::nullopt);
  EXPECT_EQ(TraceDroppedEvents("{\"otherData\":{\"dropped_events\":x}}"), std::nullopt);
  EXPECT_EQ(TraceDroppedEvents("{\"otherData\":{\"dropped_events\":4}}"), 4u);
}

TEST(TracerTest, ConcurrentWriters) {
  TracerOptions o;
  o.max_events = 3000;
  Tracer t(o);
  constexpr int kThreads = 4, kEach = 1000;
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&t, k] {
      t.SetThreadName("writer " + std::to_string(k));
      for (int i = 0; i < kEach; ++i) {
        TraceSpan span(&t, "span", "test");
        span.Arg("k", int64_t{k});
        span.Arg("i", int64_t{i});
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.num_events(), 3000u);
  EXPECT_EQ(t.dropped(), static_cast<uint64_t>(kThreads * kEach - 3000));
  json j = Parse(t);
  std::set<int64_t> tids;
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const json& e : OfPhase(j, "X")) {
    tids.insert(e.at("tid").get<int64_t>());
    seen.insert({e.at("args").at("k").get<int64_t>(), e.at("args").at("i").get<int64_t>()});
  }
  EXPECT_EQ(seen.size(), 3000u);                                     // no event torn or duplicated
  EXPECT_EQ(OfPhase(j, "M").size(), static_cast<size_t>(kThreads));  // names are not capped
  EXPECT_LE(tids.size(), static_cast<size_t>(kThreads));  // a late thread may have lost all
}

TEST(TracerTest, NullSpanRecordsNothing) {
  TraceSpan span(nullptr, "x", "c");
  EXPECT_FALSE(span.enabled());
  span.Arg("k", int64_t{1});  // no effect, no crash
}

TEST(TracerTest, WriteToFileRoundTrips) {
  Tracer t;
  t.Instant("hello", "c");
  const std::string path =
      ::testing::TempDir() + "trace_test_" + std::to_string(getpid()) + ".json";
  ASSERT_TRUE(t.WriteToFile(path).ok());
  Result<std::string> text = ReadFileToString(path);
  ASSERT_TRUE(text.ok());
  json j = json::parse(*text);
  EXPECT_EQ(j.at("traceEvents")[0].at("name"), "hello");
  std::ifstream tmp(path + ".tmp");
  EXPECT_FALSE(tmp.good());  // the temporary is renamed away
  std::remove(path.c_str());
}

TEST(TracerTest, WriteToMissingDirectoryIsAClearError) {
  Tracer t;
  Status s = t.WriteToFile("/nonexistent-dir-for-trace-test/t.json");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("/nonexistent-dir-for-trace-test/t.json"), std::string::npos);
  EXPECT_NE(s.message().find("No such file"), std::string::npos);
}

TEST(TracerTest, RenameOntoDirectoryIsAClearErrorAndLeavesNoTemporary) {
  const std::string dir = ::testing::TempDir() + "trace_test_dir_" + std::to_string(getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_TRUE(WriteStringToFile(dir + "/keep", "x").ok());  // non-empty: rename must fail
  Tracer t;
  t.Instant("hello", "c");
  Status s = t.WriteToFile(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("rename"), std::string::npos) << s.message();
  std::ifstream tmp(dir + ".tmp");
  EXPECT_FALSE(tmp.good());
  std::remove((dir + "/keep").c_str());
  ::rmdir(dir.c_str());
}

TEST(TracePathForTest, InsertsTagBeforeExtension) {
  EXPECT_EQ(TracePathFor("t.json", "prefill0"), "t.prefill0.json");
  EXPECT_EQ(TracePathFor("/tmp/a.b/t.json", "decode1"), "/tmp/a.b/t.decode1.json");
  EXPECT_EQ(TracePathFor("/tmp/a.b/trace", "decode1"), "/tmp/a.b/trace.decode1");
  EXPECT_EQ(TracePathFor("trace", "x"), "trace.x");
  EXPECT_EQ(TracePathFor(".hidden", "x"), ".hidden.x");
  EXPECT_EQ(TracePathFor("/tmp/.hidden", "x"), "/tmp/.hidden.x");
}

}  // namespace
}  // namespace pd
