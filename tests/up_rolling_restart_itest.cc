// Graceful drain (server/drain.h) under `pdserve up`: under steady load through the router, every
// instance in turn gets SIGTERM, drains (deregisters, refuses new work with 503 + Retry-After,
// which the router or the decode instances send elsewhere; finishes what it holds), exits 0, and
// up starts it again. A rolling restart of every instance loses no request: each one is answered
// with all its tokens. Uses the demo model (models/demo-llama), 2 prefill + 2 decode instances.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/up_deployment.h"

namespace pd {
namespace {

using namespace std::chrono_literals;
using testing::Load;
using testing::UpDeployment;
using Clock = std::chrono::steady_clock;

const std::string kBinary = PDSERVE_BINARY;
const std::string kModel = PD_DEMO_MODEL_DIR;
const std::string kHost = testing::kUpHost;

// SIGTERM to `name`; waits for its clean exit, its restart and its rejoin. Prints the drain time.
void DrainAndRestart(UpDeployment& d, const std::string& name) {
  SCOPED_TRACE(name);
  const pid_t pid = d.pid(name);
  ASSERT_GT(pid, 0) << d.up().output();
  const size_t mark = d.up().output().size();
  const auto term = Clock::now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  ASSERT_TRUE(
      d.SeenAfter(mark, name + " (pid " + std::to_string(pid) + ") exited with status 0", 40s))
      << d.up().output().substr(mark);
  const auto exited = Clock::now();
  pid_t restarted = -1;
  ASSERT_TRUE(d.RestartedAndHealthy(mark, name, &restarted));
  // Rejoined before the next one goes: every decode instance accepted the restarted prefill
  // instance again, or the router has the restarted decode instance back.
  if (name.rfind("prefill", 0) == 0) {
    for (int j = 0; j < d.num_decode(); ++j) {
      const int port = d.port("decode " + std::to_string(j));
      EXPECT_TRUE(testing::WaitFor(
          [&] {
            return testing::MetricSum(kHost, port, "pdserve:kv_prefill_peers",
                                      "state=\"accepted\"") == 2;
          },
          20s))
          << "decode " << j << " did not accept " << name << " again";
    }
  } else {
    const double before = testing::MetricSum(kHost, d.port(name), "pdserve:request_success_total");
    EXPECT_TRUE(testing::WaitFor(
        [&] {
          return testing::MetricSum(kHost, d.port(name), "pdserve:request_success_total") >
                 std::max(0.0, before);
        },
        20s))
        << "the router did not use the restarted " << name;
  }
  std::printf("[ measured ] %s: SIGTERM -> drained and exited 0 in %.2f s\n", name.c_str(),
              std::chrono::duration<double>(exited - term).count());
}

TEST(UpRollingRestartTest, RestartingEveryInstanceInTurnUnderLoadLosesNoRequest) {
  UpDeployment d(kBinary, kModel, 2, 2, {"--drain-timeout-s", "20"});
  ASSERT_TRUE(d.started());
  Load load(d.router_port(), 3);
  ASSERT_TRUE(load.SucceedsAfter(Clock::now(), 30s));
  for (const std::string& name : d.names()) ASSERT_NO_FATAL_FAILURE(DrainAndRestart(d, name));
  ASSERT_TRUE(load.SucceedsAfter(Clock::now(), 20s));
  load.Stop();
  const std::vector<testing::Outcome> outcomes = load.outcomes();
  int ok = 0;
  for (const testing::Outcome& o : outcomes) {
    EXPECT_TRUE(o.tokens) << "a request was lost: status " << o.status << ": " << o.message;
    ok += o.tokens ? 1 : 0;
  }
  std::printf("[ measured ] rolling restart of 4 instances: %d of %zu requests answered whole\n",
              ok, outcomes.size());
  d.ExpectPagesFree();
  EXPECT_EQ(d.up().Stop(SIGTERM, 60s), 0);
  if (HasFailure()) ADD_FAILURE() << d.up().output();
}

}  // namespace
}  // namespace pd
