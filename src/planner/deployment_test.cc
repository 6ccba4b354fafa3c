#include "planner/deployment.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/check.h"
#include "common/file_util.h"
#include "planner/latency_model.h"
#include "planner/setup.h"
#include "planner/test_data.h"
#include "planner/workload.h"

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

// A pdserve-profile-v1 file (TP 1, measured with `threads` threads) and a lengths CSV in the
// temp directory, removed with the object.
class LocalClusterFiles {
 public:
  explicit LocalClusterFiles(const std::string& threads_json) {
    static int serial = 0;
    const std::string stem =
        (std::filesystem::temp_directory_path() /
         ("pd_plan_rt_" + std::to_string(::getpid()) + "_" + std::to_string(serial++) + "_"))
            .string();
    profile_ = stem + "profile.json";
    lengths_ = stem + "lengths.csv";
    TableLatencyModel m("qwen3-tiny");
    StepCoeffs c;
    c.prefill = {1.0, 0.05, 2e-5};
    c.decode_small = c.decode_large = {1.5, 1e-4, 0.05};
    m.Set(1, c);
    nlohmann::json j = nlohmann::json::parse(ToPdserveProfileJson(m, "cpu, test"));
    if (!threads_json.empty()) j["threads"] = nlohmann::json::parse(threads_json);
    PD_CHECK(WriteStringToFile(profile_, j.dump()).ok());
    PD_CHECK(WriteStringToFile(lengths_, "prompt_len,output_len\n64,16\n200,8\n30,40\n").ok());
  }
  ~LocalClusterFiles() {
    std::filesystem::remove(profile_);
    std::filesystem::remove(lengths_);
  }
  // `pdserve plan` options for one node of `devices` CPU devices with this profile.
  SetupOptions Options(int devices) const {
    SetupOptions o;
    o.model = "opt-13b";  // the shape sizes KV; the profile gives the step times
    o.hardware = "cpu";
    o.profile = profile_;
    o.lengths = lengths_;
    o.nodes = 1;
    o.devices_per_node = devices;
    o.ttft_s = 0.5;
    o.tpot_s = 0.05;
    o.num_requests = 40;
    o.max_pp = 1;
    o.threads = 1;
    return o;
  }

 private:
  std::string profile_, lengths_;
};

TEST(LocalPlan, PlanOutForALocalCpuClusterIsAcceptedByUpWithItsThreads) {
  LocalClusterFiles files("3");
  auto setup = BuildPlannerSetup(files.Options(2));
  ASSERT_TRUE(setup.ok()) << setup.status().ToString();
  PlannerInputs& in = (*setup)->inputs;
  EXPECT_EQ(in.threads_per_device, 3);  // the profile's
  in.max_requests = 200;
  in.min_duration_s = 5;
  in.iterations = 6;
  auto report = SearchPlacement(in);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::string json = PlanToJson(*report, in);
  for (const auto& inst : nlohmann::json::parse(json)["plan"]["instances"]) {
    EXPECT_EQ(inst.value("threads", 0), 3) << json;
  }
  LocalLimits limits{2, /*engine_tp=*/true, /*pin_cores=*/false};
  auto local = LocalPlanFromJson(json, "plan.json", limits);
  ASSERT_TRUE(local.ok()) << local.status().ToString() << "\n" << json;
  EXPECT_EQ(local->threads, 3);
  EXPECT_EQ(local->num_prefill, report->best.num_prefill * report->best.replicas);
  EXPECT_EQ(local->num_decode, report->best.num_decode * report->best.replicas);
  EXPECT_EQ(local->prefill_tp, report->best.prefill.par.tp);
  EXPECT_EQ(local->decode_tp, report->best.decode.par.tp);
  EXPECT_LE(local->num_prefill * local->prefill_tp + local->num_decode * local->decode_tp, 2);
}

TEST(LocalPlan, DeviceThreadsComeFromTheFlagThenTheProfileThenTheCores) {
  LocalClusterFiles files("2");
  SetupOptions o = files.Options(2);
  o.device_threads = 5;  // the flag wins
  auto flagged = BuildPlannerSetup(o);
  ASSERT_TRUE(flagged.ok()) << flagged.status().ToString();
  EXPECT_EQ((*flagged)->inputs.threads_per_device, 5);
  LocalClusterFiles unthreaded("");  // an older profile without "threads"
  o = unthreaded.Options(1);
  auto cores = BuildPlannerSetup(o);
  ASSERT_TRUE(cores.ok()) << cores.status().ToString();
  EXPECT_EQ((*cores)->inputs.threads_per_device,
            std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  o.hardware = "a100-80gb";  // an accelerator: no threads in the plan
  auto gpu = BuildPlannerSetup(o);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  EXPECT_EQ((*gpu)->inputs.threads_per_device, 0);
  PlanReport report;
  report.best.mode = "disaggregated";
  report.colocated.mode = "colocated";
  auto j = nlohmann::json::parse(PlanToJson(report, (*gpu)->inputs));
  EXPECT_FALSE(j["plan"]["instances"][0].contains("threads"));
}

TEST(LocalPlan, BadDeviceThreadsAreRefused) {
  LocalClusterFiles files("0");
  auto zero = BuildPlannerSetup(files.Options(2));
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("'threads' must be a positive integer"), std::string::npos)
      << zero.status().message();
  LocalClusterFiles text("\"two\"");
  EXPECT_EQ(BuildPlannerSetup(text.Options(2)).status().code(), StatusCode::kInvalidArgument);
  LocalClusterFiles good("1");
  SetupOptions o = good.Options(2);
  o.device_threads = -1;
  EXPECT_EQ(BuildPlannerSetup(o).status().code(), StatusCode::kInvalidArgument);
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

TEST(TraceName, OnlyAFinalJsonIsTakenOff) {
  EXPECT_EQ(TraceNameOf("distserve-c21d11-300-4.5"), "distserve-c21d11-300-4.5");
  EXPECT_EQ(TraceNameOf("vllm-150-1.5.json"), "vllm-150-1.5");
  EXPECT_EQ(TraceNameOf("data/workloads/distserve-c21d12-400-4.json"), "distserve-c21d12-400-4");
  EXPECT_EQ(TraceNameOf("vllm-100-1"), "vllm-100-1");
}

// Every recorded A100 trace, whatever its name: a deployment read off the name, and a workload
// and a measured file that load and describe the same requests.
TEST(TraceName, EveryRecordedTraceHasADeploymentAWorkloadAndItsMeasurements) {
  PD_REQUIRE_DISTSERVE_DATA();
  const std::string dir = testing::DistServePath("real-a100-opt13b-sharegpt/");
  int traces = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "workloads")) {
    const std::string name = TraceNameOf(entry.path().string());
    SCOPED_TRACE(name);
    bool assumed = false;
    EXPECT_TRUE(DeploymentFromTraceName(name, &assumed).ok());
    auto trace = LoadTraceJson(dir + "workloads/" + name + ".json");
    auto measured = LoadMeasuredJson(dir + "measured/" + name + ".json");
    ASSERT_TRUE(trace.ok()) << trace.status().ToString();
    ASSERT_TRUE(measured.ok()) << measured.status().ToString();
    EXPECT_FALSE(trace->empty());
    EXPECT_EQ(trace->size(), measured->size());
    ++traces;
  }
  EXPECT_EQ(traces, 37);
}

}  // namespace
}  // namespace pd::planner
