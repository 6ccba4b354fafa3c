// Tensor-parallel instances across real processes: `pdserve up --prefill-tp A --decode-tp B`
// (1 prefill + 1 decode + router, each rank a thread) gives token-for-token the greedy output of a
// TP 1 colocated instance, with the KV moved by the shard plan between the instances' rank
// regions over libfabric (tcp;ofi_rxm on loopback). Also: the decode instance's transfers all
// succeed and every page comes back on both sides.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
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
          ("pdserve_disagg_tp_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// The tiny preset: 4 attention heads, 2 KV heads, 160 MLP columns (TP 1, 2 and 4 all split it).
const std::string& ModelDir() {
  static const std::string dir = [] {
    std::string d = TempPath("model");
    Process p;
    EXPECT_TRUE(p.Start(
        {kBinary, "make-model", "--arch", "qwen3", "--preset", "tiny", "--seed", "9", "--out", d}));
    EXPECT_EQ(p.Wait(120s), 0) << p.output();
    return d;
  }();
  return dir;
}

int PickPort() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 7u + 3u);
  return testing::PickPortBlock(rng, 23000);
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
  for (int i = 0; i < len; ++i) p[i] = 10 + (i * 41 + salt * 13) % 490;  // tiny: vocab 512
  return p;
}

struct TpShape {
  int prefill_tp;
  int decode_tp;
  std::string layout;
};

class DisaggTpTest : public ::testing::TestWithParam<TpShape> {};

TEST_P(DisaggTpTest, UpGivesTheColocatedTp1GreedyTokens) {
  const TpShape s = GetParam();
  const int port = PickPort();
  const std::vector<std::string> common = {"--model",
                                           ModelDir(),
                                           "--threads",
                                           "1",
                                           "--max-model-len",
                                           "256",
                                           "--served-model-name",
                                           "m",
                                           "--kv-layout",
                                           s.layout,
                                           "--page-size",
                                           "4",
                                           "--max-num-batched-tokens",
                                           "12",
                                           "--max-num-seqs",
                                           "8"};
  Process colocated;
  std::vector<std::string> cargs = {kBinary, "serve", "--port", std::to_string(port + 9)};
  cargs.insert(cargs.end(), common.begin(), common.end());
  ASSERT_TRUE(colocated.Start(cargs));
  ASSERT_FALSE(colocated.WaitForLine("on http://", 120s).empty()) << colocated.output();

  Process up;
  std::vector<std::string> uargs = {kBinary,        "up",
                                    "--prefill",    "1",
                                    "--decode",     "1",
                                    "--port",       std::to_string(port),
                                    "--prefill-tp", std::to_string(s.prefill_tp),
                                    "--decode-tp",  std::to_string(s.decode_tp)};
  uargs.insert(uargs.end(), common.begin(), common.end());
  ASSERT_TRUE(up.Start(uargs));
  ASSERT_FALSE(up.WaitForLine("router (OpenAI API) on", 180s).empty()) << up.output();
  // Each instance registered one KV region per rank of its own TP.
  EXPECT_THAT(up.output(), HasSubstr("prefill messenger: " + std::to_string(s.prefill_tp) +
                                     " rank KV region(s) registered (tp_size " +
                                     std::to_string(s.prefill_tp) + ", 2 KV heads)"));
  EXPECT_THAT(up.output(), HasSubstr("decode messenger: " + std::to_string(s.decode_tp) +
                                     " rank KV region(s) registered for each of 1 prefill "
                                     "peer(s) (tp_size " +
                                     std::to_string(s.decode_tp) + ", 2 KV heads)"));

  int transfers = 0;
  for (int len : {1, 3, 5, 16, 29}) {  // up to 8 pages, prefilled in chunks of 12 tokens
    SCOPED_TRACE("prompt of " + std::to_string(len) + " tokens");
    auto prompt = PromptOf(len, len);
    auto [ws, want] = Complete(port + 9, prompt, 6);
    auto [gs, got] = Complete(port, prompt, 6);
    ASSERT_EQ(ws, 200) << want.dump();
    ASSERT_EQ(gs, 200) << got.dump() << up.output();
    EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]);
    EXPECT_EQ(got["usage"], want["usage"]);
    if (len > 1) ++transfers;
  }
  EXPECT_TRUE(PagesFree(port + 2));  // the decode instance
  EXPECT_TRUE(PagesFree(port + 1));  // the prefill instance
  EXPECT_EQ(Metric(port + 1, "pdserve:kv_transfers_total{role=\"prefill\"}"), transfers);
  EXPECT_EQ(up.Stop(SIGTERM, 30s), 0) << up.output();
  EXPECT_EQ(colocated.Stop(SIGTERM, 30s), 0);
}

INSTANTIATE_TEST_SUITE_P(Pairings, DisaggTpTest,
                         ::testing::Values(TpShape{2, 1, "hnd"}, TpShape{1, 2, "nhd"},
                                           TpShape{4, 2, "nhd"}),
                         [](const ::testing::TestParamInfo<TpShape>& i) {
                           return "prefill_tp" + std::to_string(i.param.prefill_tp) + "_decode_tp" +
                                  std::to_string(i.param.decode_tp) + "_" + i.param.layout;
                         });

// serve --role prefill|decode accept --tensor-parallel-size (they refused it before the shard
// plan was wired in), and a TP the model cannot be split by is still refused with the numbers.
TEST(DisaggTpServeTest, ATpTheModelCannotSplitIsRefusedAtStart) {
  Process p;
  ASSERT_TRUE(p.Start({kBinary, "serve", "--model", ModelDir(), "--port",
                       std::to_string(PickPort()), "--role", "prefill", "--insecure-no-secret",
                       "--tensor-parallel-size", "3", "--threads", "1"}));
  EXPECT_NE(p.Wait(120s), 0);
  EXPECT_THAT(p.output(), HasSubstr("tensor_parallel_size 3"));
  EXPECT_THAT(p.output(), ::testing::Not(HasSubstr("not yet supported")));
}

}  // namespace
}  // namespace pd
