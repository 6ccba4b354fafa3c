// Test helpers (header-only) for the tests that drive `pdserve up` with the demo model under
// steady load: the deployment (its ports, the instances' pids read off its output, what it
// logged since a point), a load of greedy completions through the router with each request's
// outcome, and the check that every request got an answer.
#pragma once

#include <gtest/gtest.h>
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

namespace pd::testing {

using UpClock = std::chrono::steady_clock;

inline const std::string kUpHost = "127.0.0.1";
inline constexpr int kUpReadTimeoutS = 30;  // a request unanswered this long counts as hung
inline constexpr int kUpMaxTokens = 6;

inline int PickUpPort() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 7817u);
  return PickPortBlock(rng, 26000);
}

// One request's outcome: HTTP status (-1: no answer), and when it started and ended.
struct Outcome {
  int status = -1;
  bool tokens = false;      // 200 with kUpMaxTokens completion tokens
  bool error_body = false;  // not 200, with an OpenAI error object
  std::string message;      // the error object's message, when there is one
  UpClock::time_point start, end;
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
          o.start = UpClock::now();
          auto [status, body] =
              CompleteAt(kUpHost, port, PromptOf(24 + c, i), kUpMaxTokens, kUpReadTimeoutS);
          o.end = UpClock::now();
          o.status = status;
          o.tokens = status == 200 && body.is_object() &&
                     body["usage"].value("completion_tokens", 0) == kUpMaxTokens;
          o.error_body = status != 200 && body.is_object() && body.contains("error");
          if (o.error_body && body["error"].is_object())
            o.message = body["error"].value("message", std::string());
          {
            std::lock_guard<std::mutex> lock(mu_);
            outcomes_.push_back(o);
          }
          // A client's pause after an error (not a wait for anything): the instance that
          // restarts keeps its CPU rather than the clients spinning through fast 5xx answers.
          if (!o.tokens) std::this_thread::sleep_for(std::chrono::milliseconds(20));
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
  bool SucceedsAfter(UpClock::time_point t, std::chrono::milliseconds timeout) {
    return WaitFor(
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
  UpDeployment(const std::string& binary, const std::string& model, int num_prefill, int num_decode,
               const std::vector<std::string>& extra = {})
      : port_(PickUpPort()), num_prefill_(num_prefill), num_decode_(num_decode) {
    std::vector<std::string> args = {"--threads",       "1",   "--served-model-name", "m",
                                     "--max-model-len", "2048"};
    args.insert(args.end(), extra.begin(), extra.end());
    started_ = StartAndWaitFor(up_, UpArgv(binary, model, num_prefill, num_decode, port_, args),
                               "router (OpenAI API) on", std::chrono::seconds(120));
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
    return "http://" + kUpHost + ":" + std::to_string(port(name));
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
    return WaitFor(
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
  // After offset `from`: up's "restarted NAME (pid" line, then "NAME (pid P) is healthy again"
  // for the new pid P, which goes to *restarted; fails naming the line that did not come.
  ::testing::AssertionResult RestartedAndHealthy(size_t from, const std::string& name,
                                                 pid_t* restarted) {
    if (!SeenAfter(from, "restarted " + name + " (pid ", std::chrono::seconds(60))) {
      return ::testing::AssertionFailure() << "up did not restart " << name << ":\n"
                                           << up_.output().substr(from);
    }
    *restarted = pid(name);
    const std::string healthy = name + " (pid " + std::to_string(*restarted) + ") is healthy again";
    if (!SeenAfter(from, healthy, std::chrono::seconds(60))) {
      return ::testing::AssertionFailure() << "no \"" << healthy << "\":\n"
                                           << up_.output().substr(from);
    }
    return ::testing::AssertionSuccess();
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
      EXPECT_TRUE(PagesFreeAt(kUpHost, port(n), std::chrono::seconds(30))) << n << " keeps pages";
  }

 private:
  Process up_;
  int port_;
  int num_prefill_, num_decode_;
  ::testing::AssertionResult started_ = ::testing::AssertionFailure();
};
// Every request was answered (no hang): tokens, or an error in OpenAI's shape; prints counts.
inline void ExpectEveryRequestAnswered(const std::vector<Outcome>& outcomes) {
  int ok = 0, errors = 0;
  std::map<int, int> by_status;
  for (const Outcome& o : outcomes) {
    ++by_status[o.status];
    ASSERT_NE(o.status, -1) << "a request got no answer within " << kUpReadTimeoutS << " s";
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

}  // namespace pd::testing
