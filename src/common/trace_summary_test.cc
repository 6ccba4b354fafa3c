#include "common/trace_summary.h"

#include <gtest/gtest.h>

#include <string>

#include "common/trace.h"

namespace pd {
namespace {

// Hand-written traces: times in microseconds.
std::string Layer(int layer, int step, double ts, double dur) {
  return "{\"name\":\"layer\",\"cat\":\"compute\",\"ph\":\"X\",\"ts\":" + std::to_string(ts) +
         ",\"dur\":" + std::to_string(dur) +
         ",\"pid\":1,\"tid\":2,\"args\":{\"layer\":" + std::to_string(layer) +
         ",\"step\":" + std::to_string(step) + "}}";
}
std::string Post(const std::string& request, int layer, int step, double ts) {
  return "{\"name\":\"post writes\",\"cat\":\"kv\",\"ph\":\"X\",\"ts\":" + std::to_string(ts) +
         ",\"dur\":1,\"pid\":1,\"tid\":3,\"args\":{\"request\":\"" + request +
         "\",\"layer\":" + std::to_string(layer) + ",\"step\":" + std::to_string(step) + "}}";
}
std::string Doc(const std::vector<std::string>& events, int dropped = 0) {
  std::string s = "{\"traceEvents\":[";
  for (size_t i = 0; i < events.size(); ++i) s += (i ? "," : "") + events[i];
  return s + "],\"otherData\":{\"dropped_events\":" + std::to_string(dropped) + "}}";
}

TEST(TraceSummaryTest, CountsLayersPostedBeforeNextComputeEnded) {
  // Layers of step 4: [100,200) [200,300) [300,400).
  std::string doc = Doc({Layer(0, 4, 100, 100), Layer(1, 4, 200, 100), Layer(2, 4, 300, 100),
                         Post("9", 0, 4, 150),    // before layer 0 even ended: yes
                         Post("9", 1, 4, 420),    // after layer 2 ended: NO
                         Post("9", 2, 4, 390),    // last layer: not counted
                         Layer(0, 5, 500, 10)});  // an unrelated step
  auto s = SummarizePrefillTrace(doc);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->num_layers, 3);
  ASSERT_EQ(s->rows.size(), 3u);
  EXPECT_EQ(s->num_with_next, 2);
  EXPECT_EQ(s->num_posted_before_next_end, 1);
  EXPECT_EQ(s->rows[0].layer, 0);
  EXPECT_DOUBLE_EQ(s->rows[0].compute_end_us, 200);
  EXPECT_DOUBLE_EQ(s->rows[0].next_compute_end_us, 300);
  EXPECT_TRUE(s->rows[0].posted_before_next_end());
  EXPECT_FALSE(s->rows[1].posted_before_next_end());
  EXPECT_FALSE(s->rows[2].has_next);
  EXPECT_EQ(s->num_posts_without_compute, 0);
  EXPECT_EQ(s->num_posts_before_compute_began, 0);
  const std::string text = FormatTraceSummary(*s);
  EXPECT_NE(text.find("request 9, runner step 4"), std::string::npos) << text;
  EXPECT_NE(text.find("1 of 2"), std::string::npos) << text;
  EXPECT_NE(text.find("NO"), std::string::npos) << text;
  EXPECT_NE(text.find("(last layer)"), std::string::npos) << text;
  EXPECT_EQ(text.find("warning"), std::string::npos) << text;
}

TEST(TraceSummaryTest, FlagsAcausalAndOrphanPostsAndDrops) {
  std::string doc = Doc(
      {Layer(0, 1, 100, 50), Layer(1, 1, 150, 50), Post("a", 0, 1, 90), Post("a", 0, 7, 300)}, 3);
  auto s = SummarizePrefillTrace(doc);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->num_posts_before_compute_began, 1);
  EXPECT_EQ(s->num_posts_without_compute, 1);
  EXPECT_EQ(s->dropped_events, 3);
  const std::string text = FormatTraceSummary(*s);
  EXPECT_NE(text.find("1 post(s) without a compute event, 1 posted before"), std::string::npos)
      << text;
  EXPECT_NE(text.find("dropped 3 events"), std::string::npos) << text;
}

TEST(TraceSummaryTest, RequestsAndStepsAreGroupedSeparately) {
  std::string doc =
      Doc({Layer(0, 1, 0, 10), Layer(1, 1, 10, 10), Layer(0, 2, 30, 10), Layer(1, 2, 40, 10),
           Post("b", 0, 2, 35), Post("a", 0, 1, 5), Post("b", 0, 1, 6)});
  auto s = SummarizePrefillTrace(doc);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->rows.size(), 3u);
  EXPECT_EQ(s->rows[0].request, "a");
  EXPECT_EQ(s->rows[1].request, "b");
  EXPECT_EQ(s->rows[1].step, 1);
  EXPECT_EQ(s->rows[2].step, 2);
  EXPECT_DOUBLE_EQ(s->rows[2].next_compute_end_us, 50);
  EXPECT_EQ(s->num_posted_before_next_end, 3);
}

TEST(TraceSummaryTest, ReadsWhatTheTracerWrites) {
  Tracer t;
  t.Complete("layer", "compute", 1'000'000, 1'100'000,
             {{"layer", int64_t{0}}, {"step", int64_t{0}}});
  t.Complete("layer", "compute", 1'100'000, 1'200'000,
             {{"layer", int64_t{1}}, {"step", int64_t{0}}});
  t.Complete("post writes", "kv", 1'050'000, 1'060'000,
             {{"request", std::string("42")}, {"layer", int64_t{0}}, {"step", int64_t{0}}});
  auto s = SummarizePrefillTrace(t.ToJson());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->rows.size(), 1u);
  EXPECT_EQ(s->rows[0].request, "42");
  EXPECT_DOUBLE_EQ(s->rows[0].posted_us, 1050.0);
  EXPECT_EQ(s->num_posted_before_next_end, 1);
}

TEST(TraceSummaryTest, RejectsMalformedInput) {
  EXPECT_EQ(SummarizePrefillTrace("not json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SummarizePrefillTrace("[]").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SummarizePrefillTrace("{\"traceEvents\":{}}").status().code(),
            StatusCode::kInvalidArgument);
  auto no_args = SummarizePrefillTrace(
      "{\"traceEvents\":[{\"name\":\"layer\",\"cat\":\"compute\",\"ph\":\"X\",\"ts\":1}]}");
  EXPECT_EQ(no_args.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_args.status().message().find("args.layer"), std::string::npos);
  auto bad_type = SummarizePrefillTrace(
      "{\"traceEvents\":[{\"name\":\"layer\",\"cat\":\"compute\",\"ph\":\"X\",\"ts\":1,"
      "\"args\":{\"layer\":\"x\",\"step\":0}}]}");
  EXPECT_EQ(bad_type.status().code(), StatusCode::kInvalidArgument);
}

TEST(TraceSummaryTest, EmptyTraceHasNoRows) {
  auto s = SummarizePrefillTrace("{\"traceEvents\":[]}");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->rows.empty());
  EXPECT_NE(FormatTraceSummary(*s).find("0 of 0"), std::string::npos);
}

}  // namespace
}  // namespace pd
