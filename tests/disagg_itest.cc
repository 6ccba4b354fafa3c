// Disaggregated serving with real processes and real libfabric (tcp;ofi_rxm over loopback):
//   - greedy output through `pdserve up` (1 prefill + 1 decode + router) is token-for-token the
//     colocated instance's, for prompts of 1 token to several pages, both layouts, page sizes
//     1/4/16, chunked and whole prefill;
//   - a handshake mismatch and a wrong cluster secret stop the decode instance with a clear error;
//   - kill -9 of a prefill instance: the request is retried on the other one (2 prefill
//     instances) or fails with a clear error (1), and the decode instance ends with every page
//     free;
//   - a client that goes away mid-stream frees the pages on both sides.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tests/disagg_process.h"

namespace pd {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using testing::Process;
using namespace std::chrono_literals;

const std::string kBinary = PDSERVE_BINARY;

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("pdserve_disagg_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

const std::string& ModelDir() {
  static const std::string dir = [] {
    std::string d = TempPath("model");
    Process p;
    EXPECT_TRUE(p.Start(
        {kBinary, "make-model", "--arch", "qwen3", "--preset", "tiny", "--seed", "5", "--out", d}));
    EXPECT_EQ(p.Wait(120s), 0) << p.output();
    return d;
  }();
  return dir;
}

std::string SecretFile(const std::string& name, const std::string& secret) {
  std::string path = TempPath(name);
  std::ofstream(path) << secret;
  return path;
}

// A port range unlikely to be in use: P..P+9 for one deployment.
int PickPort() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()));
  return 20000 + static_cast<int>(rng() % 3000) * 10;
}

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

double Metric(int port, const std::string& name) {
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/metrics");
  if (!r) return -1;
  size_t pos = r->body.find("\n" + name);
  if (pos == std::string::npos) return -1;
  size_t sp = r->body.find(' ', pos + 1);
  return std::atof(r->body.c_str() + sp + 1);
}

bool PagesFree(int port) {
  return WaitFor([&] { return Metric(port, "pdserve:kv_cache_usage_perc") == 0.0; }, 20s);
}

// Greedy completion of a token-id prompt; returns (HTTP status, body JSON).
std::pair<int, json> Complete(int port, const std::vector<int>& prompt, int max_tokens) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  json req = {{"model", "m"},
              {"prompt", prompt},
              {"max_tokens", max_tokens},
              {"temperature", 0.0},
              {"ignore_eos", true}};
  auto r = c.Post("/v1/completions", req.dump(), "application/json");
  if (!r) return {-1, json()};
  return {r->status, json::parse(r->body, nullptr, false)};
}

std::vector<int> PromptOf(int len, int salt) {
  std::vector<int> p(len);
  for (int i = 0; i < len; ++i) p[i] = 10 + (i * 37 + salt * 11) % 490;  // tiny: vocab 512
  return p;
}

std::vector<std::string> ServeArgs(int port, const std::vector<std::string>& extra) {
  std::vector<std::string> a = {kBinary,
                                "serve",
                                "--model",
                                ModelDir(),
                                "--port",
                                std::to_string(port),
                                "--threads",
                                "1",
                                "--max-model-len",
                                "256",
                                "--served-model-name",
                                "m"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// ------------------------------------------------------------------ golden through `pdserve up`

struct GoldenShape {
  std::string layout;
  int page_size;
  int budget;  // max-num-batched-tokens: below the prompt lengths, prefill is chunked
};

class DisaggGoldenTest : public ::testing::TestWithParam<GoldenShape> {};

TEST_P(DisaggGoldenTest, UpGivesTheColocatedGreedyTokens) {
  const GoldenShape s = GetParam();
  const int port = PickPort();
  const std::vector<std::string> shape = {"--kv-layout",
                                          s.layout,
                                          "--page-size",
                                          std::to_string(s.page_size),
                                          "--max-num-batched-tokens",
                                          std::to_string(s.budget),
                                          "--max-num-seqs",
                                          std::to_string(std::min(8, s.budget))};
  Process colocated;
  std::vector<std::string> cargs = ServeArgs(port + 9, shape);
  ASSERT_TRUE(colocated.Start(cargs));
  ASSERT_FALSE(colocated.WaitForLine("on http://", 120s).empty()) << colocated.output();

  Process up;
  std::vector<std::string> uargs = {kBinary,
                                    "up",
                                    "--model",
                                    ModelDir(),
                                    "--prefill",
                                    "1",
                                    "--decode",
                                    "1",
                                    "--port",
                                    std::to_string(port),
                                    "--threads",
                                    "1",
                                    "--max-model-len",
                                    "256",
                                    "--served-model-name",
                                    "m"};
  uargs.insert(uargs.end(), shape.begin(), shape.end());
  ASSERT_TRUE(up.Start(uargs));
  ASSERT_FALSE(up.WaitForLine("router (OpenAI API) on", 180s).empty()) << up.output();

  for (int len : {1, 2, 3, 4, 5, 15, 16, 17, 40}) {
    SCOPED_TRACE("prompt of " + std::to_string(len) + " tokens");
    auto prompt = PromptOf(len, len);
    auto [ws, want] = Complete(port + 9, prompt, 8);
    auto [gs, got] = Complete(port, prompt, 8);
    ASSERT_EQ(ws, 200) << want.dump();
    ASSERT_EQ(gs, 200) << got.dump();
    EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]);
    EXPECT_EQ(got["usage"], want["usage"]);
  }
  EXPECT_TRUE(PagesFree(port + 2));  // the decode instance
  EXPECT_TRUE(PagesFree(port + 1));  // the prefill instance
  EXPECT_GE(Metric(port + 1, "pdserve:kv_transfers_total{role=\"prefill\"}"), 8);
  EXPECT_EQ(up.Stop(SIGTERM, 30s), 0) << up.output();
  EXPECT_EQ(colocated.Stop(SIGTERM, 30s), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DisaggGoldenTest,
                         ::testing::Values(GoldenShape{"hnd", 16, 512}, GoldenShape{"nhd", 4, 7},
                                           GoldenShape{"hnd", 1, 6}),
                         [](const ::testing::TestParamInfo<GoldenShape>& i) {
                           return i.param.layout + "_page" + std::to_string(i.param.page_size) +
                                  "_budget" + std::to_string(i.param.budget);
                         });

TEST(DisaggUpTest, StopsEveryInstanceWhenOneDies) {
  const int port = PickPort();
  Process up;
  ASSERT_TRUE(up.Start({kBinary, "up", "--model", ModelDir(), "--port", std::to_string(port),
                        "--threads", "1", "--max-model-len", "256"}));
  std::string line = up.WaitForLine("prefill 0 on", 180s);
  ASSERT_FALSE(line.empty()) << up.output();
  ASSERT_FALSE(up.WaitForLine("router (OpenAI API) on", 60s).empty()) << up.output();
  pid_t prefill = std::atoi(line.substr(line.find("(pid ") + 5).c_str());
  ASSERT_GT(prefill, 0);
  kill(prefill, SIGKILL);
  EXPECT_EQ(up.Wait(60s), 1);
  EXPECT_THAT(up.output(), HasSubstr("prefill 0 (pid " + std::to_string(prefill) +
                                     ") was killed by signal 9: stopping every instance"));
}

// ------------------------------------------------------------------ handshake

TEST(DisaggHandshakeTest, AMismatchStopsTheDecodeInstanceWithTheReason) {
  const int port = PickPort();
  const std::string secret = SecretFile("secret_mm", "s3cret");
  Process prefill;
  ASSERT_TRUE(prefill.Start(ServeArgs(
      port + 1, {"--role", "prefill", "--page-size", "16", "--cluster-secret-file", secret})));
  ASSERT_FALSE(prefill.WaitForLine("prefill instance on", 120s).empty()) << prefill.output();
  Process decode;
  ASSERT_TRUE(decode.Start(
      ServeArgs(port + 2, {"--role", "decode", "--page-size", "8", "--cluster-secret-file", secret,
                           "--prefill-peers", "http://127.0.0.1:" + std::to_string(port + 1)})));
  EXPECT_EQ(decode.Wait(120s), 1);
  EXPECT_THAT(decode.output(), HasSubstr("refused the handshake"));
  EXPECT_THAT(decode.output(), HasSubstr("page_size: ours 16, theirs 8"));
  EXPECT_EQ(prefill.Stop(SIGTERM, 30s), 0);
}

TEST(DisaggHandshakeTest, AWrongClusterSecretIsRefused) {
  const int port = PickPort();
  Process prefill;
  ASSERT_TRUE(prefill.Start(ServeArgs(
      port + 1, {"--role", "prefill", "--cluster-secret-file", SecretFile("secret_a", "aaaa")})));
  ASSERT_FALSE(prefill.WaitForLine("prefill instance on", 120s).empty()) << prefill.output();
  Process decode;
  ASSERT_TRUE(decode.Start(ServeArgs(
      port + 2,
      {"--role", "decode", "--cluster-secret-file", SecretFile("secret_b", "bbbb"), "--peer-wait-s",
       "2", "--prefill-peers", "http://127.0.0.1:" + std::to_string(port + 1)})));
  EXPECT_EQ(decode.Wait(120s), 1);
  EXPECT_THAT(decode.output(), HasSubstr("cluster secret"));
  EXPECT_EQ(prefill.Stop(SIGTERM, 30s), 0);
  EXPECT_THAT(prefill.output(), HasSubstr("frame authentication failed"));
}

// ------------------------------------------------------------------ faults

// Prefill instances and one decode instance started one by one (`up` would stop them all).
class Deployment {
 public:
  Deployment(int num_prefill, int timeout_ms) : port_(PickPort()) {
    const std::string secret = SecretFile("secret_" + std::to_string(port_), "fault-secret");
    std::string peers;
    for (int i = 0; i < num_prefill; ++i) {
      prefill_.push_back(std::make_unique<Process>());
      EXPECT_TRUE(prefill_.back()->Start(
          ServeArgs(port_ + 1 + i, {"--role", "prefill", "--cluster-secret-file", secret})));
      EXPECT_FALSE(prefill_.back()->WaitForLine("prefill instance on", 120s).empty());
      peers += (i ? ",http://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(port_ + 1 + i);
    }
    EXPECT_TRUE(decode_.Start(ServeArgs(
        decode_port(), {"--role", "decode", "--cluster-secret-file", secret, "--prefill-peers",
                        peers, "--kv-transfer-timeout-ms", std::to_string(timeout_ms)})));
    EXPECT_FALSE(decode_.WaitForLine("on http://", 120s).empty()) << decode_.output();
  }
  int decode_port() const { return port_ + 8; }
  int prefill_port(int i) const { return port_ + 1 + i; }
  Process& prefill(int i) { return *prefill_[i]; }
  Process& decode() { return decode_; }

 private:
  int port_;
  std::vector<std::unique_ptr<Process>> prefill_;
  Process decode_;
};

TEST(DisaggFaultTest, AKilledPrefillInstanceIsReplacedByTheOther) {
  Deployment d(2, 3000);
  auto prompt = PromptOf(20, 1);
  auto [s0, before] = Complete(d.decode_port(), prompt, 6);
  ASSERT_EQ(s0, 200) << before.dump();
  kill(d.prefill(0).pid(), SIGKILL);  // the least loaded (and first) instance
  auto [s1, after] = Complete(d.decode_port(), prompt, 6);
  EXPECT_EQ(s1, 200) << after.dump();
  EXPECT_EQ(after["choices"][0]["text"], before["choices"][0]["text"]);
  EXPECT_TRUE(PagesFree(d.decode_port()));
  EXPECT_TRUE(PagesFree(d.prefill_port(1)));
  EXPECT_EQ(d.decode().Stop(SIGTERM, 30s), 0) << d.decode().output();
  EXPECT_THAT(d.decode().output(), HasSubstr("attempt 1 failed"));
  if (HasFailure())
    ADD_FAILURE() << d.decode().output() << "\n--- prefill 1:\n" << d.prefill(1).output();
}

TEST(DisaggFaultTest, AKilledLonePrefillInstanceFailsTheRequestClearly) {
  Deployment d(1, 1500);
  kill(d.prefill(0).pid(), SIGKILL);
  auto [status, body] = Complete(d.decode_port(), PromptOf(20, 2), 6);
  EXPECT_EQ(status, 500) << body.dump();
  EXPECT_THAT(body.dump(), HasSubstr("KV transfer failed"));
  EXPECT_TRUE(PagesFree(d.decode_port()));
  EXPECT_EQ(d.decode().Stop(SIGTERM, 30s), 0) << d.decode().output();
}

TEST(DisaggFaultTest, AClientThatGoesAwayFreesPagesOnBothSides) {
  Deployment d(1, 20000);
  for (int i = 0; i < 5; ++i) {
    httplib::Client c("127.0.0.1", d.decode_port());
    json req = {{"model", "m"},       {"prompt", PromptOf(60, i)}, {"max_tokens", 200},
                {"temperature", 0.0}, {"ignore_eos", true},        {"stream", true}};
    int chunks = 0;
    httplib::Request r;
    r.method = "POST";
    r.path = "/v1/completions";
    r.body = req.dump();
    r.headers.emplace("Content-Type", "application/json");
    r.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      return ++chunks < 1 + i;  // hang up after i chunks
    };
    httplib::Response res;
    httplib::Error err;
    c.send(r, res, err);
  }
  EXPECT_TRUE(PagesFree(d.decode_port()));
  EXPECT_TRUE(PagesFree(d.prefill_port(0)));
  EXPECT_TRUE(WaitFor(
      [&] {
        return Metric(d.prefill_port(0), "pdserve:kv_transfers_active{role=\"prefill\"}") == 0;
      },
      20s));
  EXPECT_EQ(d.decode().Stop(SIGTERM, 30s), 0) << d.decode().output();
  EXPECT_EQ(d.prefill(0).Stop(SIGTERM, 30s), 0) << d.prefill(0).output();
}

}  // namespace
}  // namespace pd
