#include "planner/deployment.h"

#include <gtest/gtest.h>

#include "planner/latency_model.h"

namespace pd::planner {
namespace {

std::string PlanJson(const std::string& instances, const std::string& mode = "disaggregated") {
  return R"({"format": "pdserve-plan-v1", "plan": {"mode": ")" + mode +
         R"(", "placement": "high-affinity", "instances": [)" + instances + "]}}";
}

TEST(LocalPlan, TakesCountsAndThreadsFromThePlan) {
  const std::string j = PlanJson(
      R"({"role": "prefill", "count": 2, "tp": 1, "pp": 1, "threads": 3},
         {"role": "decode", "count": 1, "tp": 1, "pp": 1, "threads": 3})");
  auto p = LocalPlanFromJson(j, "plan.json", LocalLimits{});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->num_prefill, 2);
  EXPECT_EQ(p->num_decode, 1);
  EXPECT_EQ(p->threads, 3);
  auto no_threads = LocalPlanFromJson(
      PlanJson(R"({"role": "prefill", "count": 1}, {"role": "decode", "count": 4})"), "p",
      LocalLimits{});
  ASSERT_TRUE(no_threads.ok());
  EXPECT_EQ(no_threads->threads, 0);
  EXPECT_EQ(no_threads->num_decode, 4);
}

TEST(LocalPlan, AcceptsWhatPlanToJsonWrites) {
  PlanReport report;
  report.best.mode = "disaggregated";
  report.best.prefill.par = {1, 1};
  report.best.decode.par = {1, 1};
  report.best.num_prefill = 2;
  report.best.num_decode = 1;
  report.best.replicas = 2;
  report.best.unit_devices = 3;
  report.colocated.mode = "colocated";
  report.colocated.num_colocated = 1;
  TableLatencyModel model("m");
  PlannerInputs in;
  in.model = &model;
  auto p = LocalPlanFromJson(PlanToJson(report, in), "plan.json", LocalLimits{});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->num_prefill, 4);  // 2 per unit x 2 replicas
  EXPECT_EQ(p->num_decode, 2);
}

TEST(LocalPlan, RefusesWhatALocalDeploymentCannotDo) {
  auto expect_error = [](const std::string& json, const LocalLimits& limits,
                         const std::string& words) {
    auto p = LocalPlanFromJson(json, "plan.json", limits);
    ASSERT_FALSE(p.ok()) << words;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(words), std::string::npos) << p.status().message();
    EXPECT_NE(p.status().message().find("plan.json"), std::string::npos);
  };
  expect_error(PlanJson(R"({"role": "colocated", "count": 2})", "colocated"), {}, "colocated");
  expect_error(PlanJson(R"({"role": "prefill", "pp": 2}, {"role": "decode"})"), {},
               "pipeline parallelism");
  expect_error(PlanJson(R"({"role": "prefill"}, {"role": "decode", "tp": 2})"), {},
               "tensor parallelism");
  expect_error(PlanJson(R"({"role": "prefill", "threads": 0}, {"role": "decode"})"), {},
               "'threads' must be a positive integer");
  expect_error(PlanJson(R"({"role": "prefill", "threads": 2}, {"role": "decode", "threads": 1})"),
               {}, "different 'threads'");
  expect_error(PlanJson(R"({"role": "prefill", "count": 2}, {"role": "decode", "count": 2})"),
               LocalLimits{2, false, true}, "cannot each be pinned");
  expect_error("[1, 2]", {}, "not a JSON object");
  expect_error(R"({"format": "other"})", {}, "pdserve-plan-v1");
  expect_error(PlanJson(R"({"role": "router"})"), {}, "unknown role");
}

TEST(LocalPlan, TensorParallelPassesWhenTheEngineHasIt) {
  auto p = LocalPlanFromJson(PlanJson(R"({"role": "prefill", "tp": 2}, {"role": "decode"})"), "p",
                             LocalLimits{0, true, false});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->prefill_tp, 2);
  EXPECT_EQ(p->decode_tp, 1);
  // Unpinned, more instances than cores is allowed (they share cores).
  auto many = LocalPlanFromJson(
      PlanJson(R"({"role": "prefill", "count": 3}, {"role": "decode", "count": 3})"), "p",
      LocalLimits{2, false, false});
  EXPECT_TRUE(many.ok());
}

}  // namespace
}  // namespace pd::planner
