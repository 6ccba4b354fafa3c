// The disaggregation golden test across two "hosts": the prefill instance in one network
// namespace, the decode instance and the HTTP client in another, joined by a veth pair; the
// fabric (tcp;ofi_rxm) and HTTP both go over the veth addresses. Greedy output must be
// token-for-token a colocated instance's (run in the test's own namespace) for prompts from 1
// token to several pages, page sizes 1 and 16, both layouts, chunked and whole prefill; and for
// deepseek_v3 (the latent KV) from a TP 2 prefill instance into a data-parallel decode instance,
// and from a data-parallel prefill instance into a TP 1 one.
//
// Needs root and `ip` (iproute2); otherwise every test skips and says why. The namespaces and the
// veth pair are deleted on every path (RAII, after the instances are stopped).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tests/disagg_process.h"
#include "tests/two_hosts.h"

namespace pd {
namespace {

using json = nlohmann::json;
using testing::CompleteAt;
using testing::MetricSum;
using testing::Process;
using testing::StartAndWaitFor;
using testing::TwoHosts;
using testing::WaitFor;
using namespace std::chrono_literals;

const std::string kBinary = PDSERVE_BINARY;

std::string TempPath(const std::string& name) {
  return testing::TempPathFor("pdserve_netns_", name);
}

// Removes the model and secret files when the binary ends.
[[maybe_unused]] const auto* const kTempCleanup =
    ::testing::AddGlobalTestEnvironment(new testing::TempPathCleanup("pdserve_netns_"));

// The `tiny` preset of `arch` (qwen3 or deepseek_v3; both have a vocabulary of 512).
const std::string& ModelDir(const std::string& arch) {
  static const std::string qwen3 = testing::MakeModel(kBinary, "tiny", 11, TempPath("model"));
  static const std::string deepseek =
      testing::MakeModel(kBinary, "tiny", 11, TempPath("model_mla"), "deepseek_v3");
  return arch == "deepseek_v3" ? deepseek : qwen3;
}

std::vector<int> PromptOf(int len, int salt) {
  std::vector<int> p(len);
  for (int i = 0; i < len; ++i) p[i] = 10 + (i * 29 + salt * 13) % 490;  // tiny: vocab 512
  return p;
}

struct Shape {
  std::string layout;
  int page_size;
  int budget;  // max-num-batched-tokens: below the longer prompts, prefill is chunked
  std::string arch = "qwen3";
  std::vector<std::string> prefill_extra = {};  // e.g. its --tensor-parallel-size
  std::vector<std::string> decode_extra = {};
};

std::vector<std::string> ServeArgs(const std::string& host, int port, const Shape& s,
                                   const std::vector<std::string>& extra,
                                   const std::vector<std::string>& role_extra = {}) {
  std::vector<std::string> a = {"--host", host};
  a.insert(a.end(), role_extra.begin(), role_extra.end());
  const std::vector<std::string> shape = testing::ShapeArgs(s.layout, s.page_size, s.budget);
  a.insert(a.end(), shape.begin(), shape.end());
  a.insert(a.end(), extra.begin(), extra.end());
  return testing::ServeArgv(kBinary, ModelDir(s.arch), port, 256, a);
}

class DisaggNetnsTest : public ::testing::TestWithParam<Shape> {};

TEST_P(DisaggNetnsTest, PrefillAndDecodeOnTwoHostsGiveTheColocatedGreedyTokens) {
  std::string why;
  std::unique_ptr<TwoHosts> hosts = TwoHosts::Create(&why);  // outlives the instances below
  if (!hosts) GTEST_SKIP() << "two-namespace golden test skipped: " << why;
  const Shape s = GetParam();
  std::mt19937 rng(static_cast<unsigned>(getpid()) + s.page_size * 31 + s.budget);
  const int port = testing::PickPortBlock(rng, 21000, 2000);
  const std::string secret = testing::WriteTempFile(TempPath("secret"), "netns-secret");

  Process colocated, prefill, decode;
  ASSERT_TRUE(colocated.Start(ServeArgs("127.0.0.1", port + 9, s, {})));
  ASSERT_TRUE(StartAndWaitFor(prefill,
                              hosts->InA(ServeArgs(hosts->addr_a(), port + 1, s,
                                                   {"--role", "prefill", "--cluster-secret-file",
                                                    secret, "--fabric-node", hosts->addr_a()},
                                                   s.prefill_extra)),
                              "prefill instance on", 120s));
  const std::string peer = "http://" + hosts->addr_a() + ":" + std::to_string(port + 1);
  ASSERT_TRUE(StartAndWaitFor(
      decode,
      hosts->InB(ServeArgs(hosts->addr_b(), port + 2, s,
                           {"--role", "decode", "--cluster-secret-file", secret, "--fabric-node",
                            hosts->addr_b(), "--prefill-peers", peer, "--kv-transfer-timeout-ms",
                            "20000", "--local-prefill-max-tokens", "-1"},
                           s.decode_extra)),
      "on http://", 120s));
  ASSERT_FALSE(colocated.WaitForLine("on http://", 120s).empty()) << colocated.output();

  const std::vector<int> lengths = {1, 2, 5, 16, 17, 40};
  std::vector<std::pair<int, json>> got(lengths.size());
  double prefill_transfers = -1, decode_usage = -1, prefill_usage = -1;
  ASSERT_TRUE(hosts->RunInB([&] {
    for (size_t i = 0; i < lengths.size(); ++i) {
      got[i] = CompleteAt(hosts->addr_b(), port + 2, PromptOf(lengths[i], i), 8, 60, true);
    }
    auto usage = [&](const std::string& host, int p) {
      double u = -1;
      WaitFor([&] { return (u = MetricSum(host, p, "pdserve:kv_cache_usage_perc")) == 0.0; }, 20s);
      return u;
    };
    decode_usage = usage(hosts->addr_b(), port + 2);
    prefill_usage = usage(hosts->addr_a(), port + 1);  // over the veth
    prefill_transfers =
        MetricSum(hosts->addr_a(), port + 1, "pdserve:kv_transfers_total", "role=\"prefill\"");
  }));
  for (size_t i = 0; i < lengths.size(); ++i) {
    SCOPED_TRACE("prompt of " + std::to_string(lengths[i]) + " tokens");
    auto [ws, want] = CompleteAt("127.0.0.1", port + 9, PromptOf(lengths[i], i), 8, 60, true);
    ASSERT_EQ(ws, 200) << want.dump();
    ASSERT_EQ(got[i].first, 200) << got[i].second.dump();
    testing::ExpectSameGreedyChoice(got[i].second, want);
    EXPECT_EQ(got[i].second["usage"], want["usage"]);
  }
  if (s.arch == "deepseek_v3") {  // the latent crossed as the shapes say
    EXPECT_NE(decode.output().find("replicated MLA latent"), std::string::npos);
    if (!s.decode_extra.empty()) {
      EXPECT_NE(decode.output().find("one region per data-parallel rank"), std::string::npos);
    }
  }
  EXPECT_EQ(decode_usage, 0.0);
  EXPECT_EQ(prefill_usage, 0.0);
  EXPECT_EQ(prefill_transfers, static_cast<double>(lengths.size() - 1));  // 1 token: no transfer
  EXPECT_EQ(decode.Stop(SIGTERM, 30s), 0);
  EXPECT_EQ(prefill.Stop(SIGTERM, 30s), 0);
  EXPECT_EQ(colocated.Stop(SIGTERM, 30s), 0);
  if (HasFailure()) ADD_FAILURE() << decode.output() << "\n--- prefill:\n" << prefill.output();
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DisaggNetnsTest,
    ::testing::Values(Shape{"hnd", 16, 512}, Shape{"nhd", 1, 6}, Shape{"nhd", 16, 7},
                      Shape{"hnd",
                            16,
                            7,
                            "deepseek_v3",
                            {"--tensor-parallel-size", "2"},
                            {"--data-parallel-size", "2"}},
                      Shape{"nhd", 1, 512, "deepseek_v3", {"--data-parallel-size", "2"}, {}}),
    [](const ::testing::TestParamInfo<Shape>& i) {
      std::string name = i.param.arch + "_" + i.param.layout + "_page" +
                         std::to_string(i.param.page_size) + "_budget" +
                         std::to_string(i.param.budget);
      for (const auto* extra : {&i.param.prefill_extra, &i.param.decode_extra})
        if (!extra->empty()) name += "_" + extra->front().substr(2, 1) + "p" + extra->back();
      return name;
    });

}  // namespace
}  // namespace pd
