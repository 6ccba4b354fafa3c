// Tensor-parallel instances across real processes: `pdserve up --prefill-tp A --decode-tp B`
// (1 prefill + 1 decode + router, each rank a thread) gives token-for-token the greedy output of a
// TP 1 colocated instance (logprobs within float rounding), with the KV moved by the shard plan
// between the instances' rank regions over libfabric (tcp;ofi_rxm on loopback). Also: the decode
// instance's transfers all succeed and every page comes back on both sides. For qwen3 (dense GQA),
// qwen3_moe (GQA, MoE) and deepseek_v3 (an MLA latent every rank holds whole, sent from one random
// source rank per destination rank), with page sizes 1, 4 and 16, chunked and whole prefill: a
// subset of the {1,2,4} x {1,2,4} pairings per model (messenger_mla_test runs every MLA pairing
// in-process).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

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

// The tiny preset of `arch`: 4 attention heads, 3 layers, 160 MLP columns (TP 1, 2 and 4 all
// split it); qwen3 and qwen3_moe have 2 KV heads of 32, deepseek_v3 a 36-value latent (28 + 8).
// dtype "fp8": the FP8 checkpoint (block-scaled weights), whose TP shards start inside blocks.
const std::string& ModelDir(const std::string& arch = "qwen3", const std::string& dtype = "bf16") {
  static std::map<std::string, std::string> dirs;
  const std::string key = arch + "_" + dtype;
  auto it = dirs.find(key);
  if (it != dirs.end()) return it->second;
  std::string d = TempPath("model_" + key);
  Process p;
  EXPECT_TRUE(p.Start({kBinary, "make-model", "--arch", arch, "--preset", "tiny", "--seed", "9",
                       "--dtype", dtype, "--out", d}));
  EXPECT_EQ(p.Wait(120s), 0) << p.output();
  return dirs.emplace(key, d).first->second;
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

// A greedy completion with each token's logprob.
std::pair<int, json> Complete(int port, const std::vector<int>& prompt, int max_tokens) {
  return testing::CompleteAt("127.0.0.1", port, prompt, max_tokens, 120, /*logprobs=*/true);
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
  std::string arch = "qwen3";
  int page_size = 4;
  int budget = 12;  // --max-num-batched-tokens: 12 chunks the longer prompts, 64 does not
  std::string kv_cache_dtype = "auto";
  std::string weights = "bf16";  // make-model --dtype: bf16 or fp8
};

// What the prefill messenger logs about the cache, and the bytes of one token's KV (every layer,
// one copy; 4, 2 or 1 byte per element for f32, bf16, fp8_e4m3): qwen3 tiny has 2 layers.
std::string CacheWords(const std::string& arch) {
  return arch == "deepseek_v3" ? "replicated MLA latent, latent_dim 36" : "2 KV heads";
}
double BytesPerToken(const TpShape& s) {
  const double elem = s.kv_cache_dtype == "bfloat16"                                ? 2
                      : s.kv_cache_dtype == "fp8_e4m3" || s.kv_cache_dtype == "fp8" ? 1
                                                                                    : 4;
  if (s.arch == "deepseek_v3") return 3 * 36 * elem;
  return (s.arch == "qwen3" ? 2 : 3) * 2 * 2 * 32 * elem;
}

class DisaggTpTest : public ::testing::TestWithParam<TpShape> {};

TEST_P(DisaggTpTest, UpGivesTheColocatedTp1GreedyTokens) {
  const TpShape s = GetParam();
  const int port = PickPort();
  const std::vector<std::string> common = {"--model",
                                           ModelDir(s.arch, s.weights),
                                           "--threads",
                                           "1",
                                           "--max-model-len",
                                           "256",
                                           "--served-model-name",
                                           "m",
                                           "--kv-layout",
                                           s.layout,
                                           "--page-size",
                                           std::to_string(s.page_size),
                                           "--max-num-batched-tokens",
                                           std::to_string(s.budget),
                                           "--max-num-seqs",
                                           "8",
                                           "--kv-cache-dtype",
                                           s.kv_cache_dtype};
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
  uargs.insert(uargs.end(), testing::kTransferEveryPrompt.begin(),
               testing::kTransferEveryPrompt.end());
  ASSERT_TRUE(up.Start(uargs));
  ASSERT_FALSE(up.WaitForLine("router (OpenAI API) on", 180s).empty()) << up.output();
  // Each instance registered one KV region per rank of its own TP.
  EXPECT_THAT(up.output(),
              HasSubstr("prefill messenger: " + std::to_string(s.prefill_tp) +
                        " rank KV region(s) registered (tp_size " + std::to_string(s.prefill_tp) +
                        ", " + CacheWords(s.arch) + ")"));
  EXPECT_THAT(up.output(),
              HasSubstr("decode messenger: " + std::to_string(s.decode_tp) +
                        " rank KV region(s) registered for each of 1 prefill "
                        "peer(s) (tp_size " +
                        std::to_string(s.decode_tp) + ", " + CacheWords(s.arch) + ")"));

  int transfers = 0, tokens = 0;
  double max_logprob_diff = 0;
  for (int len : {1, 3, 5, 16, 29}) {  // up to 8 pages of 4, prefilled in chunks of 12 tokens
    SCOPED_TRACE("prompt of " + std::to_string(len) + " tokens");
    auto prompt = PromptOf(len, len);
    auto [ws, want] = Complete(port + 9, prompt, 6);
    auto [gs, got] = Complete(port, prompt, 6);
    ASSERT_EQ(ws, 200) << want.dump();
    ASSERT_EQ(gs, 200) << got.dump() << up.output();
    const double tolerance = s.kv_cache_dtype == "bfloat16" ? testing::kBf16KvLogprobTolerance
                                                            : testing::kLogprobTolerance;
    max_logprob_diff =
        std::max(max_logprob_diff, testing::ExpectSameGreedyChoice(got, want, tolerance));
    EXPECT_EQ(got["usage"], want["usage"]);
    if (len > 1) ++transfers;
    tokens += len - 1;  // the last prompt token is the decode instance's
  }
  EXPECT_TRUE(PagesFree(port + 2));  // the decode instance
  EXPECT_TRUE(PagesFree(port + 1));  // the prefill instance
  // The prefill side counts a transfer once its last write's completion comes back, which can be
  // after the decode side has already answered: wait for the count, then compare.
  WaitFor(
      [&] {
        return Metric(port + 1, "pdserve:kv_transfers_total{role=\"prefill\"}") >= transfers &&
               Metric(port + 1, "pdserve:kv_transfer_tokens_total{role=\"prefill\"}") >= tokens;
      },
      20s);
  EXPECT_EQ(Metric(port + 1, "pdserve:kv_transfers_total{role=\"prefill\"}"), transfers);
  // KV bytes per token: one copy, and on the wire (whole pages; an MLA latent to every decode
  // rank), at least one copy per token and at most a page's padding more per transfer.
  EXPECT_EQ(Metric(port + 2, "pdserve:kv_transfer_bytes_per_token{role=\"decode\"}"),
            BytesPerToken(s));
  const double kv_bytes = Metric(port + 1, "pdserve:kv_transfer_kv_bytes_total{role=\"prefill\"}");
  EXPECT_EQ(Metric(port + 1, "pdserve:kv_transfer_tokens_total{role=\"prefill\"}"), tokens);
  // A decode rank holds the whole latent (MLA) or its KV heads; TP 4 over 2 heads: 2 replicas.
  const int copies = s.arch == "deepseek_v3" ? s.decode_tp : std::max(1, s.decode_tp / 2);
  EXPECT_GE(kv_bytes, BytesPerToken(s) * tokens * copies);
  EXPECT_LE(kv_bytes, BytesPerToken(s) * (tokens + transfers * (s.page_size - 1)) * copies);
  EXPECT_EQ(Metric(port + 2, "pdserve:kv_transfer_kv_bytes_total{role=\"decode\"}"), kv_bytes);
  std::printf(
      "%s prefill TP %d -> decode TP %d, page %d, %s: %.0f KV bytes per token one copy, "
      "%.1f on the wire, %.2f ms per transfer (mean), logprobs within %.2g of TP 1's\n",
      s.arch.c_str(), s.prefill_tp, s.decode_tp, s.page_size, s.kv_cache_dtype.c_str(),
      BytesPerToken(s), kv_bytes / tokens,
      1e3 * Metric(port + 2, "pdserve:kv_transfer_seconds_sum{role=\"decode\"}") / transfers,
      max_logprob_diff);
  EXPECT_EQ(up.Stop(SIGTERM, 30s), 0) << up.output();
  EXPECT_EQ(colocated.Stop(SIGTERM, 30s), 0);
}

// qwen3: a subset. qwen3_moe and deepseek_v3: every prefill TP {1,2,4} x decode TP {1,2,4},
// cycling page sizes 1 and 16, chunked (budget 12) and whole (budget 64) prefill, both layouts,
// and bfloat16 KV on one pairing in three. FP8 KV (TP 1 to 1, so that the colocated run computes
// the very K/V the prefill instance quantises): qwen3 beside bf16, whose bytes per token it halves
// (256 against 512), and the deepseek_v3 latent (108 bytes per token against bf16's 216). FP8
// weights: prefill TP 2 (the ranks' FP8 slices) to decode TP 1, against colocated TP 1.
std::vector<TpShape> Shapes() {
  std::vector<TpShape> v = {{2, 1, "hnd"},
                            {1, 2, "nhd"},
                            {4, 2, "nhd"},
                            {1, 1, "nhd", "qwen3", 4, 12, "bfloat16"},
                            {1, 1, "nhd", "qwen3", 4, 12, "fp8_e4m3"},
                            {1, 1, "hnd", "deepseek_v3", 4, 12, "fp8"},
                            {2, 1, "hnd", "qwen3", 4, 12, "auto", "fp8"},
                            {2, 1, "nhd", "deepseek_v3", 4, 12, "auto", "fp8"}};
  for (const char* arch : {"deepseek_v3", "qwen3_moe"}) {
    int k = 0;
    for (int p : {1, 2, 4}) {
      for (int d : {1, 2, 4}) {
        v.push_back({p, d, k % 2 == 0 ? "hnd" : "nhd", arch, k % 2 == 0 ? 1 : 16,
                     (k / 2) % 2 == 0 ? 12 : 64, k % 3 == 2 ? "bfloat16" : "auto"});
        ++k;
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Pairings, DisaggTpTest, ::testing::ValuesIn(Shapes()),
                         [](const ::testing::TestParamInfo<TpShape>& i) {
                           const TpShape& s = i.param;
                           return s.arch + "_prefill_tp" + std::to_string(s.prefill_tp) +
                                  "_decode_tp" + std::to_string(s.decode_tp) + "_" + s.layout +
                                  "_page" + std::to_string(s.page_size) + "_budget" +
                                  std::to_string(s.budget) +
                                  (s.kv_cache_dtype == "auto" ? "" : "_" + s.kv_cache_dtype) +
                                  (s.weights == "bf16" ? "" : "_" + s.weights + "_weights");
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

// serve --tensor-parallel-size 2 over an FP8 checkpoint answers with the greedy text of TP 1.
TEST(DisaggTpServeTest, Fp8ModelAtTp2AnswersAsTp1) {
  const int port = PickPort();
  std::vector<Process> servers(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(servers[i].Start({kBinary, "serve", "--model", ModelDir("qwen3_moe", "fp8"),
                                  "--port", std::to_string(port + i), "--served-model-name", "m",
                                  "--threads", "1", "--max-model-len", "256",
                                  "--tensor-parallel-size", std::to_string(i + 1)}));
    ASSERT_FALSE(servers[i].WaitForLine("on http://", 120s).empty()) << servers[i].output();
  }
  for (int len : {3, 17}) {
    auto [ws, want] = Complete(port, PromptOf(len, len), 8);
    auto [gs, got] = Complete(port + 1, PromptOf(len, len), 8);
    ASSERT_EQ(ws, 200) << want.dump();
    ASSERT_EQ(gs, 200) << got.dump() << servers[1].output();
    EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]) << "prompt of " << len;
    EXPECT_EQ(got["usage"]["completion_tokens"], 8);
  }
  for (Process& p : servers) EXPECT_EQ(p.Stop(SIGTERM, 30s), 0) << p.output();
}

}  // namespace
}  // namespace pd
