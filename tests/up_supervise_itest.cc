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

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/disagg_process.h"

namespace pd {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using testing::Process;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kBinary = PDSERVE_BINARY;
const std::string kModel = PD_DEMO_MODEL_DIR;
const std::string kHost = "127.0.0.1";
constexpr int kReadTimeoutS = 30;  // a request unanswered this long counts as hung
constexpr int kMaxTokens = 6;

int PickPort() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 7817u);
  return testing::PickPortBlock(rng, 26000);
}

// One request's outcome: HTTP status (-1: no answer), and when it started and ended.
struct Outcome {
  int status = -1;
  bool tokens = false;      // 200 with kMaxTokens completion tokens
  bool error_body = false;  // not 200, with an OpenAI error object
  Clock::time_point start, end;
};

// Steady load: `clients` threads, each sending greedy completions through the router one after
// another until Stop.
class Load {
 public:
  Load(int port, int clients) {
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([this, port, c] {
        for (int i = 0; !stop_.load(); ++i) {
          Outcome o;
          o.start = Clock::now();
          auto [status, body] = testing::CompleteAt(kHost, port, testing::PromptOf(24 + c, i),
                                                    kMaxTokens, kReadTimeoutS);
          o.end = Clock::now();
          o.status = status;
          o.tokens = status == 200 && body.is_object() &&
                     body["usage"].value("completion_tokens", 0) == kMaxTokens;
          o.error_body = status != 200 && body.is_object() && body.contains("error");
          {
            std::lock_guard<std::mutex> lock(mu_);
            outcomes_.push_back(o);
          }
          // A client's pause after an error (not a wait for anything): the instance that
          // restarts keeps its CPU rather than the clients spinning through fast 5xx answers.
          if (!o.tokens) std::this_thread::sleep_for(20ms);
        }
      });
    }
  }
  ~Load() { Stop(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }
  std::vector<Outcome> outcomes() {
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_;
  }
  // Whether a request that started at or after `t` succeeded, within `timeout`.
  bool SucceedsAfter(Clock::time_point t, std::chrono::milliseconds timeout) {
    return testing::WaitFor(
        [&] {
          std::lock_guard<std::mutex> lock(mu_);
          for (const Outcome& o : outcomes_)
            if (o.start >= t && o.tokens) return true;
          return false;
        },
        timeout);
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Outcome> outcomes_;
  std::vector<std::thread> threads_;
};

// `pdserve up` with the demo model; the instances' pids read off its "NAME on URL (pid N)" lines.
class UpDeployment {
 public:
  UpDeployment(int num_prefill, int num_decode, const std::vector<std::string>& extra = {})
      : port_(PickPort()), num_prefill_(num_prefill), num_decode_(num_decode) {
    std::vector<std::string> args = {"--threads",       "1",   "--served-model-name", "m",
                                     "--max-model-len", "2048"};
    args.insert(args.end(), extra.begin(), extra.end());
    started_ = testing::StartAndWaitFor(
        up_, testing::UpArgv(kBinary, kModel, num_prefill, num_decode, port_, args),
        "router (OpenAI API) on", 120s);
  }
  ::testing::AssertionResult started() const { return started_; }
  Process& up() { return up_; }
  int router_port() const { return port_; }
  int num_decode() const { return num_decode_; }
  int port(const std::string& name) const {  // "prefill 1" -> P+2, "decode 0" -> P+1+N
    const int k = std::atoi(name.c_str() + name.find(' ') + 1);
    return port_ + 1 + (name.rfind("prefill", 0) == 0 ? k : num_prefill_ + k);
  }
  std::string url(const std::string& name) const {
    return "http://" + kHost + ":" + std::to_string(port(name));
  }
  // The pid up printed last for `name` (at start or on a restart); -1 if none.
  pid_t pid(const std::string& name) {
    const std::string& out = up_.output();
    size_t best = std::string::npos;
    for (const std::string& prefix : {name + " on http", "restarted " + name + " (pid "}) {
      const size_t at = out.rfind(prefix);
      if (at != std::string::npos && (best == std::string::npos || at > best)) best = at;
    }
    const size_t p = best == std::string::npos ? best : out.find("(pid ", best);
    return p == std::string::npos ? -1 : std::atoi(out.c_str() + p + 5);
  }
  // Waits until `needle` appears in up's output after offset `from`; false after `timeout`.
  bool SeenAfter(size_t from, const std::string& needle, std::chrono::milliseconds timeout,
                 int times = 1) {
    return testing::WaitFor(
        [&] {
          const std::string& out = up_.output();
          int n = 0;
          for (size_t at = out.find(needle, from); at != std::string::npos;
               at = out.find(needle, at + 1))
            ++n;
          return n >= times;
        },
        timeout);
  }
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (int i = 0; i < num_prefill_; ++i) n.push_back("prefill " + std::to_string(i));
    for (int j = 0; j < num_decode_; ++j) n.push_back("decode " + std::to_string(j));
    return n;
  }
  // Every page on every instance free within 30 s.
  void ExpectPagesFree() {
    for (const std::string& n : names())
      EXPECT_TRUE(testing::PagesFreeAt(kHost, port(n), 30s)) << n << " keeps pages";
  }

 private:
  Process up_;
  int port_;
  int num_prefill_, num_decode_;
  ::testing::AssertionResult started_ = ::testing::AssertionFailure();
};

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
  ASSERT_TRUE(d.SeenAfter(mark, "restarted " + name + " (pid ", 60s))
      << d.up().output().substr(mark);
  const pid_t restarted = d.pid(name);
  EXPECT_NE(restarted, pid);
  ASSERT_TRUE(
      d.SeenAfter(mark, name + " (pid " + std::to_string(restarted) + ") is healthy again", 60s))
      << d.up().output().substr(mark);
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
  for (const Outcome& o : load.outcomes()) {
    if (o.start < killed || o.start > rejoined) continue;
    ++(o.tokens ? ok : failed);
  }
  std::printf(
      "[ measured ] %s: kill -9 -> healthy again %.2f s, healthy -> rejoined and serving "
      "%.2f s; meanwhile %d requests with tokens, %d errors\n",
      name.c_str(), std::chrono::duration<double>(healthy - killed).count(),
      std::chrono::duration<double>(rejoined - healthy).count(), ok, failed);
}

// Every request was answered (no hang): tokens, or an error in OpenAI's shape; prints counts.
void ExpectEveryRequestAnswered(const std::vector<Outcome>& outcomes) {
  int ok = 0, errors = 0;
  std::map<int, int> by_status;
  for (const Outcome& o : outcomes) {
    ++by_status[o.status];
    ASSERT_NE(o.status, -1) << "a request got no answer within " << kReadTimeoutS << " s";
    if (o.tokens) {
      ++ok;
    } else {
      ++errors;
      EXPECT_TRUE(o.error_body) << "status " << o.status << " without an error object";
    }
  }
  std::string statuses;
  for (const auto& [status, n] : by_status)
    statuses += " " + std::to_string(status) + ":" + std::to_string(n);
  std::printf("[ measured ] %zu requests: %d with tokens, %d errors (by status:%s)\n",
              outcomes.size(), ok, errors, statuses.c_str());
  EXPECT_GT(ok, 0);
}

TEST(UpSuperviseTest, TwoByTwoSurvivesKillOfEachInstanceUnderLoad) {
  UpDeployment d(2, 2);
  ASSERT_TRUE(d.started());
  Load load(d.router_port(), 4);
  ASSERT_TRUE(load.SucceedsAfter(Clock::now(), 30s));
  for (const std::string& name : d.names()) {
    ASSERT_NO_FATAL_FAILURE(KillAndExpectRecovery(d, load, name));
  }
  load.Stop();
  ExpectEveryRequestAnswered(load.outcomes());
  d.ExpectPagesFree();
  EXPECT_EQ(d.up().Stop(SIGTERM, 30s), 0);
  EXPECT_THAT(d.up().output(), HasSubstr("pdserve up: stopped"));
  if (HasFailure()) ADD_FAILURE() << d.up().output();
}

TEST(UpSuperviseTest, OneByOneFailsCleanlyWhileAnInstanceIsDownAndServesOnceBack) {
  UpDeployment d(1, 1);
  ASSERT_TRUE(d.started());
  Load load(d.router_port(), 2);
  ASSERT_TRUE(load.SucceedsAfter(Clock::now(), 30s));
  for (const std::string& name : d.names()) {
    ASSERT_NO_FATAL_FAILURE(KillAndExpectRecovery(d, load, name));
  }
  load.Stop();
  ExpectEveryRequestAnswered(load.outcomes());
  d.ExpectPagesFree();
  EXPECT_EQ(d.up().Stop(SIGTERM, 30s), 0);
  if (HasFailure()) ADD_FAILURE() << d.up().output();
}

// A streaming request whose decode instance dies after its first chunk: the router ends the
// stream with an error event (not a hang), and the restarted instance serves the next one.
TEST(UpSuperviseTest, DecodeKilledMidStreamEndsTheStreamWithAnError) {
  UpDeployment d(1, 1);
  ASSERT_TRUE(d.started());
  httplib::Client c(kHost, d.router_port());
  c.set_read_timeout(kReadTimeoutS, 0);
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
  UpDeployment d(1, 1, {"--on-failure", "stop"});
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
