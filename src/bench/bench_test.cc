#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <thread>

#include "bench/client.h"
#include "bench/datasets.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "common/thread_util.h"

namespace pd::bench {
namespace {

using ::testing::HasSubstr;

TEST(DatasetsTest, LikeDatasetsMatchTheirMeans) {
  for (const char* name : {"sharegpt-like", "humaneval-like", "longbench-like"}) {
    DatasetSpec spec;
    spec.name = name;
    auto lengths = SampleLengths(spec, 20000, 1);
    ASSERT_TRUE(lengths.ok());
    double p = 0, o = 0;
    for (const auto& l : *lengths) {
      p += l.prompt_len;
      o += l.output_len;
    }
    auto d = LikeDatasetDistribution(name);
    ASSERT_TRUE(d.ok());
    EXPECT_NEAR(p / lengths->size(), d->prompt.mean, 0.05 * d->prompt.mean) << name;
    EXPECT_NEAR(o / lengths->size(), d->output.mean, 0.08 * d->output.mean) << name;
  }
}

TEST(DatasetsTest, ScaleClampAndDeterminism) {
  DatasetSpec spec;
  spec.name = "longbench-like";
  spec.length_scale = 0.1;
  spec.max_total_len = 256;
  auto a = SampleLengths(spec, 500, 7);
  auto b = SampleLengths(spec, 500, 7);
  ASSERT_TRUE(a.ok() && b.ok());
  double mean = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].prompt_len, (*b)[i].prompt_len);
    EXPECT_LE((*a)[i].prompt_len + (*a)[i].output_len, 256);
    EXPECT_GE((*a)[i].output_len, 1);
    mean += (*a)[i].prompt_len;
  }
  EXPECT_LT(mean / a->size(), 200);
  EXPECT_FALSE(SampleLengths({.name = "nope"}, 5, 0).ok());
  EXPECT_FALSE(SampleLengths({.name = "random", .random_range_ratio = 1.5}, 5, 0).ok());
  DatasetSpec random{.name = "random",
                     .random_input_len = 100,
                     .random_output_len = 10,
                     .random_range_ratio = 0.5};
  auto r = SampleLengths(random, 1000, 3);
  ASSERT_TRUE(r.ok());
  for (const auto& l : *r) {
    EXPECT_GE(l.prompt_len, 50);
    EXPECT_LE(l.prompt_len, 150);
  }
}

TEST(DatasetsTest, ArrivalsHaveTheRequestedRate) {
  for (double burstiness : {1.0, 0.5, 4.0}) {
    auto t = ArrivalTimes(20000, 10.0, burstiness, 5);
    EXPECT_EQ(t[0], 0.0);
    EXPECT_NEAR(t.back() / (t.size() - 1), 0.1, 0.005) << burstiness;
    for (size_t i = 1; i < t.size(); ++i) ASSERT_GE(t[i], t[i - 1]);
  }
  auto all = ArrivalTimes(10, INFINITY, 1.0, 0);
  for (double v : all) EXPECT_EQ(v, 0.0);
}

TEST(ReportTest, PercentilesMatchNumpy) {
  // numpy.percentile([1, 2, 3, 4, 10], [50, 90, 99]) = [3, 7.6, 9.76]
  std::vector<double> v = {4, 1, 10, 3, 2};
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 3.0);
  EXPECT_NEAR(Percentile(v, 90), 7.6, 1e-12);
  EXPECT_NEAR(Percentile(v, 99), 9.76, 1e-12);
  EXPECT_DOUBLE_EQ(Mean(v), 4.0);
  EXPECT_NEAR(StdDev(v), std::sqrt(10.0), 1e-12);
  EXPECT_EQ(Percentile({}, 50), 0.0);
}

TEST(ReportTest, ParsesFlags) {
  auto g = ParseGoodput({"ttft:200", "tpot:50.5"});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)["ttft"], 200);
  EXPECT_EQ((*g)["tpot"], 50.5);
  EXPECT_FALSE(ParseGoodput({"ttft"}).ok());
  EXPECT_FALSE(ParseGoodput({"foo:1"}).ok());
  EXPECT_FALSE(ParseGoodput({"ttft:-1"}).ok());
  EXPECT_EQ(*ParseMetricNames("ttft,e2el"), (std::vector<std::string>{"ttft", "e2el"}));
  EXPECT_FALSE(ParseMetricNames("ttft,xyz").ok());
  EXPECT_EQ(*ParsePercentiles("50,99.9"), (std::vector<double>{50, 99.9}));
  EXPECT_FALSE(ParsePercentiles("0").ok());
  EXPECT_FALSE(ParsePercentiles("101").ok());
}

TEST(ReportTest, SummaryFieldsAndGoodput) {
  std::vector<RequestResult> results(3);
  results[0] = {true, 200, "", 10, 5, 0.1, 0.5, {0.1, 0.1, 0.1, 0.1}, 0};  // tpot 100 ms
  results[1] = {true, 200, "", 20, 3, 0.3, 0.5, {0.1, 0.1}, 0};            // ttft 300 ms
  results[2] = {false, 429, "HTTP 429", 10, 0, 0, 0, {}, 0};
  RunInfo info;
  info.duration = 2.0;
  info.num_prompts = 3;
  info.request_rate = INFINITY;
  auto s = Summarize(info, results, {"ttft", "tpot", "itl", "e2el"}, {50, 99},
                     {{"ttft", 200}, {"tpot", 150}});
  EXPECT_EQ(s.json["completed"], 2);
  EXPECT_EQ(s.json["failed"], 1);
  EXPECT_EQ(s.json["total_input_tokens"], 30);
  EXPECT_EQ(s.json["total_output_tokens"], 8);
  EXPECT_DOUBLE_EQ(s.json["request_throughput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(s.json["request_goodput"].get<double>(), 0.5);  // only request 0 meets both
  EXPECT_NEAR(s.json["slo_attainment"].get<double>(), 1.0 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(s.json["output_throughput"].get<double>(), 4.0);
  EXPECT_NEAR(s.json["mean_ttft_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(s.json["median_tpot_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(s.json["p99_itl_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(s.json["p50_e2el_ms"].get<double>(), 500, 1e-9);
  EXPECT_EQ(s.json["request_rate"], "inf");
  EXPECT_THAT(s.text, HasSubstr("Successful requests:"));
  EXPECT_THAT(s.text, HasSubstr("failed with HTTP 429:"));
  EXPECT_THAT(s.text, HasSubstr("P99 TTFT (ms):"));
  EXPECT_THAT(s.text, HasSubstr("Request goodput (req/s):"));
}

TEST(ClientTest, SseTimerTimesTextChunksAndReadsUsage) {
  SseTimer t(10.0);
  auto feed = [](SseTimer& timer, const std::string& data, double now) {
    timer.Feed(data.data(), data.size(), now);
  };
  feed(t, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n", 10.05);
  feed(t, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choi", 10.2);
  feed(t, "ces\":[{\"text\":\"b\"}]}\n\n", 10.5);
  feed(t,
       "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\ndata: "
       "[DONE]\n\n",
       10.6);
  EXPECT_TRUE(t.done());
  RequestResult r;
  r.http_status = 200;
  t.Finish(&r);
  EXPECT_TRUE(r.success) << r.error;
  EXPECT_NEAR(r.ttft, 0.2, 1e-9);
  EXPECT_NEAR(r.first_token_time, 10.2, 1e-9);  // on the clock the timer was given
  EXPECT_NEAR(r.latency, 0.5, 1e-9);
  ASSERT_EQ(r.itl.size(), 1u);
  EXPECT_NEAR(r.itl[0], 0.3, 1e-9);
  EXPECT_EQ(r.prompt_len, 7);
  EXPECT_EQ(r.output_len, 2);
  // A chunk whose text is empty (a special token, half a character) still times a token.
  SseTimer held(0);
  feed(held, "data: {\"choices\":[{\"text\":\"\"}]}\n\n", 1.5);
  feed(held, "data: {\"choices\":[{\"text\":\"\\u00e9\"}]}\n\ndata: [DONE]\n\n", 1.75);
  RequestResult h;
  h.http_status = 200;
  held.Finish(&h);
  EXPECT_TRUE(h.success) << h.error;
  EXPECT_NEAR(h.ttft, 1.5, 1e-9);
  ASSERT_EQ(h.itl.size(), 1u);
  EXPECT_NEAR(h.itl[0], 0.25, 1e-9);
  EXPECT_EQ(h.output_len, 2);
  SseTimer cut(0);
  feed(cut, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n", 1);
  RequestResult c;
  c.http_status = 200;
  cut.Finish(&c);
  EXPECT_FALSE(c.success);
  EXPECT_THAT(c.error, HasSubstr("ended early"));
}

TEST(ClientTest, ParseBaseUrl) {
  auto e = ParseBaseUrl("http://10.0.0.1:9000/v1");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "10.0.0.1");
  EXPECT_EQ(e->port, 9000);
  EXPECT_FALSE(ParseBaseUrl("https://x:1").ok());
  EXPECT_FALSE(ParseBaseUrl("http://x:0").ok());
  EXPECT_FALSE(ParseBaseUrl("http://:80").ok());
}

// A stub OpenAI server: streams max_tokens one-letter chunks, or answers 429 to every third
// request.
TEST(RunnerTest, DrivesAServerAndCountsFailures) {
  httplib::Server server;
  std::atomic<int> calls{0};
  server.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"data":[{"id":"stub","max_model_len":128}]})", "application/json");
  });
  server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    if (calls.fetch_add(1) % 3 == 2) {
      res.status = 429;
      res.set_content(R"({"error":{"message":"busy","type":"rate_limit_error","code":429}})",
                      "application/json");
      return;
    }
    auto body = nlohmann::json::parse(req.body);
    const int n = body["max_tokens"];
    const int prompt = static_cast<int>(body["prompt"].size());
    std::string sse;
    for (int i = 0; i < n; ++i) sse += "data: {\"choices\":[{\"text\":\"x\"}]}\n\n";
    sse += "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":" + std::to_string(prompt) +
           ",\"completion_tokens\":" + std::to_string(n) + "}}\n\ndata: [DONE]\n\n";
    res.set_content(sse, "text/event-stream");
  });
  int port = server.bind_to_any_port("127.0.0.1");
  std::thread t([&] { server.listen_after_bind(); });
  BenchOptions o;
  o.endpoint.port = port;
  o.dataset.name = "random";
  o.dataset.random_input_len = 20;
  o.dataset.random_output_len = 4;
  o.num_prompts = 9;
  o.max_concurrency = 2;
  o.goodput_ms = {{"ttft", 10000}};
  auto s = RunBenchmark(o);
  server.stop();
  t.join();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->json["completed"], 6);
  EXPECT_EQ(s->json["failed"], 3);
  EXPECT_EQ(s->json["total_input_tokens"], 6 * 20);
  EXPECT_EQ(s->json["total_output_tokens"], 6 * 4);
  EXPECT_EQ(s->json["model_id"], "stub");
  EXPECT_THAT(s->json["errors"][0].get<std::string>(), HasSubstr("HTTP 429: busy"));
  EXPECT_NEAR(s->json["slo_attainment"].get<double>(), 6.0 / 9, 1e-12);
}

// --cpus: every request is read on the one CPU given; a CPU this process may not use is refused
// before anything is sent.
TEST(RunnerTest, PinsTheClientThreadsToTheGivenCpus) {
  httplib::Server server;
  server.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"data":[{"id":"stub","max_model_len":128}]})", "application/json");
  });
  server.Post("/v1/completions", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        "data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: {\"choices\":[{\"text\":\"y\"}]}\n\n"
        "data: [DONE]\n\n",
        "text/event-stream");
  });
  int port = server.bind_to_any_port("127.0.0.1");
  std::thread t([&] { server.listen_after_bind(); });
  const std::vector<int> allowed = CurrentThreadCpus();
  ASSERT_FALSE(allowed.empty());
  BenchOptions o;
  o.endpoint.port = port;
  o.dataset.name = "random";
  o.dataset.random_input_len = 8;
  o.dataset.random_output_len = 2;
  o.num_prompts = 4;
  o.max_concurrency = 1;
  o.cpus = {allowed.back()};
  auto s = RunBenchmark(o);
  o.cpus = {allowed.back(), 1023};
  auto refused = RunBenchmark(o);
  server.stop();
  t.join();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->json["completed"], 4);
  ASSERT_EQ(s->json["client_cpus_at_first_token"].size(), 4u);
  for (const auto& cpu : s->json["client_cpus_at_first_token"]) EXPECT_EQ(cpu, allowed.back());
  for (const auto& d : s->json["client_run_delays_to_first_token"]) EXPECT_GE(d, 0.0);
  ASSERT_EQ(s->json["first_token_steady_times"].size(), 4u);
  for (const auto& t : s->json["first_token_steady_times"]) EXPECT_GT(t, 0.0);
  EXPECT_EQ(CurrentThreadCpus(), allowed);  // the caller's thread is left as it was
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--cpus: CPU 1023"));
}

TEST(RunnerTest, UnreachableServerIsAnError) {
  BenchOptions o;
  o.endpoint.port = 1;  // nothing listens there
  auto s = RunBenchmark(o);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pd::bench
