// Data-parallel instances of deepseek_v3 across real processes: `pdserve up --prefill-tp A
// --decode-dp B` and `--prefill-dp 2` (1 prefill + 1 decode + router; each DP rank its own
// requests, scheduler and latent pages, the MoE layers expert-parallel over the ranks) give the
// greedy tokens and logprobs of a colocated TP 1 instance, the latent written from one prefill
// rank (a DP prefill instance: the request's own) into the chosen decode rank's pages over
// libfabric (tcp;ofi_rxm on loopback), for page sizes 1 and 16, chunked and whole prefill, prompts
// sent concurrently so that every rank holds requests. Decode TP pairings are
// here too, for the logprobs (disagg_tp_itest.cc compares their tokens over every pairing).
// Faults: a DP decode instance killed while its requests are in prefill leaves every page of the
// prefill instance free, and streams aborted at random points (some mid-transfer) through `up
// --decode-dp 2 --prefill-dp 1|2` leave every page of every DP rank of both instances free.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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
using testing::MetricSum;
using testing::Process;
using testing::StartAndWaitFor;
using testing::WaitFor;
using namespace std::chrono_literals;

const std::string kBinary = PDSERVE_BINARY;
const std::string kHost = "127.0.0.1";
const std::string kPrefillRole = "role=\"prefill\"";
const std::string kDecodeRole = "role=\"decode\"";
std::string TempPath(const std::string& name) { return testing::TempPathFor("pdserve_dp_", name); }

[[maybe_unused]] const auto* const kTempCleanup =
    ::testing::AddGlobalTestEnvironment(new testing::TempPathCleanup("pdserve_dp_"));

// deepseek_v3 `tiny` (3 layers, 8 experts, a 36-value latent, vocab 512) for the goldens; `small`
// (4 layers, hidden 256, vocab 2048) for the faults, whose prefills must take long enough for a
// kill or an abort to land while transfers are in flight.
const std::string& ModelDir(const std::string& preset) {
  static const std::string tiny =
      testing::MakeModel(kBinary, "tiny", 9, TempPath("tiny"), "deepseek_v3");
  if (preset == "tiny") return tiny;
  static const std::string small =
      testing::MakeModel(kBinary, "small", 7, TempPath("small"), "deepseek_v3");
  return small;
}

int PickPort() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 7351u + 11u);
  return testing::PickPortBlock(rng, 23000);
}

double Metric(int port, const std::string& name, const std::string& labels = "") {
  return MetricSum(kHost, port, name, labels);
}
bool PagesFree(int port) { return testing::PagesFreeAt(kHost, port, 30s); }

// A greedy completion with each token's logprob; (HTTP status or -1, body).
std::pair<int, json> CompleteWithLogprobs(int port, const std::vector<int>& prompt,
                                          int max_tokens) {
  return testing::CompleteAt(kHost, port, prompt, max_tokens, 120, /*logprobs=*/true);
}

struct DpShape {
  int prefill_tp;
  int decode_tp;
  int decode_dp;
  int page_size;
  int budget;  // --max-num-batched-tokens: 12 chunks the longer prompts, 64 does not
  int prefill_dp = 1;
};

std::string ShapeName(const DpShape& s) {
  return std::string("prefill_") +
         (s.prefill_dp > 1 ? "dp" + std::to_string(s.prefill_dp)
                           : "tp" + std::to_string(s.prefill_tp)) +
         "_decode_" +
         (s.decode_dp > 1 ? "dp" + std::to_string(s.decode_dp)
                          : "tp" + std::to_string(s.decode_tp)) +
         "_page" + std::to_string(s.page_size) + "_budget" + std::to_string(s.budget);
}

class UpDpTest : public ::testing::TestWithParam<DpShape> {};

TEST_P(UpDpTest, GreedyTokensAndLogprobsEqualAColocatedTp1Instance) {
  const DpShape s = GetParam();
  const int port = PickPort();
  const std::vector<std::string> shape =
      testing::ShapeArgs(s.page_size % 2 == 0 ? "hnd" : "nhd", s.page_size, s.budget);
  const std::vector<std::string> common = {"--threads",           "1", "--max-model-len", "256",
                                           "--served-model-name", "m"};
  Process colocated;
  std::vector<std::string> cargs = {kBinary,          "serve",  "--model",
                                    ModelDir("tiny"), "--port", std::to_string(port + 9)};
  cargs.insert(cargs.end(), common.begin(), common.end());
  cargs.insert(cargs.end(), shape.begin(), shape.end());
  ASSERT_TRUE(StartAndWaitFor(colocated, cargs, "on http://", 120s));

  std::vector<std::string> extra = {
      "--prefill-tp", std::to_string(s.prefill_tp), "--decode-tp",  std::to_string(s.decode_tp),
      "--decode-dp",  std::to_string(s.decode_dp),  "--prefill-dp", std::to_string(s.prefill_dp)};
  extra.insert(extra.end(), common.begin(), common.end());
  extra.insert(extra.end(), shape.begin(), shape.end());
  Process up;
  ASSERT_TRUE(StartAndWaitFor(up, testing::UpArgv(kBinary, ModelDir("tiny"), 1, 1, port, extra),
                              "router (OpenAI API) on", 180s));
  // The decode instance registered one region per DP rank (or TP rank).
  EXPECT_THAT(up.output(),
              HasSubstr("decode messenger: " + std::to_string(s.decode_dp * s.decode_tp) +
                        " rank KV region(s) registered for each of 1 prefill peer(s) (tp_size " +
                        std::to_string(s.decode_tp) + ", replicated MLA latent, latent_dim 36)"));
  if (s.decode_dp > 1) {
    EXPECT_THAT(up.output(), HasSubstr("one region per data-parallel rank"));
  }
  if (s.prefill_dp > 1) {  // one region per DP rank, sent from as a TP 1 instance
    EXPECT_THAT(up.output(),
                HasSubstr("prefill messenger: " + std::to_string(s.prefill_dp) +
                          " rank KV region(s) registered (tp_size 1, replicated MLA latent"));
  }

  // Sent concurrently, so that the decode instance deals them over its DP ranks.
  const std::vector<int> lengths = {1, 3, 16, 29, 40, 7};
  std::vector<std::pair<int, json>> got(lengths.size());
  {
    std::vector<std::thread> clients;
    for (size_t i = 0; i < lengths.size(); ++i)
      clients.emplace_back([&, i] {
        got[i] = CompleteWithLogprobs(port, testing::PromptOf(lengths[i], int(i)), 6);
      });
    for (std::thread& t : clients) t.join();
  }
  int transfers = 0;
  double max_logprob_diff = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    SCOPED_TRACE("prompt of " + std::to_string(lengths[i]) + " tokens");
    auto [ws, want] = CompleteWithLogprobs(port + 9, testing::PromptOf(lengths[i], int(i)), 6);
    ASSERT_EQ(ws, 200) << want.dump();
    ASSERT_EQ(got[i].first, 200) << got[i].second.dump() << up.output();
    max_logprob_diff =
        std::max(max_logprob_diff, testing::ExpectSameGreedyChoice(got[i].second, want));
    EXPECT_EQ(got[i].second["usage"], want["usage"]);
    if (lengths[i] > 1) ++transfers;
  }
  EXPECT_TRUE(PagesFree(port + 2));  // every DP rank of the decode instance
  EXPECT_TRUE(PagesFree(port + 1));  // the prefill instance
  EXPECT_TRUE(WaitFor(
      [&] {
        return Metric(port + 2, "pdserve:kv_transfers_total", kDecodeRole) == transfers &&
               Metric(port + 1, "pdserve:kv_transfers_total", kPrefillRole) == transfers;
      },
      20s))
      << Metric(port + 2, "pdserve:kv_transfers_total", kDecodeRole) << " of " << transfers;
  // A DP instance takes one copy of the latent per request (its rank's pages alone); TP ranks
  // each take one.
  const double bytes_per_token = 3 * 36 * 4;  // 3 layers of a 36-float latent
  int tokens = 0;
  for (int len : lengths) tokens += len - 1;  // the last prompt token is the decode instance's
  const double kv_bytes = Metric(port + 2, "pdserve:kv_transfer_kv_bytes_total", kDecodeRole);
  EXPECT_GE(kv_bytes, bytes_per_token * tokens * s.decode_tp);
  EXPECT_LE(kv_bytes, bytes_per_token * (tokens + transfers * (s.page_size - 1)) * s.decode_tp);
  std::printf(
      "deepseek_v3 tiny, prefill %s %d -> decode %s %d, page %d: %.1f KV bytes per token on the "
      "wire (one copy %.0f), %.2f ms per transfer (mean), logprobs within %.2g of TP 1's\n",
      s.prefill_dp > 1 ? "DP" : "TP", s.prefill_dp > 1 ? s.prefill_dp : s.prefill_tp,
      s.decode_dp > 1 ? "DP" : "TP", s.decode_dp > 1 ? s.decode_dp : s.decode_tp, s.page_size,
      kv_bytes / tokens, bytes_per_token,
      1e3 * Metric(port + 2, "pdserve:kv_transfer_seconds_sum", kDecodeRole) / transfers,
      max_logprob_diff);
  EXPECT_EQ(up.Stop(SIGTERM, 30s), 0) << up.output();
  EXPECT_EQ(colocated.Stop(SIGTERM, 30s), 0);
}

// Prefill TP {1, 2, 4} against decode DP {2, 4} and TP {1, 2}, and prefill DP 2 against decode
// TP {1, 2} and DP 2, cycling page sizes 1 and 16 and chunked (12) and whole (64) prefill.
INSTANTIATE_TEST_SUITE_P(Pairings, UpDpTest,
                         ::testing::Values(DpShape{1, 1, 2, 1, 12}, DpShape{2, 1, 2, 16, 64},
                                           DpShape{1, 1, 4, 16, 12}, DpShape{2, 1, 4, 1, 64},
                                           DpShape{4, 1, 2, 16, 12}, DpShape{2, 1, 1, 1, 12},
                                           DpShape{1, 2, 1, 16, 64}, DpShape{1, 1, 1, 1, 12, 2},
                                           DpShape{1, 1, 2, 16, 64, 2}, DpShape{1, 2, 1, 16, 12, 2},
                                           DpShape{4, 1, 4, 1, 64}, DpShape{1, 4, 1, 1, 64, 2},
                                           DpShape{1, 1, 4, 16, 12, 2}),
                         [](const ::testing::TestParamInfo<DpShape>& i) {
                           return ShapeName(i.param);
                         });

// ------------------------------------------------------------------ faults

// Runs `n` greedy completions of prompts of `len` tokens concurrently, each ending how it ends.
class Burst {
 public:
  Burst(int port, int n, int len, int max_tokens) {
    for (int i = 0; i < n; ++i)
      threads_.emplace_back([port, i, len, max_tokens] {
        (void)testing::CompleteAt(kHost, port, testing::PromptOf(len, i, 1990), max_tokens, 90);
      });
  }
  ~Burst() {
    for (std::thread& t : threads_) t.join();
  }

 private:
  std::vector<std::thread> threads_;
};

// A DP decode instance killed (-9) while its requests are in prefill or mid-transfer: the prefill
// instance cancels them and frees every page; a new DP decode instance is then served.
TEST(UpDpFaultTest, DpDecodeKilledMidRunLeavesThePrefillInstanceFree) {
  const int port = PickPort();
  const std::string secret = testing::WriteTempFile(TempPath("secret"), "dp-fault-secret");
  const std::string peers = "http://127.0.0.1:" + std::to_string(port + 1);
  auto serve = [&](int p, const std::vector<std::string>& role) {
    return testing::ServeArgv(kBinary, ModelDir("small"), p, 512, role);
  };
  const std::vector<std::string> decode_role = {"--role",
                                                "decode",
                                                "--cluster-secret-file",
                                                secret,
                                                "--prefill-peers",
                                                peers,
                                                "--kv-transfer-timeout-ms",
                                                "20000",
                                                "--data-parallel-size",
                                                "2"};
  Process prefill, decode;
  ASSERT_TRUE(
      StartAndWaitFor(prefill,
                      serve(port + 1, {"--role", "prefill", "--cluster-secret-file", secret,
                                       "--max-num-seqs", "1", "--max-num-batched-tokens", "16"}),
                      "prefill instance on", 120s));
  ASSERT_TRUE(StartAndWaitFor(decode, serve(port + 8, decode_role), "on http://", 120s));
  {
    Burst burst(port + 8, 6, 240, 4);
    ASSERT_TRUE(WaitFor(
        [&] { return Metric(port + 1, "pdserve:kv_transfers_active", kPrefillRole) >= 3; }, 60s))
        << prefill.output();
    kill(decode.pid(), SIGKILL);
    EXPECT_EQ(decode.Wait(30s), 128 + SIGKILL);
  }  // the clients see their connections close
  EXPECT_TRUE(WaitFor(
      [&] { return Metric(port + 1, "pdserve:kv_transfers_active", kPrefillRole) == 0; }, 60s))
      << prefill.output();
  EXPECT_TRUE(PagesFree(port + 1));
  EXPECT_GE(Metric(port + 1, "pdserve:kv_transfer_failures_total", kPrefillRole), 1);
  EXPECT_EQ(Metric(port + 1, "pdserve:num_requests_running"), 0);

  Process decode2;
  ASSERT_TRUE(StartAndWaitFor(decode2, serve(port + 7, decode_role), "on http://", 120s));
  auto [status, body] = testing::CompleteAt(kHost, port + 7, testing::PromptOf(100, 3, 1990), 4);
  EXPECT_EQ(status, 200) << body.dump();
  EXPECT_TRUE(PagesFree(port + 7));
  EXPECT_TRUE(PagesFree(port + 1));
  EXPECT_EQ(decode2.Stop(SIGTERM, 30s), 0);
  EXPECT_EQ(prefill.Stop(SIGTERM, 30s), 0);
  if (HasFailure()) ADD_FAILURE() << prefill.output();
}

// Streams abandoned by their clients at seeded random points (while in prefill, mid-transfer or
// while decoding) through `up --decode-dp 2` (and `--prefill-dp 1|2`): every page of every DP rank
// of both instances comes back, no transfer is left active, and later requests are served whole.
class UpDpAbortTest : public ::testing::TestWithParam<int> {};

TEST_P(UpDpAbortTest, StreamsAbortedAtRandomPointsLeaveEveryDpRankFree) {
  const int port = PickPort();
  Process up;
  ASSERT_TRUE(StartAndWaitFor(
      up,
      testing::UpArgv(kBinary, ModelDir("small"), 1, 1, port,
                      {"--threads", "1", "--max-model-len", "512", "--served-model-name", "m",
                       "--max-num-batched-tokens", "64", "--decode-dp", "2", "--prefill-dp",
                       std::to_string(GetParam())}),
      "router (OpenAI API) on", 180s));
  const int prefill = port + 1, decode = port + 2;
  constexpr int kThreads = 3, kPerThread = 12;
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.emplace_back([port, t] {
      std::mt19937 rng(2000 + t);
      for (int i = 0; i < kPerThread; ++i) {
        const int len = 2 + static_cast<int>(rng() % 300);
        const int max_tokens = 1 + static_cast<int>(rng() % 30);
        const int chunks = rng() % 2 == 0 ? 0 : 1 + static_cast<int>(rng() % 10);
        const int timeout_ms = 1 + static_cast<int>(rng() % 150);
        testing::AbandonStream(kHost, port, testing::PromptOf(len, t * 100 + i, 1990), max_tokens,
                               chunks, timeout_ms);
      }
    });
  }
  for (std::thread& c : clients) c.join();

  EXPECT_TRUE(PagesFree(decode));
  EXPECT_TRUE(PagesFree(prefill));
  EXPECT_TRUE(WaitFor([&] { return Metric(port, "pdserve:router_outstanding") == 0; }, 30s));
  EXPECT_TRUE(WaitFor(
      [&] {
        return Metric(prefill, "pdserve:kv_transfers_active", kPrefillRole) == 0 &&
               Metric(decode, "pdserve:kv_transfers_active", kDecodeRole) == 0;
      },
      30s));
  EXPECT_EQ(Metric(decode, "pdserve:num_requests_running"), 0);
  EXPECT_EQ(Metric(decode, "pdserve:num_requests_waiting"), 0);
  const double done = Metric(prefill, "pdserve:kv_transfers_total", kPrefillRole);
  const double failed = Metric(prefill, "pdserve:kv_transfer_failures_total", kPrefillRole);
  EXPECT_LE(done + failed, kThreads * kPerThread);
  std::printf("%d streams abandoned: %.0f transfers completed, %.0f ended unfinished (aborted)\n",
              kThreads * kPerThread, done, failed);
  for (int i = 0; i < 3; ++i) {
    auto [status, body] =
        testing::CompleteAt(kHost, port, testing::PromptOf(50 + i * 40, 900 + i, 1990), 8);
    ASSERT_EQ(status, 200) << body.dump();
    EXPECT_EQ(body["usage"]["completion_tokens"], 8);
  }
  EXPECT_TRUE(PagesFree(decode));
  EXPECT_TRUE(PagesFree(prefill));
  EXPECT_EQ(up.Stop(SIGTERM, 30s), 0);
  if (HasFailure()) ADD_FAILURE() << up.output();
}

INSTANTIATE_TEST_SUITE_P(PrefillDp, UpDpAbortTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "prefill_dp" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace pd
