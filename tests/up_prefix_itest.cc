// Prefix caching across the split under `pdserve up` (1 prefill + 1 decode, the demo model, page
// size 16): a second request with the same 2,000-token prefix finds the prefix in the decode
// instance's cache (usage.prompt_tokens_details.cached_tokens >= 1984), its KV transfer carries
// only the page the decode instance lacked (pdserve:kv_transfer_pages_total), a repeated prompt
// answers as it did uncached, and every page ends free or cached-evictable on both instances,
// also after a prefill instance killed under a transfer.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tests/up_deployment.h"

namespace pd {
namespace {

using testing::UpDeployment;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kBinary = PDSERVE_BINARY;
const std::string kModel = PD_DEMO_MODEL_DIR;
constexpr int kPrefix = 2000;
constexpr int kPageSize = 16;

std::vector<int> WithSuffix(int salt) {
  std::vector<int> p = testing::PromptOf(kPrefix, 1);
  const std::vector<int> s = testing::PromptOf(15, salt);
  p.insert(p.end(), s.begin(), s.end());
  return p;  // 2015 tokens: 2014 before the last, 126 pages of which 125 are the prefix's
}

struct Answer {
  int status = -1;
  std::string text;
  int cached_tokens = -1;
  double seconds = 0.0;
};

// A one-token greedy completion (its latency is the time to first token) through the router.
Answer Complete(int port, const std::vector<int>& prompt, int max_tokens) {
  const auto start = Clock::now();
  auto [status, body] = testing::CompleteAt(testing::kUpHost, port, prompt, max_tokens);
  Answer a;
  a.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  a.status = status;
  if (status != 200 || !body.is_object()) return a;
  a.text = body["choices"][0].value("text", "");
  a.cached_tokens = body["usage"]["prompt_tokens_details"].value("cached_tokens", -1);
  return a;
}

TEST(UpPrefixTest, ASecondRequestWithTheSamePrefixMovesOnlyTheMissingPage) {
  UpDeployment d(kBinary, kModel, 1, 1, {"--local-prefill-max-tokens", "-1"});
  ASSERT_TRUE(d.started());
  const int decode = d.port("decode 0");
  const auto pages = [&] {
    return testing::MetricSum(testing::kUpHost, decode, "pdserve:kv_transfer_pages_total");
  };
  const auto cached = [&] {
    return testing::MetricSum(testing::kUpHost, decode, "pdserve:kv_transfer_pages_cached_total");
  };
  const Answer first = Complete(d.router_port(), WithSuffix(2), 1);
  ASSERT_EQ(first.status, 200);
  EXPECT_EQ(first.cached_tokens, 0);
  const double pages0 = pages(), cached0 = cached();
  EXPECT_EQ(pages0, 126.0);
  const Answer second = Complete(d.router_port(), WithSuffix(3), 1);
  ASSERT_EQ(second.status, 200);
  EXPECT_GE(second.cached_tokens, 1984);
  EXPECT_EQ(second.cached_tokens, kPrefix / kPageSize * kPageSize);
  EXPECT_EQ(pages() - pages0, 1.0) << "the transfer carried more than the page decode lacked";
  EXPECT_EQ(cached() - cached0, 125.0);
  // The prefill instance computed the second prompt from its own cached prefix (its /metrics).
  const int prefill_port = d.port("prefill 0");
  EXPECT_GE(testing::MetricSum(testing::kUpHost, prefill_port, "pdserve:prefix_cache_hits_total"),
            1984.0);
  EXPECT_GE(
      testing::MetricSum(testing::kUpHost, prefill_port, "pdserve:prefix_cache_queries_total"),
      2.0 * kPrefix);
  const Answer again = Complete(d.router_port(), WithSuffix(2), 1);  // all but one page cached
  ASSERT_EQ(again.status, 200);
  EXPECT_EQ(again.text, first.text);
  std::printf(
      "[ measured ] 2,000-token prefix through up: first request %.3f s, second %.3f s "
      "(%.1fx), cached_tokens %d (shared machine)\n",
      first.seconds, second.seconds, first.seconds / second.seconds, second.cached_tokens);
  // A prefill instance killed while it computes a long prompt: the request ends (with tokens
  // after a retry on the restarted instance, or with an error), and no page is left held.
  const size_t mark = d.up().output().size();
  const pid_t prefill = d.pid("prefill 0");
  ASSERT_GT(prefill, 0);
  std::atomic<bool> answered{false};
  std::thread client([&] {
    Complete(d.router_port(), testing::PromptOf(1800, 7), 4);
    answered = true;
  });
  // Killed once the transfer is under way (or, should it end before it is seen, after it).
  const bool mid = testing::WaitFor(
                       [&] {
                         return answered || testing::MetricSum(testing::kUpHost, decode,
                                                               "pdserve:kv_transfers_active") > 0;
                       },
                       30s) &&
                   !answered;
  ASSERT_EQ(kill(prefill, SIGKILL), 0);
  std::printf("[ measured ] prefill instance killed %s\n",
              mid ? "during a transfer" : "after the transfer was seen to end");
  client.join();
  pid_t restarted = -1;
  EXPECT_TRUE(d.RestartedAndHealthy(mark, "prefill 0", &restarted));
  d.ExpectPagesFree();
  EXPECT_EQ(d.up().Stop(SIGTERM, 30s), 0);
  if (HasFailure()) ADD_FAILURE() << d.up().output();
}

}  // namespace
}  // namespace pd
