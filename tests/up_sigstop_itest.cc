// SIGSTOP / SIGCONT of each role under `pdserve up` (1 prefill + 1 decode, the demo model) with
// steady load through the router: while an instance (or up itself, which runs the router) is
// stopped, requests complete or fail with an error, none goes unanswered past its read timeout;
// after SIGCONT requests succeed again within 10 s, no instance was restarted (a stopped process
// is not dead), and every page on every instance is free.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "tests/up_deployment.h"

namespace pd {
namespace {

using ::testing::HasSubstr;
using testing::Load;
using testing::UpDeployment;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kBinary = PDSERVE_BINARY;
const std::string kModel = PD_DEMO_MODEL_DIR;

// How long each process stays stopped: longer than the prefill side's --peer-silence-s (2 s) and
// the decode side's send timeout (1 s), shorter than the transfer deadline given to up (5 s).
constexpr auto kStopped = 3s;

class UpSigstopTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UpSigstopTest, RequestsEndAndServiceResumesAfterCont) {
  const std::string role = GetParam();
  UpDeployment d(kBinary, kModel, 1, 1, {"--kv-transfer-timeout-ms", "5000"});
  ASSERT_TRUE(d.started());
  Load load(d.router_port(), 2);
  ASSERT_TRUE(load.SucceedsAfter(Clock::now(), 30s));
  const pid_t pid = role == "router" ? d.up().pid() : d.pid(role);
  ASSERT_GT(pid, 0);
  const size_t mark = d.up().output().size();
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  std::this_thread::sleep_for(kStopped);  // the fault's duration, not a wait for a condition
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  const auto resumed = Clock::now();
  EXPECT_TRUE(load.SucceedsAfter(resumed, 10s)) << "no request succeeded within 10 s of SIGCONT";
  const auto serving = Clock::now();
  load.Stop();
  std::printf("[ measured ] SIGSTOP %s for %.0f s: SIGCONT -> a request succeeded %.2f s\n",
              role.c_str(), std::chrono::duration<double>(kStopped).count(),
              std::chrono::duration<double>(serving - resumed).count());
  testing::ExpectEveryRequestAnswered(load.outcomes());
  EXPECT_THAT(d.up().output().substr(mark), ::testing::Not(HasSubstr("restarting it in")));
  d.ExpectPagesFree();
  EXPECT_EQ(d.up().Stop(SIGTERM, 30s), 0);
  if (HasFailure()) ADD_FAILURE() << d.up().output();
}

INSTANTIATE_TEST_SUITE_P(Roles, UpSigstopTest, ::testing::Values("prefill 0", "decode 0", "router"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           n.erase(std::remove(n.begin(), n.end(), ' '), n.end());
                           return n;
                         });

}  // namespace
}  // namespace pd
