#include "server/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "server/openai_response.h"

namespace pd::server {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, CounterGaugeHistogramText) {
  Registry r;
  MetricFamily* c = r.AddCounter("x:requests_total", "Requests.");
  MetricFamily* g = r.AddGauge("x:usage", "Usage.");
  MetricFamily* h = r.AddHistogram("x:latency_seconds", "Latency.", {0.1, 1.0});
  c->Increment({{"model_name", "m"}, {"finished_reason", "stop"}}, 2);
  g->Set({{"model_name", "m"}}, 0.25);
  h->Observe({{"model_name", "m"}}, 0.0625);
  h->Observe({{"model_name", "m"}}, 0.5);
  h->Observe({{"model_name", "m"}}, 7);
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("# HELP x:requests_total Requests.\n# TYPE x:requests_total counter\n"
                              "x:requests_total{model_name=\"m\",finished_reason=\"stop\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE x:usage gauge\nx:usage{model_name=\"m\"} 0.25\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE x:latency_seconds histogram\n"
                              "x:latency_seconds_bucket{model_name=\"m\",le=\"0.1\"} 1\n"
                              "x:latency_seconds_bucket{model_name=\"m\",le=\"1\"} 2\n"
                              "x:latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 3\n"
                              "x:latency_seconds_sum{model_name=\"m\"} 7.5625\n"
                              "x:latency_seconds_count{model_name=\"m\"} 3\n"));
  EXPECT_EQ(h->SampleCount({{"model_name", "m"}}), 3u);
  EXPECT_DOUBLE_EQ(c->Value({{"model_name", "m"}, {"finished_reason", "stop"}}), 2.0);
}

TEST(MetricsTest, LabelValuesAreEscaped) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(FormatSampleValue(3.0), "3");
  EXPECT_EQ(FormatSampleValue(1.0 / 0.0), "+Inf");
}

TEST(MetricsTest, CollectHookRunsBeforeRender) {
  Registry r;
  MetricFamily* g = r.AddGauge("x:g", "G.");
  int calls = 0;
  r.AddCollectHook([&] { g->Set({}, ++calls); });
  EXPECT_THAT(r.Render(), HasSubstr("x:g 1\n"));
  EXPECT_THAT(r.Render(), HasSubstr("x:g 2\n"));
}

// A counter that mirrors the engine's running total follows it and never goes down; the usage
// object carries the cached prompt tokens.
TEST(MetricsTest, PrefixCacheCountersMirrorTheEngineAndUsageCarriesCachedTokens) {
  ServingMetrics m("m");
  const Labels l = m.model_labels();
  EXPECT_THAT(m.registry.Render(),
              HasSubstr("pdserve:prefix_cache_queries_total{model_name=\"m\"} 0\n"));
  m.prefix_cache_hits->SetTotal(l, 1984);
  m.prefix_cache_hits->SetTotal(l, 1000);  // an older reading: ignored
  EXPECT_DOUBLE_EQ(m.prefix_cache_hits->Value(l), 1984);
  EXPECT_THAT(m.registry.Render(),
              HasSubstr("# TYPE pdserve:prefix_cache_hits_total counter\n"
                        "pdserve:prefix_cache_hits_total{model_name=\"m\"} 1984\n"));
  const nlohmann::json usage = UsageJson(2000, 3, 1984);
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], 1984);
  EXPECT_EQ(usage["total_tokens"], 2003);
  EXPECT_EQ(UsageJson(5, 1)["prompt_tokens_details"]["cached_tokens"], 0);
}

// Every line is a comment or `name{labels} value`, as a Prometheus parser expects.
TEST(MetricsTest, ServingMetricsUseVllmNamesAndBuckets) {
  ServingMetrics m("tiny \"model\"");
  m.RecordFinished("length");
  m.ttft->Observe(m.model_labels(), 0.003);
  const std::string text = m.registry.Render();
  for (const char* name :
       {"pdserve:time_to_first_token_seconds_bucket", "pdserve:inter_token_latency_seconds_count",
        "pdserve:e2e_request_latency_seconds_sum", "pdserve:request_queue_time_seconds_bucket",
        "pdserve:num_requests_running", "pdserve:num_requests_waiting",
        "pdserve:kv_cache_usage_perc", "pdserve:prompt_tokens_total",
        "pdserve:generation_tokens_total"}) {
    EXPECT_THAT(text, HasSubstr(name));
  }
  EXPECT_THAT(text, HasSubstr("pdserve:request_success_total{model_name=\"tiny "
                              "\\\"model\\\"\",finished_reason=\"length\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("pdserve:request_success_total{model_name=\"tiny "
                              "\\\"model\\\"\",finished_reason=\"stop\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("pdserve:time_to_first_token_seconds_bucket{model_name=\"tiny "
                              "\\\"model\\\"\",le=\"0.001\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("pdserve:time_to_first_token_seconds_bucket{model_name=\"tiny "
                              "\\\"model\\\"\",le=\"0.005\"} 1\n"));
  EXPECT_EQ(TtftBuckets().size(), 22u);
  EXPECT_EQ(TtftBuckets().back(), 2560.0);
  EXPECT_EQ(InterTokenLatencyBuckets().size(), 19u);
  EXPECT_EQ(RequestLatencyBuckets().back(), 7680.0);
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("#", 0) == 0) continue;
    EXPECT_THAT(line, ::testing::MatchesRegex("pdserve:[a-z0-9_]+(\\{.*\\})? [-+0-9.eInf]+"))
        << line;
  }
}

}  // namespace
}  // namespace pd::server
