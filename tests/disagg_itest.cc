// Disaggregated serving with real processes and real libfabric (tcp;ofi_rxm over loopback):
//   - greedy output through `pdserve up` (1 prefill + 1 decode + router) is token-for-token the
//     colocated instance's, for prompts of 1 token to several pages, both layouts, page sizes
//     1/4/16, chunked and whole prefill;
//   - a handshake mismatch (KV format, speculative config) and a wrong cluster secret stop the
//     decode instance with a clear error;
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
using testing::CompleteAt;
using ::testing::HasSubstr;
using testing::MetricSum;
using testing::Process;
using testing::PromptOf;
using testing::StartAndWaitFor;
using testing::WaitFor;
using namespace std::chrono_literals;

const std::string kBinary = PDSERVE_BINARY;
const std::string kHost = "127.0.0.1";

std::string TempPath(const std::string& name) {
  return testing::TempPathFor("pdserve_disagg_", name);
}

const std::string& ModelDir() {
  static const std::string dir = testing::MakeModel(kBinary, "tiny", 5, TempPath("model"));
  return dir;
}

std::string SecretFile(const std::string& name, const std::string& secret) {
  return testing::WriteTempFile(TempPath(name), secret);
}

// A port range unlikely to be in use: P..P+9 for one deployment.
int PickPort() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()));
  return testing::PickPortBlock(rng, 20000);
}

double Metric(int port, const std::string& name, const std::string& labels = "") {
  return MetricSum(kHost, port, name, labels);
}

bool PagesFree(int port) { return testing::PagesFreeAt(kHost, port, 20s); }

// Greedy completion of a token-id prompt; returns (HTTP status, body JSON).
std::pair<int, json> Complete(int port, const std::vector<int>& prompt, int max_tokens) {
  return CompleteAt(kHost, port, prompt, max_tokens);
}

std::vector<std::string> ServeArgs(int port, const std::vector<std::string>& extra) {
  return testing::ServeArgv(kBinary, ModelDir(), port, 256, extra);
}

// ------------------------------------------------------------------ golden through `pdserve up`

struct GoldenShape {
  std::string layout;
  int page_size;
  int budget;  // max-num-batched-tokens: below the prompt lengths, prefill is chunked
  std::string provider = "tcp;ofi_rxm";  // up --fabric-provider
};

class DisaggGoldenTest : public ::testing::TestWithParam<GoldenShape> {};

TEST_P(DisaggGoldenTest, UpGivesTheColocatedGreedyTokens) {
  const GoldenShape s = GetParam();
  const int port = PickPort();
  const std::vector<std::string> shape = testing::ShapeArgs(s.layout, s.page_size, s.budget);
  Process colocated;
  std::vector<std::string> cargs = ServeArgs(port + 9, shape);
  ASSERT_TRUE(StartAndWaitFor(colocated, cargs, "on http://", 120s));

  Process up;
  std::vector<std::string> uargs =
      testing::UpArgv(kBinary, ModelDir(), 1, 1, port,
                      {"--threads", "1", "--max-model-len", "256", "--served-model-name", "m",
                       "--fabric-provider", s.provider});
  uargs.insert(uargs.end(), shape.begin(), shape.end());
  ASSERT_TRUE(StartAndWaitFor(up, uargs, "router (OpenAI API) on", 180s));

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
  EXPECT_GE(Metric(port + 1, "pdserve:kv_transfers_total", "role=\"prefill\""), 8);
  EXPECT_EQ(up.Stop(SIGTERM, 30s), 0) << up.output();
  EXPECT_EQ(colocated.Stop(SIGTERM, 30s), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DisaggGoldenTest,
                         ::testing::Values(GoldenShape{"hnd", 16, 512}, GoldenShape{"nhd", 4, 7},
                                           GoldenShape{"hnd", 1, 6},
                                           GoldenShape{"hnd", 16, 7, "shm"}),
                         [](const ::testing::TestParamInfo<GoldenShape>& i) {
                           return i.param.layout + "_page" + std::to_string(i.param.page_size) +
                                  "_budget" + std::to_string(i.param.budget) +
                                  (i.param.provider == "shm" ? "_shm" : "");
                         });

// A prompt whose ids need several control messages gives the colocated greedy tokens, across
// processes: the prefill instance receives messages of 4 KiB at most (the default is 256 KiB) and
// says so in the handshake, so the decode instance (default limit) must cut the prompt to fit.
TEST(DisaggLongPromptTest, APromptOfManyControlMessagesGivesTheColocatedTokens) {
  const int port = PickPort();
  constexpr int kLen = 2500, kMaxModelLen = 3072;  // 2499 ids and 157 page ids: 3 messages
  Process colocated;
  ASSERT_TRUE(StartAndWaitFor(colocated,
                              testing::ServeArgv(kBinary, ModelDir(), port + 9, kMaxModelLen, {}),
                              "on http://", 120s));
  const std::string secret = SecretFile("secret_long", "long-secret");
  std::vector<std::string> role = {
      "--role", "prefill", "--cluster-secret-file", secret, "--control-message-bytes", "4096"};
  Process prefill;
  ASSERT_TRUE(StartAndWaitFor(prefill,
                              testing::ServeArgv(kBinary, ModelDir(), port + 1, kMaxModelLen, role),
                              "prefill instance on", 120s));
  role = {"--role", "decode",          "--cluster-secret-file",
          secret,   "--prefill-peers", "http://127.0.0.1:" + std::to_string(port + 1)};
  role.insert(role.end(), testing::kTransferEveryPrompt.begin(),
              testing::kTransferEveryPrompt.end());
  Process decode;
  ASSERT_TRUE(StartAndWaitFor(decode,
                              testing::ServeArgv(kBinary, ModelDir(), port + 2, kMaxModelLen, role),
                              "on http://", 120s));
  const auto prompt = PromptOf(kLen, 3);
  auto [ws, want] = Complete(port + 9, prompt, 6);
  auto [gs, got] = Complete(port + 2, prompt, 6);
  ASSERT_EQ(ws, 200) << want.dump();
  ASSERT_EQ(gs, 200) << got.dump() << decode.output();
  EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]);
  EXPECT_EQ(got["usage"], want["usage"]);
  EXPECT_EQ(Metric(port + 1, "pdserve:kv_transfers_total", "role=\"prefill\""), 1);
  EXPECT_TRUE(PagesFree(port + 2));
  EXPECT_TRUE(PagesFree(port + 1));
  EXPECT_EQ(decode.Stop(SIGTERM, 30s), 0);
  EXPECT_EQ(prefill.Stop(SIGTERM, 30s), 0);
  EXPECT_EQ(colocated.Stop(SIGTERM, 30s), 0);
}

// The pid on one of up's "NAME on URL (pid N)" lines; -1 if none.
pid_t PidOnLine(const std::string& line) {
  const size_t at = line.find("(pid ");
  return at == std::string::npos ? -1 : std::atoi(line.c_str() + at + 5);
}

// Each thread of a process: its name and its Cpus_allowed_list, from /proc.
std::vector<std::pair<std::string, std::string>> ThreadCpus(pid_t pid) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(dir)) {
    std::ifstream comm(task.path() / "comm"), status(task.path() / "status");
    std::string name, line, cpus;
    std::getline(comm, name);
    while (std::getline(status, line)) {
      if (line.rfind("Cpus_allowed_list:", 0) == 0)
        cpus = line.substr(line.find_first_not_of(" \t", 18));
    }
    out.emplace_back(name, cpus);
  }
  return out;
}

std::string CpusOfThread(pid_t pid, const std::string& name) {
  for (const auto& [n, cpus] : ThreadCpus(pid))
    if (n == name) return cpus;
  return "(no thread " + name + ")";
}

// --pin-cores: instance k's model thread on CPU k; every instance's fabric, KV messenger and HTTP
// threads on --io-cpus: by default (auto) the CPUs no prefill instance computes on (CPUs 1..n-1
// with one prefill instance), every CPU with --io-cpus any.
class DisaggPinCoresTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DisaggPinCoresTest, PinsTheModelThreadsToTheirCoreAndIoThreadsToIoCpus) {
  const unsigned ncpu = std::thread::hardware_concurrency();
  const std::string all = ThreadCpus(getpid()).front().second;  // this test is not pinned
  const bool any = GetParam() == "any";
  const std::string all_but_0 =
      ncpu == 1 ? all : (ncpu == 2 ? "1" : "1-" + std::to_string(ncpu - 1));
  const std::string io = any ? all : all_but_0;
  const int port = PickPort();
  Process up;
  ASSERT_TRUE(up.Start({kBinary, "up", "--model", ModelDir(), "--port", std::to_string(port),
                        "--threads", "1", "--max-model-len", "256", "--pin-cores",
                        "--served-model-name", "m", "--io-cpus", GetParam()}));
  const pid_t prefill = PidOnLine(up.WaitForLine("prefill 0 on", 180s));
  const pid_t decode = PidOnLine(up.WaitForLine("decode 0 on", 60s));
  ASSERT_FALSE(up.WaitForLine("router (OpenAI API) on", 60s).empty()) << up.output();
  ASSERT_GT(prefill, 0);
  ASSERT_GT(decode, 0);
  EXPECT_EQ(CpusOfThread(prefill, "pd-engine"), "0");
  EXPECT_EQ(CpusOfThread(decode, "pd-engine"), ncpu > 1 ? "1" : "0");
  for (pid_t pid : {prefill, decode}) EXPECT_EQ(CpusOfThread(pid, "pd-fabric"), io) << pid;
  EXPECT_EQ(CpusOfThread(decode, "pd-http"), io);
  EXPECT_EQ(CpusOfThread(prefill, "pd-prefill-kv"), io);
  EXPECT_EQ(CpusOfThread(decode, "pd-decode-kv"), io);
  EXPECT_EQ(CpusOfThread(up.pid(), "pd-http"), io);  // the router's
  auto [code, body] = Complete(port, {1, 2, 3}, 4);
  EXPECT_EQ(code, 200) << body.dump();
  EXPECT_EQ(up.Stop(SIGTERM, 60s), 0) << up.output();
}

INSTANTIATE_TEST_SUITE_P(IoCpus, DisaggPinCoresTest, ::testing::Values("auto", "any"));

TEST(DisaggUpTest, UpRefusesABadIoCpuList) {
  Process up;
  ASSERT_TRUE(up.Start({kBinary, "up", "--model", ModelDir(), "--port", std::to_string(PickPort()),
                        "--pin-cores", "--io-cpus", "3-1"}));
  EXPECT_EQ(up.Wait(60s), 2);
  EXPECT_THAT(up.output(), HasSubstr("up: --io-cpus: ")) << up.output();
}

TEST(DisaggUpTest, UpAndServeRefuseANegativeKvWaitWarmPeriod) {
  Process up;
  ASSERT_TRUE(up.Start({kBinary, "up", "--model", ModelDir(), "--port", std::to_string(PickPort()),
                        "--kv-wait-warm-ms", "-1"}));
  EXPECT_EQ(up.Wait(60s), 2);
  EXPECT_THAT(up.output(), HasSubstr("up: --kv-wait-warm-ms must be >= 0")) << up.output();
  Process serve;
  ASSERT_TRUE(serve.Start(ServeArgs(PickPort(), {"--kv-wait-warm-ms", "-0.5"})));
  EXPECT_EQ(serve.Wait(120s), 1);
  EXPECT_THAT(serve.output(), HasSubstr("--kv-wait-warm-ms must be >= 0")) << serve.output();
}

TEST(DisaggUpTest, UpAndServeRefuseAnIdlePollOutOfRange) {
  for (const char* bad : {"-5", "60000001"}) {
    Process up;
    ASSERT_TRUE(up.Start({kBinary, "up", "--model", ModelDir(), "--port",
                          std::to_string(PickPort()), "--idle-poll-us", bad}));
    EXPECT_EQ(up.Wait(60s), 2) << bad;
    EXPECT_THAT(up.output(), HasSubstr("--idle-poll-us must be in [0, 60000000]")) << up.output();
    Process serve;
    ASSERT_TRUE(serve.Start(ServeArgs(PickPort(), {"--idle-poll-us", bad})));
    EXPECT_NE(serve.Wait(120s), 0) << bad;
    EXPECT_THAT(serve.output(), HasSubstr("--idle-poll-us must be in [0, 60000000]"))
        << serve.output();
  }
}

// --pin-whole-instances: every thread of instance k on CPU k.
TEST(DisaggUpTest, PinWholeInstancesPinsEveryThread) {
  const unsigned ncpu = std::thread::hardware_concurrency();
  const int port = PickPort();
  Process up;
  ASSERT_TRUE(up.Start({kBinary, "up", "--model", ModelDir(), "--port", std::to_string(port),
                        "--threads", "1", "--max-model-len", "256", "--pin-whole-instances",
                        "--served-model-name", "m"}));
  const pid_t prefill = PidOnLine(up.WaitForLine("prefill 0 on", 180s));
  const pid_t decode = PidOnLine(up.WaitForLine("decode 0 on", 60s));
  ASSERT_FALSE(up.WaitForLine("router (OpenAI API) on", 60s).empty()) << up.output();
  ASSERT_GT(prefill, 0);
  ASSERT_GT(decode, 0);
  const std::string decode_cpu = ncpu > 1 ? "1" : "0";
  for (const auto& [name, cpus] : ThreadCpus(prefill)) EXPECT_EQ(cpus, "0") << name;
  for (const auto& [name, cpus] : ThreadCpus(decode)) EXPECT_EQ(cpus, decode_cpu) << name;
  auto [code, body] = Complete(port, {1, 2, 3}, 4);
  EXPECT_EQ(code, 200) << body.dump();
  EXPECT_EQ(up.Stop(SIGTERM, 60s), 0) << up.output();
}

TEST(DisaggUpTest, ServeRefusesABadComputeOrIoCpuList) {
  for (const std::string flag : {"--compute-cpus", "--io-cpus"}) {
    for (const char* bad : {"x", "3-1", "4096", "1023"}) {
      Process serve;
      ASSERT_TRUE(serve.Start(ServeArgs(PickPort(), {flag, bad})));
      EXPECT_EQ(serve.Wait(120s), 1) << flag << " " << bad;
      EXPECT_THAT(serve.output(), HasSubstr("serve: " + flag + ": ")) << serve.output();
    }
  }
}

// ------------------------------------------------------------------ handshake

TEST(DisaggHandshakeTest, AMismatchStopsTheDecodeInstanceWithTheReason) {
  const int port = PickPort();
  const std::string secret = SecretFile("secret_mm", "s3cret");
  Process prefill;
  ASSERT_TRUE(StartAndWaitFor(prefill,
                              ServeArgs(port + 1, {"--role", "prefill", "--page-size", "16",
                                                   "--cluster-secret-file", secret}),
                              "prefill instance on", 120s));
  Process decode;
  ASSERT_TRUE(decode.Start(
      ServeArgs(port + 2, {"--role", "decode", "--page-size", "8", "--cluster-secret-file", secret,
                           "--prefill-peers", "http://127.0.0.1:" + std::to_string(port + 1)})));
  EXPECT_EQ(decode.Wait(120s), 1);
  EXPECT_THAT(decode.output(), HasSubstr("refused the handshake"));
  EXPECT_THAT(decode.output(), HasSubstr("page_size: ours 16, theirs 8"));
  EXPECT_EQ(prefill.Stop(SIGTERM, 30s), 0);
}

// Both roles must run the same speculative decoding (--speculative-config: method and K): a
// decode instance without it is refused by a prefill instance with it; both name
// speculative_config with both values.
TEST(DisaggHandshakeTest, ASpeculativeConfigMismatchIsRefusedOnBothSides) {
  const int port = PickPort();
  const std::string secret = SecretFile("secret_spec", "s3cret");
  Process prefill;
  ASSERT_TRUE(StartAndWaitFor(
      prefill,
      ServeArgs(port + 1,
                {"--role", "prefill", "--cluster-secret-file", secret, "--speculative-config",
                 R"({"method":"ngram","num_speculative_tokens":3})"}),
      "prefill instance on", 120s));
  Process decode;
  ASSERT_TRUE(decode.Start(
      ServeArgs(port + 2, {"--role", "decode", "--cluster-secret-file", secret, "--prefill-peers",
                           "http://127.0.0.1:" + std::to_string(port + 1)})));
  EXPECT_EQ(decode.Wait(120s), 1);
  EXPECT_THAT(decode.output(), HasSubstr("refused the handshake"));
  EXPECT_THAT(decode.output(), HasSubstr("speculative_config: ours ngram k=3, theirs off"));
  EXPECT_THAT(prefill.output(), HasSubstr("speculative_config: ours ngram k=3, theirs off"));
  EXPECT_EQ(prefill.Stop(SIGTERM, 30s), 0);
}

TEST(DisaggHandshakeTest, AWrongClusterSecretIsRefused) {
  const int port = PickPort();
  Process prefill;
  ASSERT_TRUE(StartAndWaitFor(prefill,
                              ServeArgs(port + 1, {"--role", "prefill", "--cluster-secret-file",
                                                   SecretFile("secret_a", "aaaa")}),
                              "prefill instance on", 120s));
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

// serve --role refuses to start without a cluster secret, naming the flag; --insecure-no-secret
// runs without one only while the fabric endpoint is on loopback.
TEST(DisaggHandshakeTest, ARoleWithoutASecretIsRefusedUnlessInsecureOnLoopback) {
  const int port = PickPort();
  for (const char* role : {"prefill", "decode"}) {
    SCOPED_TRACE(role);
    std::vector<std::string> flags = {"--role", role};
    if (std::string(role) == "decode") {
      flags.insert(flags.end(), {"--prefill-peers", "http://127.0.0.1:1"});
    }
    Process p;
    ASSERT_TRUE(p.Start(ServeArgs(port + 1, flags)));
    EXPECT_EQ(p.Wait(120s), 1);
    EXPECT_THAT(p.output(), HasSubstr("needs --cluster-secret-file"));
    EXPECT_THAT(p.output(), HasSubstr("--insecure-no-secret"));
    flags.insert(flags.end(), {"--insecure-no-secret", "--fabric-node", "0.0.0.0"});
    Process open;
    ASSERT_TRUE(open.Start(ServeArgs(port + 1, flags)));
    EXPECT_EQ(open.Wait(120s), 1);
    EXPECT_THAT(open.output(), HasSubstr("only allowed with the fabric endpoint on loopback"));
  }
  Process loopback;
  ASSERT_TRUE(StartAndWaitFor(loopback,
                              ServeArgs(port + 1, {"--role", "prefill", "--insecure-no-secret",
                                                   "--fabric-node", "127.0.0.1"}),
                              "prefill instance on", 120s));
  EXPECT_EQ(loopback.Stop(SIGTERM, 30s), 0);
  EXPECT_THAT(loopback.output(), HasSubstr("checked for integrity only"));
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
      EXPECT_TRUE(StartAndWaitFor(
          *prefill_.back(),
          ServeArgs(port_ + 1 + i, {"--role", "prefill", "--cluster-secret-file", secret}),
          "prefill instance on", 120s));
      peers += (i ? ",http://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(port_ + 1 + i);
    }
    EXPECT_TRUE(StartAndWaitFor(
        decode_,
        ServeArgs(decode_port(), {"--role", "decode", "--cluster-secret-file", secret,
                                  "--prefill-peers", peers, "--kv-transfer-timeout-ms",
                                  std::to_string(timeout_ms), "--local-prefill-max-tokens", "-1"}),
        "on http://", 120s));
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
        return Metric(d.prefill_port(0), "pdserve:kv_transfers_active", "role=\"prefill\"") == 0;
      },
      20s));
  EXPECT_EQ(d.decode().Stop(SIGTERM, 30s), 0) << d.decode().output();
  EXPECT_EQ(d.prefill(0).Stop(SIGTERM, 30s), 0) << d.prefill(0).output();
}

}  // namespace
}  // namespace pd
