#include "planner/simulate_json.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

namespace pd::planner {
namespace {

PlannerInputs Inputs() {
  PlannerInputs in;
  in.shape.name = "opt-13b";
  in.hw.name = "a100-80gb";
  in.slo = {0.25, 0.1};
  in.attainment = 0.9;
  in.arrivals.num_requests = 300;
  return in;
}

Summary MakeSummary(double both, double ttft_p50_s) {
  Summary s;
  s.num_requests = 300;
  s.num_failed = 2;
  s.attainment = both;
  s.ttft_attainment = std::min(1.0, both + 0.05);
  s.tpot_attainment = std::min(1.0, both + 0.02);
  s.ttft_p50_s = ttft_p50_s;
  s.ttft_p90_s = 2 * ttft_p50_s;
  s.tpot_p50_s = 0.03;
  s.tpot_p90_s = 0.05;
  return s;
}

TEST(SimulateJsonTest, RatesCarryTheSettingsAndOneEntryPerRateInMilliseconds) {
  SimulatedRates r;
  r.deployment = "prefill 2x1 x1 + decode 1x1 x1";
  r.disaggregated = true;
  r.latency_model = "analytical:opt-13b@a100-80gb";
  r.rates = {{1.0, MakeSummary(0.99, 0.08)}, {4.5, MakeSummary(0.62, 0.4)}};
  r.goodput = 3.25;
  const auto j = nlohmann::json::parse(SimulatedRatesToJson(r, Inputs()));
  EXPECT_EQ(j["schema"], "pdserve-simulate-v1");
  EXPECT_EQ(j["mode"], "rates");
  EXPECT_EQ(j["model"], "opt-13b");
  EXPECT_EQ(j["hardware"], "a100-80gb");
  EXPECT_DOUBLE_EQ(j["slo_ms"]["ttft"].get<double>(), 250.0);
  EXPECT_DOUBLE_EQ(j["slo_ms"]["tpot"].get<double>(), 100.0);
  EXPECT_DOUBLE_EQ(j["attainment_target"].get<double>(), 0.9);
  EXPECT_EQ(j["deployment"], r.deployment);
  EXPECT_TRUE(j["disaggregated"].get<bool>());
  EXPECT_EQ(j["num_requests"], 300);
  ASSERT_EQ(j["rates"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["rates"][1]["request_rate"].get<double>(), 4.5);
  EXPECT_DOUBLE_EQ(j["rates"][1]["attainment"]["both"].get<double>(), 0.62);
  EXPECT_DOUBLE_EQ(j["rates"][1]["attainment"]["ttft"].get<double>(), 0.67);
  EXPECT_DOUBLE_EQ(j["rates"][1]["p90_ttft_ms"].get<double>(), 800.0);
  EXPECT_DOUBLE_EQ(j["rates"][0]["p50_tpot_ms"].get<double>(), 30.0);
  EXPECT_EQ(j["rates"][0]["failed"], 2);
  EXPECT_DOUBLE_EQ(j["goodput"]["goodput"].get<double>(), 3.25);
}

TEST(SimulateJsonTest, NoGoodputIsNull) {
  SimulatedRates r;
  r.rates = {{8.0, MakeSummary(0.1, 2.0)}};
  const auto j = nlohmann::json::parse(SimulatedRatesToJson(r, Inputs()));
  EXPECT_TRUE(j["goodput"].is_null());
  EXPECT_FALSE(j["disaggregated"].get<bool>());
}

TEST(SimulateJsonTest, TracesSetSimulatedBesideMeasured) {
  TraceReplay t;
  t.name = "distserve-c21d11-300-6";
  t.system = "c21d11";
  t.rate = 6.0;
  t.num_requests = 300;
  t.simulated = MakeSummary(0.963, 0.092);
  t.measured = MakeSummary(0.953, 0.095);
  TraceReplay v = t;
  v.name = "vllm-300-3";
  v.system = "vllm";
  v.assumed = true;
  const auto j = nlohmann::json::parse(ReplaysToJson({t, v}, Inputs()));
  EXPECT_EQ(j["mode"], "traces");
  ASSERT_EQ(j["traces"].size(), 2u);
  EXPECT_EQ(j["traces"][0]["name"], "distserve-c21d11-300-6");
  EXPECT_EQ(j["traces"][0]["system"], "c21d11");
  EXPECT_DOUBLE_EQ(j["traces"][0]["request_rate"].get<double>(), 6.0);
  EXPECT_DOUBLE_EQ(j["traces"][0]["simulated"]["attainment"]["both"].get<double>(), 0.963);
  EXPECT_DOUBLE_EQ(j["traces"][0]["measured"]["attainment"]["both"].get<double>(), 0.953);
  EXPECT_DOUBLE_EQ(j["traces"][0]["measured"]["p50_ttft_ms"].get<double>(), 95.0);
  EXPECT_TRUE(j["traces"][1]["assumed"].get<bool>());
  EXPECT_FALSE(j["traces"][1]["deployment"].get<std::string>().empty());
}

}  // namespace
}  // namespace pd::planner
