// `pdserve up` supervises its instances (deploy/supervisor.h): under steady load through the
// router, kill -9 of any one instance (the router is never killed) leaves every request answered
// (tokens, or an error in OpenAI's shape; none unanswered within its read timeout), up logs the
// death with its signal and restarts the instance, the restarted instance rejoins (the decode
// instances greet a restarted prefill instance at its new fabric endpoint; the router sends to a
// restarted decode instance again) and requests succeed again within 10 s of the restart. After
// each deployment every page on every instance is free (kv usage on each /metrics) and up stops
// cleanly on SIGTERM. Uses the demo model (models/demo-llama).
//   - 2 prefill + 2 decode instances: each one killed in turn;
//   - 1 prefill + 1 decode: each killed; requests fail with an error while it is down and succeed
//     once it is back;
//   - a decode instance killed mid-stream: the client gets an SSE error event and a clean end;
//   - --on-failure stop: the first death stops every instance (exit 1, the cause named).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/up_deployment.h"

namespace pd {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using testing::Process;
using namespace std::chrono_literals;
using testing::ExpectEveryRequestAnswered;
using testing::Load;
using testing::UpDeployment;
using Clock = std::chrono::steady_clock;

const std::string kBinary = PDSERVE_BINARY;
const std::string kModel = PD_DEMO_MODEL_DIR;
const std::string kHost = testing::kUpHost;

double DecodeSuccesses(const UpDeployment& d, const std::string& decode) {
  return testing::MetricSum(kHost, d.port(decode), "pdserve:request_success_total");
}

// Kills `name` with SIGKILL under load and checks up's account of it, the restart and the
// rejoin; prints the measured times.
void KillAndExpectRecovery(UpDeployment& d, Load& load, const std::string& name) {
  SCOPED_TRACE(name);
  const pid_t pid = d.pid(name);
  ASSERT_GT(pid, 0) << d.up().output();
  const size_t mark = d.up().output().size();
  const auto killed = Clock::now();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE(d.SeenAfter(mark,
                          name + " (pid " + std::to_string(pid) +
                              ") was killed by signal 9 (SIGKILL); restarting it in",
                          20s))
      << d.up().output().substr(mark);
  pid_t restarted = -1;
  ASSERT_TRUE(d.RestartedAndHealthy(mark, name, &restarted));
  EXPECT_NE(restarted, pid);
  const auto healthy = Clock::now();
  // Rejoined: every decode instance greeted the restarted prefill instance at its new endpoint,
  // or the router sent requests to the restarted decode instance.
  if (name.rfind("prefill", 0) == 0) {
    const std::string accepted = "prefill instance " + d.url(name) + " ('";
    EXPECT_TRUE(d.SeenAfter(mark, accepted, 10s, d.num_decode()))
        << "not every decode instance greeted " << name << " again:\n"
        << d.up().output().substr(mark);
  } else {
    EXPECT_TRUE(testing::WaitFor([&] { return DecodeSuccesses(d, name) > 0; }, 10s))
        << "the router did not use the restarted " << name;
  }
  EXPECT_TRUE(load.SucceedsAfter(healthy, 10s))
      << "no request succeeded within 10 s of the restart";
  const auto rejoined = Clock::now();
  int ok = 0, failed = 0;  // requests that started between the kill and the rejoin
  for (const testing::Outcome& o : load.outcomes()) {
    if (o.start < killed || o.start > rejoined) continue;
    ++(o.tokens ? ok : failed);
  }
  std::printf(
      "[ measured ] %s: kill -9 -> healthy again %.2f s, healthy -> rejoined and serving "
      "%.2f s; meanwhile %d requests with tokens, %d errors\n",
      name.c_str(), std::chrono::duration<double>(healthy - killed).count(),
      std::chrono::duration<double>(rejoined - healthy).count(), ok, failed);
}

// Under `clients` clients of steady load, kills every instance of `d` in turn and expects each
// back; then every request had an answer, every page is free and `up` stops cleanly.
void KillEachInstanceUnderLoad(UpDeployment& d, int clients) {
  ASSERT_TRUE(d.started());
  Load load(d.router_port(), clients);
  ASSERT_TRUE(load.SucceedsAfter(Clock::now(), 30s));
  for (const std::string& name : d.names()) {
    ASSERT_NO_FATAL_FAILURE(KillAndExpectRecovery(d, load, name));
  }
  load.Stop();
  ExpectEveryRequestAnswered(load.outcomes());
  d.ExpectPagesFree();
  EXPECT_EQ(d.up().Stop(SIGTERM, 30s), 0);
}

TEST(UpSuperviseTest, TwoByTwoSurvivesKillOfEachInstanceUnderLoad) {
  UpDeployment d(kBinary, kModel, 2, 2);
  KillEachInstanceUnderLoad(d, 4);
  EXPECT_THAT(d.up().output(), HasSubstr("pdserve up: stopped"));
  if (HasFailure()) ADD_FAILURE() << d.up().output();
}

TEST(UpSuperviseTest, OneByOneFailsCleanlyWhileAnInstanceIsDownAndServesOnceBack) {
  UpDeployment d(kBinary, kModel, 1, 1);
  KillEachInstanceUnderLoad(d, 2);
  if (HasFailure()) ADD_FAILURE() << d.up().output();
}

// A streaming request whose decode instance dies after its first chunk: the router ends the
// stream with an error event (not a hang), and the restarted instance serves the next one.
TEST(UpSuperviseTest, DecodeKilledMidStreamEndsTheStreamWithAnError) {
  UpDeployment d(kBinary, kModel, 1, 1);
  ASSERT_TRUE(d.started());
  httplib::Client c(kHost, d.router_port());
  c.set_read_timeout(testing::kUpReadTimeoutS, 0);
  const json req = {{"model", "m"},       {"prompt", testing::PromptOf(16, 1)},
                    {"max_tokens", 2000}, {"temperature", 0.0},
                    {"ignore_eos", true}, {"stream", true}};
  std::string body;
  int chunks = 0;
  const pid_t decode = d.pid("decode 0");
  ASSERT_GT(decode, 0);
  httplib::Request r;
  r.method = "POST";
  r.path = "/v1/completions";
  r.body = req.dump();
  r.headers.emplace("Content-Type", "application/json");
  r.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    body.append(data, n);
    if (++chunks == 2) kill(decode, SIGKILL);  // 1998 tokens still to come
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = c.send(r, res, err);
  ASSERT_TRUE(sent) << "the stream did not end cleanly: " << httplib::to_string(err);
  EXPECT_EQ(res.status, 200);
  EXPECT_THAT(body, HasSubstr("\"error\""));
  EXPECT_THAT(body, ::testing::Not(HasSubstr("[DONE]")));
  ASSERT_GE(chunks, 2);
  ASSERT_TRUE(d.SeenAfter(0, ") is healthy again", 60s)) << d.up().output();
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        return testing::CompleteAt(kHost, d.router_port(), testing::PromptOf(16, 2), 4, 30).first ==
               200;
      },
      10s));
  d.ExpectPagesFree();
  EXPECT_EQ(d.up().Stop(SIGTERM, 30s), 0);
  if (HasFailure()) ADD_FAILURE() << d.up().output();
}

TEST(UpSuperviseTest, OnFailureStopStopsEveryInstanceAtTheFirstDeath) {
  UpDeployment d(kBinary, kModel, 1, 1, {"--on-failure", "stop"});
  ASSERT_TRUE(d.started());
  const pid_t prefill = d.pid("prefill 0");
  ASSERT_GT(prefill, 0);
  kill(prefill, SIGKILL);
  EXPECT_EQ(d.up().Wait(60s), 1);
  EXPECT_THAT(d.up().output(),
              HasSubstr("prefill 0 (pid " + std::to_string(prefill) +
                        ") was killed by signal 9 (SIGKILL): stopping every instance "
                        "(--on-failure stop)"));
  // Nothing answers on the decode instance's port any more.
  httplib::Client c(kHost, d.port("decode 0"));
  c.set_connection_timeout(1, 0);
  EXPECT_FALSE(c.Get("/health"));
}

}  // namespace
}  // namespace pd
