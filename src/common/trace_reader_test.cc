#include "common/trace_reader.h"

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/file_util.h"

namespace pd {
namespace {

using ::testing::HasSubstr;

TEST(TraceReaderTest, ReadsBackWhatTheTracerWrites) {
  TracerOptions o;
  o.process_name = "prefill";
  Tracer t(o);
  t.SetThreadName("engine");
  t.Complete("layer", "compute", 1'000'001, 1'250'003,
             {{"layer", int64_t{3}}, {"share", 0.25}, {"request", std::string("r-7")}});
  t.Instant("kv ready", "kv", {{"request", int64_t{42}}});
  Result<std::vector<TraceEvent>> events = ParseTraceEvents(t.ToJson());
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  ASSERT_EQ(events->size(), 4u);  // process and thread names, then the two events
  EXPECT_EQ((*events)[0].ph, 'M');
  EXPECT_EQ((*events)[0].name, "process_name");
  EXPECT_EQ((*events)[1].name, "thread_name");

  const TraceEvent& layer = (*events)[2];
  const std::vector<TraceEvent> recorded = t.Events();
  EXPECT_EQ(layer.name, "layer");
  EXPECT_EQ(layer.cat, "compute");
  EXPECT_EQ(layer.ph, 'X');
  EXPECT_EQ(layer.ts_ns, 1'000'001);  // through microseconds with three decimals, exactly
  EXPECT_EQ(layer.dur_ns, 250'002);
  EXPECT_EQ(layer.tid, recorded[0].tid);
  EXPECT_EQ(layer.pid, static_cast<int64_t>(::getpid()));
  EXPECT_EQ(TraceArgInt(layer, "layer"), 3);
  EXPECT_EQ(TraceArgNumber(layer, "share"), 0.25);
  EXPECT_EQ(TraceArgNumber(layer, "layer"), 3.0);
  EXPECT_EQ(TraceArgInt(layer, "share"), std::nullopt);  // not an integer
  EXPECT_EQ(TraceArgText(layer, "request"), "r-7");
  EXPECT_EQ(TraceArgText(layer, "missing"), "");
  EXPECT_EQ(FindTraceArg(layer, "missing"), nullptr);

  const TraceEvent& instant = (*events)[3];
  EXPECT_EQ(instant.ph, 'i');
  EXPECT_EQ(instant.dur_ns, 0);
  EXPECT_EQ(TraceArgText(instant, "request"), "42");
}

TEST(TraceReaderTest, OtherJsonValuesBecomeText) {
  Result<std::vector<TraceEvent>> events =
      ParseTraceEvents(R"({"traceEvents":[{"name":"n","ph":"X","ts":1.5,"dur":2,"args":)"
                       R"({"flag":true,"list":[1,2],"big":18446744073709551615}}]})");
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  ASSERT_EQ(events->size(), 1u);
  const TraceEvent& e = (*events)[0];
  EXPECT_EQ(e.ts_ns, 1500);
  EXPECT_EQ(e.dur_ns, 2000);
  EXPECT_EQ(TraceArgText(e, "flag"), "true");
  EXPECT_EQ(TraceArgText(e, "list"), "[1,2]");
  EXPECT_EQ(TraceArgInt(e, "big"), std::nullopt);  // beyond int64: a double
  EXPECT_GT(TraceArgNumber(e, "big").value_or(0), 1.8e19);
}

void ExpectInvalid(std::string_view text, const std::string& needle) {
  Result<std::vector<TraceEvent>> events = ParseTraceEvents(text);
  ASSERT_FALSE(events.ok()) << text;
  EXPECT_EQ(events.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(events.status().message(), HasSubstr(needle));
}

TEST(TraceReaderTest, RejectsWhatIsNotATrace) {
  ExpectInvalid("not json", "trace: not JSON");
  ExpectInvalid("[]", "\"traceEvents\" array");
  ExpectInvalid(R"({"traceEvents":{}})", "\"traceEvents\" array");
  ExpectInvalid(R"({"traceEvents":[3]})", "event 0 (3) is not an object");
  ExpectInvalid(R"({"traceEvents":[{"ph":"X","ts":1},{"name":"a","ts":1}]})",
                "event 1 ({\"name\":\"a\",\"ts\":1}) has no one-letter \"ph\"");
  ExpectInvalid(R"({"traceEvents":[{"name":"a","ph":"X"}]})", "has no numeric \"ts\"");
  ExpectInvalid(R"({"traceEvents":[{"ph":"X","ts":1,"args":[]}]})", "\"args\" not an object");
  // Metadata needs no timestamp.
  EXPECT_TRUE(ParseTraceEvents(R"({"traceEvents":[{"name":"thread_name","ph":"M"}]})").ok());
}

TEST(TraceReaderTest, ReadsAFileAndNamesItInErrors) {
  char dir[] = "/tmp/pd_trace_reader_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string good = std::string(dir) + "/good.json";
  const std::string bad = std::string(dir) + "/bad.json";
  Tracer t;
  t.Instant("mark", "test");
  ASSERT_TRUE(t.WriteToFile(good).ok());
  ASSERT_TRUE(WriteStringToFile(bad, "{\"traceEvents\": [").ok());
  Result<std::vector<TraceEvent>> events = ReadTraceEvents(good);
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].name, "mark");
  Result<std::vector<TraceEvent>> broken = ReadTraceEvents(bad);
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.status().message(), HasSubstr(bad + ": trace: not JSON"));
  const std::string missing = std::string(dir) + "/missing.json";
  EXPECT_THAT(ReadTraceEvents(missing).status().message(), HasSubstr(missing));
  ::unlink(good.c_str());
  ::unlink(bad.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace pd
