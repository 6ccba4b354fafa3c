// `pdserve up --plan FILE` with real processes (issue 7):
//   - a hand-written plan (1 prefill + 1 decode, threads 1) overrides --prefill/--decode/--threads,
//     the deployment gives the colocated `serve`'s greedy text, and SIGTERM stops every child;
//   - a plan written by `pdserve plan --out` for a local CPU cluster (a pdserve profile, 2 devices)
//     starts as it is, each instance with the profile's thread count;
//   - a PP > 1 plan, a colocated plan, malformed JSON and a missing file are refused with a clear
//     error and a nonzero exit, and no instance is left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tests/disagg_process.h"

namespace pd {
namespace {

using json = nlohmann::json;
using testing::CompleteAt;
using testing::Process;
using testing::PromptOf;
using testing::StartAndWaitFor;
using testing::WaitFor;
using namespace std::chrono_literals;

const std::string kBinary = PDSERVE_BINARY;
const std::string kHost = "127.0.0.1";

std::string TempPath(const std::string& name) {
  return testing::TempPathFor("pdserve_up_plan_", name);
}

// Removes the model, plans and profile when the binary ends.
[[maybe_unused]] const auto* const kTempCleanup =
    ::testing::AddGlobalTestEnvironment(new testing::TempPathCleanup("pdserve_up_plan_"));

const std::string& ModelDir() {
  static const std::string dir = testing::MakeModel(kBinary, "tiny", 7, TempPath("model"));
  return dir;
}

int PickPort() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 7919u);
  return testing::PickPortBlock(rng, 21000);
}

std::string WritePlan(const std::string& name, const std::string& contents) {
  return testing::WriteTempFile(TempPath(name), contents);
}

// A pdserve-plan-v1 file with these instances.
std::string PlanOf(const std::string& name, const std::string& mode, const json& instances) {
  json j = {{"format", "pdserve-plan-v1"},
            {"plan", {{"mode", mode}, {"placement", "high-affinity"}, {"instances", instances}}}};
  return WritePlan(name, j.dump(2));
}

// `up --plan FILE` on `port` for the tiny model, then `extra`.
std::vector<std::string> UpPlanArgv(const std::string& plan, int port,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> a = {kBinary,
                                "up",
                                "--model",
                                ModelDir(),
                                "--plan",
                                plan,
                                "--port",
                                std::to_string(port),
                                "--max-model-len",
                                "256",
                                "--served-model-name",
                                "m"};
  a.insert(a.end(), extra.begin(), extra.end());
  // A disaggregated plan's prompts, short as they are, cross the wire.
  a.insert(a.end(), testing::kTransferEveryPrompt.begin(), testing::kTransferEveryPrompt.end());
  return a;
}

// The NUL-separated argv of a live process ("" when it is gone).
std::string CmdlineOf(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Live `serve` processes whose argv has "--port" followed by one of [first, last].
std::vector<pid_t> InstancesOnPorts(int first, int last) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    const std::string cmd = CmdlineOf(pid);
    if (cmd.find(std::string(1, '\0') + "serve" + '\0') == std::string::npos) continue;
    for (int p = first; p <= last; ++p) {
      if (cmd.find(std::string("--port") + '\0' + std::to_string(p) + '\0') != std::string::npos) {
        out.push_back(pid);
      }
    }
  }
  return out;
}

// The pids up printed for its instances ("pdserve up: prefill 0 on http://... (pid N)").
std::vector<pid_t> ChildPids(const std::string& output) {
  std::vector<pid_t> out;
  for (size_t pos = output.find("(pid "); pos != std::string::npos;
       pos = output.find("(pid ", pos + 1)) {
    out.push_back(static_cast<pid_t>(std::atol(output.c_str() + pos + 5)));
  }
  return out;
}

bool Gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

TEST(UpPlan, HandWrittenPlanServesTheColocatedGreedyTextAndStopsEveryChild) {
  const int port = PickPort();
  const std::vector<std::string> shape = testing::ShapeArgs("hnd", 16, 512);
  Process colocated;
  ASSERT_TRUE(StartAndWaitFor(
      colocated, testing::ServeArgv(kBinary, ModelDir(), port + 9, 256, shape), "on http://", 60s));
  const std::string plan = PlanOf(
      "plan_1p1d.json", "disaggregated",
      json::array({{{"role", "prefill"}, {"count", 1}, {"tp", 1}, {"pp", 1}, {"threads", 1}},
                   {{"role", "decode"}, {"count", 1}, {"tp", 1}, {"pp", 1}, {"threads", 1}}}));
  // The plan's counts and threads replace these flags.
  std::vector<std::string> extra = {"--prefill", "2", "--decode", "2", "--threads", "3"};
  extra.insert(extra.end(), shape.begin(), shape.end());
  Process up;
  ASSERT_TRUE(StartAndWaitFor(up, UpPlanArgv(plan, port, extra), "router (OpenAI API) on", 60s));
  const std::string started = up.output();
  EXPECT_NE(started.find("1 prefill (TP 1) + 1 decode (TP 1) instances, 1 thread(s) per rank"),
            std::string::npos)
      << started;
  const std::vector<pid_t> children = ChildPids(started);
  ASSERT_EQ(children.size(), 2u) << started;
  EXPECT_EQ(InstancesOnPorts(port, port + 8).size(), 2u);  // the scan below sees live instances
  for (pid_t pid : children) {
    const std::string cmd = CmdlineOf(pid);
    EXPECT_NE(cmd.find(std::string("--threads") + '\0' + "1" + '\0'), std::string::npos) << cmd;
  }
  for (int len : {1, 5, 17, 40}) {
    SCOPED_TRACE("prompt of " + std::to_string(len) + " tokens");
    const auto prompt = PromptOf(len, len);
    auto [ws, want] = CompleteAt(kHost, port + 9, prompt, 8);
    auto [gs, got] = CompleteAt(kHost, port, prompt, 8);
    ASSERT_EQ(ws, 200) << want.dump();
    ASSERT_EQ(gs, 200) << got.dump();
    EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]);
    EXPECT_EQ(got["usage"], want["usage"]);
  }
  EXPECT_EQ(up.Stop(SIGTERM, 30s), 0) << up.output();
  for (pid_t pid : children) EXPECT_TRUE(WaitFor([&] { return Gone(pid); }, 10s)) << pid;
  EXPECT_TRUE(InstancesOnPorts(port, port + 8).empty());
  EXPECT_EQ(colocated.Stop(SIGTERM, 30s), 0);
  EXPECT_TRUE(InstancesOnPorts(port, port + 9).empty());
}

TEST(UpPlan, PlanOutForALocalCpuClusterStartsAsItIs) {
  const int port = PickPort();
  // A pdserve profile of the tiny model measured with 1 thread (made-up, fast coefficients).
  const std::string profile = testing::WriteTempFile(TempPath("profile.json"), R"({
    "format": "pdserve-profile-v1", "model": "tiny", "device": "cpu", "threads": 1,
    "tp": {"1": {"prefill": [0.5, 0.02, 1e-5], "decoding_smallbs": [0.8, 1e-4, 0.02],
                 "decoding_largebs": [0.8, 1e-4, 0.02], "decoding_large_small_bs_threshold": 95}}})");
  const std::string lengths =
      testing::WriteTempFile(TempPath("lengths.csv"), "prompt_len,output_len\n40,8\n100,16\n");
  const std::string plan = TempPath("plan_out.json");
  Process planner;
  ASSERT_TRUE(planner.Start({kBinary,
                             "plan",
                             "--model",
                             ModelDir(),
                             "--hardware",
                             "cpu",
                             "--profile",
                             profile,
                             "--lengths",
                             lengths,
                             "--nodes",
                             "1",
                             "--devices-per-node",
                             "2",
                             "--max-pp",
                             "1",
                             "--requests",
                             "20",
                             "--ttft",
                             "0.5",
                             "--tpot",
                             "0.05",
                             "--out",
                             plan}));
  ASSERT_EQ(planner.Wait(60s), 0) << planner.output();
  std::ifstream in(plan);
  const json written = json::parse(in, nullptr, false);
  ASSERT_FALSE(written.is_discarded()) << planner.output();
  for (const auto& inst : written["plan"]["instances"]) EXPECT_EQ(inst.value("threads", 0), 1);

  Process up;
  ASSERT_TRUE(StartAndWaitFor(up, UpPlanArgv(plan, port, {"--threads", "2"}),
                              "router (OpenAI API) on", 60s));
  EXPECT_NE(up.output().find("1 thread(s) per rank"), std::string::npos) << up.output();
  auto [status, body] = CompleteAt(kHost, port, PromptOf(20, 3), 4);
  EXPECT_EQ(status, 200) << body.dump();
  const std::vector<pid_t> children = ChildPids(up.output());
  EXPECT_EQ(up.Stop(SIGTERM, 30s), 0) << up.output();
  for (pid_t pid : children) EXPECT_TRUE(WaitFor([&] { return Gone(pid); }, 10s)) << pid;
  EXPECT_TRUE(InstancesOnPorts(port, port + 9).empty());
}

struct Refusal {
  std::string name;
  std::string contents;  // the plan file ("" : no file at all)
  std::string words;     // what the error must say
};

void PrintTo(const Refusal& r, std::ostream* os) { *os << r.name; }

class UpPlanRefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(UpPlanRefusalTest, ExitsNonzeroWithAClearErrorAndStartsNothing) {
  const Refusal& r = GetParam();
  const int port = PickPort();
  const std::string plan =
      r.contents.empty() ? TempPath("missing_plan.json") : WritePlan(r.name + ".json", r.contents);
  Process up;
  ASSERT_TRUE(up.Start(UpPlanArgv(plan, port, {})));
  const int code = up.Wait(30s);
  EXPECT_NE(code, 0) << up.output();
  EXPECT_NE(code, -1) << "up did not exit:\n" << up.output();
  EXPECT_NE(up.output().find(r.words), std::string::npos) << up.output();
  EXPECT_NE(up.output().find(plan), std::string::npos) << "the error names the file";
  EXPECT_EQ(up.output().find("(pid "), std::string::npos) << up.output();
  EXPECT_TRUE(InstancesOnPorts(port, port + 9).empty());
  for (int p = port; p < port + 3; ++p) EXPECT_TRUE(testing::PortIsFree(p)) << p;
}

json Inst(const std::string& role, int tp, int pp) {
  return {{"role", role}, {"count", 1}, {"tp", tp}, {"pp", pp}, {"threads", 1}};
}

std::string PlanText(const std::string& mode, const json& instances) {
  return json({{"format", "pdserve-plan-v1"}, {"plan", {{"mode", mode}, {"instances", instances}}}})
      .dump();
}

INSTANTIATE_TEST_SUITE_P(
    Plans, UpPlanRefusalTest,
    ::testing::Values(
        Refusal{"pipeline",
                PlanText("disaggregated", {Inst("prefill", 1, 2), Inst("decode", 1, 1)}),
                "pipeline parallelism"},
        Refusal{"colocated", PlanText("colocated", {Inst("colocated", 1, 1)}), "colocated"},
        Refusal{"malformed", "{\"format\": \"pdserve-plan-v1\", \"plan\": {", "not a JSON object"},
        Refusal{"missing", "", "missing_plan.json"}),
    [](const ::testing::TestParamInfo<Refusal>& i) { return i.param.name; });

}  // namespace
}  // namespace pd
