#include "bench/rate_sweep.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

namespace pd::bench {
namespace {

// A deterministic fake OpenAI server whose latency grows with the offered load: the test tells
// it the rate it is being driven at (SweepOptions::on_rate), and each request's first token comes
// after TTFT(rate) = 400 ms * (rate / threshold)^16 (at most 600 ms), then max_tokens tokens 5 ms
// apart. With a TTFT SLO of 400 ms every request meets it below `threshold` req/s and none does
// above: sleeps are never shorter than asked, so a miss above is certain; a meet 2% under the
// threshold has a margin of 110 ms (the search's probes there keep this client's scheduling
// jitter on a loaded machine far from deciding a probe).
class FakeServer {
 public:
  explicit FakeServer(double threshold) : threshold_(threshold) {
    server_.new_task_queue = [] { return new httplib::ThreadPool(64); };
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"data":[{"id":"fake","max_model_len":256}]})", "application/json");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const int n = nlohmann::json::parse(req.body).value("max_tokens", 1);
      const double ttft_ms = TtftMs(rate_.load());
      res.set_chunked_content_provider(
          "text/event-stream", [n, ttft_ms, i = 0](size_t, httplib::DataSink& sink) mutable {
            std::this_thread::sleep_for(
                std::chrono::duration<double, std::milli>(i == 0 ? ttft_ms : 5.0));
            std::string event = "data: {\"choices\":[{\"text\":\"x\"}]}\n\n";
            if (++i == n) {
              event +=
                  "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":" +
                  std::to_string(n) + "}}\n\ndata: [DONE]\n\n";
            }
            sink.write(event.data(), event.size());
            if (i == n) sink.done();
            return true;
          });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeServer() {
    server_.stop();
    thread_.join();
  }
  double TtftMs(double rate) const {
    return std::isinf(rate) ? 600.0 : std::min(600.0, 400.0 * std::pow(rate / threshold_, 16));
  }
  void set_rate(double rate) { rate_.store(rate); }
  int port() const { return port_; }

 private:
  const double threshold_;
  std::atomic<double> rate_{1.0};
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

SweepOptions FakeOptions(FakeServer* fake) {
  SweepOptions o;
  o.bench.endpoint.port = fake->port();
  o.bench.dataset.name = "random";
  o.bench.dataset.random_input_len = 8;
  o.bench.dataset.random_output_len = 4;
  o.bench.ignore_eos = true;
  o.bench.num_prompts = 10;
  o.warmup_requests = 1;
  o.on_rate = [fake](double rate) { fake->set_rate(rate); };
  return o;
}

// The goodput search against the fake finds its threshold (45 req/s) to the stated precision.
TEST(RateSweepTest, GoodputSearchFindsTheFakeServersThreshold) {
  FakeServer fake(45.0);
  SweepOptions o = FakeOptions(&fake);
  o.slo_ms = {{"ttft", 400}, {"tpot", 1000}};
  o.attainment_target = 0.9;
  auto runner = RateRunner::Create(o);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  GoodputSearchOptions s;
  s.start_rate = 16;
  s.precision = 0.05;
  auto report = RunGoodputSearch(runner->get(), s, 2);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const nlohmann::json& g = report->json["goodput"];
  const double goodput = g["goodput"], upper = g["upper"];
  EXPECT_LE(goodput, 45.0);
  EXPECT_GT(upper, 45.0);
  EXPECT_LE(upper - goodput, 0.05 * goodput);
  EXPECT_TRUE(g["bracketed"].get<bool>());
  EXPECT_DOUBLE_EQ(g["goodput_per_device"].get<double>(), goodput / 2);
  const nlohmann::json& rates = report->json["rates"];
  ASSERT_EQ(rates.size(), g["probes"].get<size_t>());
  for (size_t i = 0; i < rates.size(); ++i) {
    const double rate = rates[i]["request_rate"];
    if (i > 0) {
      EXPECT_LT(rates[i - 1]["request_rate"].get<double>(), rate);
    }
    EXPECT_EQ(rates[i]["completed"], 10);
    EXPECT_EQ(rates[i]["meets_target"].get<bool>(), rate <= goodput) << rate;
    EXPECT_DOUBLE_EQ(rates[i]["attainment"]["tpot"].get<double>(), 1.0);
  }
  EXPECT_THAT(report->text, ::testing::HasSubstr("goodput at 90% attainment"));
}

// A sweep: one entry per rate, sorted by rate (inf last) with the order they ran in, attainment
// per SLO and of both, and the latency percentiles; --min-duration's extra requests at a high rate.
// An E2EL SLO under the fake's 3 x 5 ms token gaps is missed by every request whatever its TTFT
// (the last token cannot be read before it is sent; TPOT has no such floor: a reader late for the
// first token reads the rest at once).
TEST(RateSweepTest, SweepReportsEachRateSortedWithAttainmentPerSlo) {
  FakeServer fake(45.0);
  SweepOptions o = FakeOptions(&fake);
  o.slo_ms = {{"ttft", 400}, {"e2el", 10}};
  o.min_duration_s = 0.25;  // 60 req/s sends 15 requests, the others --num-prompts' 10
  auto runner = RateRunner::Create(o);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  auto swept = RunSweep(runner->get(), {60, 20, INFINITY});
  ASSERT_TRUE(swept.ok()) << swept.status().ToString();
  const RatesReport& r = *swept;
  const nlohmann::json& j = r.json;
  EXPECT_EQ(j["schema"], "pdserve-bench-rates-v1");
  EXPECT_EQ(j["mode"], "sweep");
  EXPECT_EQ(j["model_id"], "fake");
  EXPECT_EQ(j["slo_ms"]["ttft"], 400);
  ASSERT_EQ(j["prompt_lens"].size(), 15u);
  EXPECT_EQ(j["output_lens"][0], 4);
  ASSERT_EQ(j["rates"].size(), 3u);
  const nlohmann::json& low = j["rates"][0];
  const nlohmann::json& high = j["rates"][1];
  const nlohmann::json& inf = j["rates"][2];
  EXPECT_EQ(low["request_rate"], 20.0);
  EXPECT_EQ(high["request_rate"], 60.0);
  EXPECT_EQ(inf["request_rate"], "inf");
  EXPECT_EQ(low["order"], 1);
  EXPECT_EQ(high["order"], 0);
  EXPECT_EQ(inf["order"], 2);
  EXPECT_DOUBLE_EQ(low["attainment"]["ttft"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(high["attainment"]["ttft"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(inf["attainment"]["ttft"].get<double>(), 0.0);
  for (const auto& e : j["rates"]) {
    EXPECT_DOUBLE_EQ(e["attainment"]["e2el"].get<double>(), 0.0);
    EXPECT_TRUE(e["attainment"]["tpot"].is_null());
    EXPECT_DOUBLE_EQ(e["attainment"]["both"].get<double>(), 0.0);
    EXPECT_EQ(e["completed"], e["num_prompts"]);
    for (const char* k : {"p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p99_tpot_ms"})
      EXPECT_TRUE(e.contains(k)) << k;
    EXPECT_FALSE(e.contains("ttfts"));  // per-request arrays stay out of the rates document
  }
  EXPECT_EQ(high["num_prompts"], 15);
  EXPECT_EQ(low["num_prompts"], 10);
  EXPECT_EQ(inf["num_prompts"], 10);
  EXPECT_GE(high["p50_ttft_ms"].get<double>(), 600.0);
  EXPECT_GE(low["p50_e2el_ms"].get<double>(), 15.0);
}

}  // namespace
}  // namespace pd::bench
