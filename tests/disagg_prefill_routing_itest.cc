// A decode instance choosing its prefill instance by prefix cache (serve --role decode
// --prefill-routing kv-aware): prefill instances publish their page keys at GET /v1/kv_events (with
// the API key), and a prompt whose prefix one of them holds goes there, not to the least loaded.
//
// Two prefill instances P0 and P1 (the demo model, page size 16). A decode instance D1 that knows
// only P1 sends it a prompt: P1's cache now holds the prefix. A decode instance D2 that knows both
// (P0 first, so least-loaded would pick it for every request sent one at a time) sends three
// prompts with that prefix and other suffixes: each one's transfer comes from P1 alone.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/disagg_process.h"
#include "tests/up_deployment.h"

namespace pd {
namespace {

using testing::MetricSum;
using testing::Process;
using testing::PromptOf;
using testing::StartAndWaitFor;
using testing::WaitFor;
using namespace std::chrono_literals;

const std::string kBinary = PDSERVE_BINARY;
const std::string kModel = PD_DEMO_MODEL_DIR;
const std::string kHost = "127.0.0.1";
const std::string kApiKey = "prefill-routing-key";
constexpr int kPrefix = 256;  // 16 pages

std::vector<int> WithSuffix(int salt) {
  std::vector<int> p = PromptOf(kPrefix, 1);
  const std::vector<int> s = PromptOf(20, salt);
  p.insert(p.end(), s.begin(), s.end());
  return p;
}

int PickPort() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) + 7);
  return testing::PickPortBlock(rng, 20000);
}

std::string Url(int port) { return "http://127.0.0.1:" + std::to_string(port); }

// A greedy completion of a token-id prompt with the API key; (HTTP status, body).
std::pair<int, std::string> Complete(int port, const std::vector<int>& prompt) {
  httplib::Client c(kHost, port);
  c.set_read_timeout(120, 0);
  c.set_bearer_token_auth(kApiKey);
  const nlohmann::json req = {
      {"model", "m"}, {"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0.0}};
  auto r = c.Post("/v1/completions", req.dump(), "application/json");
  if (!r) return {-1, httplib::to_string(r.error())};
  return {r->status, r->body};
}

double PrefillPages(int port) {
  return MetricSum(kHost, port, "pdserve:kv_transfer_pages_total", "role=\"prefill\"");
}

TEST(DisaggPrefillRoutingTest, APromptGoesToThePrefillInstanceHoldingItsPrefix) {
  const int base = PickPort();
  const std::string secret = testing::WriteTempFile(
      testing::TempPathFor("pdserve_prefill_routing_", "secret"), "prefill-routing-secret");
  const auto serve = [&](int port, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--cluster-secret-file", secret, "--api-key", kApiKey});
    return testing::ServeArgv(kBinary, kModel, port, 512, extra);
  };
  Process p0, p1, d1, d2;
  ASSERT_TRUE(
      StartAndWaitFor(p0, serve(base + 1, {"--role", "prefill"}), "prefill instance on", 120s));
  ASSERT_TRUE(
      StartAndWaitFor(p1, serve(base + 2, {"--role", "prefill"}), "prefill instance on", 120s));
  // Every prompt crosses the wire: none is short enough to be computed on a decode instance.
  ASSERT_TRUE(StartAndWaitFor(d1,
                              serve(base + 3, {"--role", "decode", "--prefill-peers", Url(base + 2),
                                               "--local-prefill-max-tokens", "-1"}),
                              "on http://", 120s));
  ASSERT_TRUE(StartAndWaitFor(
      d2,
      serve(base + 4, {"--role", "decode", "--prefill-peers", Url(base + 1) + "," + Url(base + 2),
                       "--local-prefill-max-tokens", "-1", "--prefill-routing", "kv-aware"}),
      "on http://", 120s));
  // Without the API key a prefill instance's keys are not handed out.
  {
    httplib::Client c(kHost, base + 2);
    auto r = c.Get("/v1/kv_events");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
  }
  auto [s0, warm] = Complete(base + 3, WithSuffix(2));
  ASSERT_EQ(s0, 200) << warm;
  // A prefill instance counts a transfer once every write of it completed, maybe after the answer.
  ASSERT_TRUE(WaitFor([&] { return PrefillPages(base + 2) > 0; }, 20s));
  // D2 follows both prefill instances' caches: P1's holds the prefix's 16 pages (and more).
  const std::string p1_label = "peer=\"" + Url(base + 2) + "\"";
  ASSERT_TRUE(WaitFor(
      [&] {
        return MetricSum(kHost, base + 4, "pdserve:prefill_kv_indexed_pages", p1_label) >= 16 &&
               MetricSum(kHost, base + 4, "pdserve:prefill_kv_synced") == 2;
      },
      20s))
      << d2.output();
  const double p0_before = PrefillPages(base + 1), p1_before = PrefillPages(base + 2);
  for (int salt = 3; salt <= 5; ++salt) {
    auto [status, body] = Complete(base + 4, WithSuffix(salt));
    ASSERT_EQ(status, 200) << body;
  }
  // Each of the three transfers carried at least the page with the suffix.
  EXPECT_TRUE(WaitFor([&] { return PrefillPages(base + 2) >= p1_before + 3; }, 20s));
  EXPECT_EQ(PrefillPages(base + 1), p0_before) << "a prompt went to the prefill instance without "
                                                  "its prefix";
  // Each choice saw the prefix's 16 pages cached on P1.
  EXPECT_GE(MetricSum(kHost, base + 4, "pdserve:prefill_kv_cached_pages_total"), 3 * 16);
  for (Process* p : {&d2, &d1, &p1, &p0}) EXPECT_EQ(p->Stop(SIGTERM, 30s), 0) << p->output();
  if (HasFailure()) ADD_FAILURE() << d2.output() << "\n--- P1:\n" << p1.output();
}

// `pdserve up --routing kv-aware` gives its decode instances --prefill-routing kv-aware: the
// decode instance follows both prefill instances' key feeds (without the flag it follows none).
TEST(UpPrefillRoutingTest, UpKvAwareMakesItsDecodeInstancesChooseTheirPrefillByCache) {
  for (const bool kv_aware : {true, false}) {
    SCOPED_TRACE(kv_aware ? "--routing kv-aware" : "--routing least-loaded");
    testing::UpDeployment d(kBinary, kModel, 2, 1,
                            {"--routing", kv_aware ? "kv-aware" : "least-loaded"});
    ASSERT_TRUE(d.started());
    const int decode = d.port("decode 0");
    if (kv_aware) {
      EXPECT_TRUE(
          WaitFor([&] { return MetricSum(kHost, decode, "pdserve:prefill_kv_synced") == 2; }, 20s))
          << d.up().output();
    } else {
      EXPECT_LE(MetricSum(kHost, decode, "pdserve:prefill_kv_synced"), 0.0);
    }
    EXPECT_EQ(d.up().Stop(SIGTERM, 60s), 0);
  }
}

}  // namespace
}  // namespace pd
