// The messenger over two NICs across two "hosts": a prefill instance in one network namespace and
// a decode instance (and the clients) in another, joined by two veth pairs on two subnets, each
// instance given both with --fabric-nics. Both links carry KV bytes (the prefill's per-NIC
// counters); then, with transfers in flight, the second link goes down (`ip link set ... down`):
// every request is still answered with a colocated instance's greedy text, the transfers caught on
// the lost link rerouted over the first (kv_transfer_nic_reroutes_total), and every page is free.
//
// Needs root and `ip` (iproute2); otherwise it skips and says why.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

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
using Clock = std::chrono::steady_clock;

const std::string kBinary = PDSERVE_BINARY;
const std::string kModel = PD_DEMO_MODEL_DIR;
const std::string kRole = "role=\"prefill\"";
constexpr int kMaxTokens = 4;

std::string TempPath(const std::string& name) {
  return testing::TempPathFor("pdserve_nics_", name);
}

[[maybe_unused]] const auto* const kTempCleanup =
    ::testing::AddGlobalTestEnvironment(new testing::TempPathCleanup("pdserve_nics_"));

std::vector<int> PromptOf(int len, int salt) { return testing::PromptOf(len, salt, 1990); }

double NicBytes(const std::string& host, int port, const std::string& nic) {
  return MetricSum(host, port, "pdserve:kv_transfer_nic_bytes_total", "nic=\"" + nic + "\"");
}

// `n` requests at once from host B (prompt `len`, salts from `salt0`): (status, body) each.
std::vector<std::pair<int, json>> RunClients(const TwoHosts& hosts, int port, int n, int len,
                                             int salt0) {
  std::vector<std::pair<int, json>> got(static_cast<size_t>(n), {-2, json()});
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) {
    clients.emplace_back([&, i] {
      if (!hosts.EnterB()) return;
      got[static_cast<size_t>(i)] =
          CompleteAt(hosts.addr_b(0), port, PromptOf(len, salt0 + i), kMaxTokens, 90);
    });
  }
  for (std::thread& t : clients) t.join();
  return got;
}

TEST(DisaggNicsTest, TwoLinksCarryKvAndOneGoingDownLosesNoRequest) {
  std::string why;
  std::unique_ptr<TwoHosts> hosts = TwoHosts::Create(&why, 2);  // outlives the instances below
  if (!hosts) GTEST_SKIP() << "two-NIC test skipped: " << why;
  std::mt19937 rng(static_cast<unsigned>(getpid()) * 37u);
  const int port = testing::PickPortBlock(rng, 26000, 2000);
  const std::string secret = testing::WriteTempFile(TempPath("secret"), "nics-secret");
  const std::string a0 = hosts->addr_a(0), a1 = hosts->addr_a(1);
  const std::string b0 = hosts->addr_b(0), b1 = hosts->addr_b(1);

  // A slow prefill instance (one sequence at a time, chunks of 32 tokens) so that transfers are
  // in flight when the link goes down.
  Process colocated, prefill, decode;
  ASSERT_TRUE(
      colocated.Start(testing::ServeArgv(kBinary, kModel, port + 9, 512, {"--host", "127.0.0.1"})));
  ASSERT_TRUE(StartAndWaitFor(
      prefill,
      hosts->InA(testing::ServeArgv(
          kBinary, kModel, port + 1, 512,
          {"--host", a0, "--role", "prefill", "--cluster-secret-file", secret, "--fabric-nics",
           a0 + "," + a1, "--max-num-seqs", "1", "--max-num-batched-tokens", "32"})),
      "prefill instance on", 120s));
  const std::string peer = "http://" + a0 + ":" + std::to_string(port + 1);
  ASSERT_TRUE(StartAndWaitFor(
      decode,
      hosts->InB(testing::ServeArgv(
          kBinary, kModel, port + 2, 512,
          {"--host", b0, "--role", "decode", "--cluster-secret-file", secret, "--fabric-nics",
           b0 + "," + b1, "--prefill-peers", peer, "--kv-transfer-timeout-ms", "60000",
           "--local-prefill-max-tokens", "-1"})),
      "on http://", 120s));
  ASSERT_FALSE(colocated.WaitForLine("on http://", 120s).empty()) << colocated.output();

  auto expect_colocated = [&](const std::vector<std::pair<int, json>>& got, int len, int salt0) {
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_NE(got[i].first, -2) << "a client could not enter the decode host's namespace";
      ASSERT_EQ(got[i].first, 200) << got[i].second.dump();
      auto [ws, want] = CompleteAt("127.0.0.1", port + 9,
                                   PromptOf(len, salt0 + static_cast<int>(i)), kMaxTokens, 90);
      ASSERT_EQ(ws, 200) << want.dump();
      EXPECT_EQ(got[i].second["choices"][0]["text"], want["choices"][0]["text"]);
    }
  };

  // Both links carry KV.
  constexpr int kWarm = 4;
  expect_colocated(RunClients(*hosts, port + 2, kWarm, 100, 0), 100, 0);
  double nic0 = -1, nic1 = -1;
  ASSERT_TRUE(hosts->RunInA([&] {
    nic0 = NicBytes(a0, port + 1, a0);
    nic1 = NicBytes(a0, port + 1, a1);
  }));
  EXPECT_GT(nic0, 0) << prefill.output();
  EXPECT_GT(nic1, 0) << prefill.output();

  // The second link goes down while transfers are in flight.
  constexpr int kRequests = 6;
  std::vector<std::pair<int, json>> got;
  std::thread load([&] { got = RunClients(*hosts, port + 2, kRequests, 240, 100); });
  bool mid_transfer = false;
  ASSERT_TRUE(hosts->RunInA([&] {
    mid_transfer = WaitFor(
        [&] {
          return MetricSum(a0, port + 1, "pdserve:kv_transfers_total", kRole) >= kWarm + 1 &&
                 MetricSum(a0, port + 1, "pdserve:kv_transfers_active", kRole) >= 1;
        },
        60s);
  }));
  ASSERT_TRUE(hosts->SetLink(false, 1));
  const auto down = Clock::now();
  load.join();
  const double ended_s = std::chrono::duration<double>(Clock::now() - down).count();
  EXPECT_TRUE(mid_transfer) << "the link went down after the load had finished";
  expect_colocated(got, 240, 100);
  double reroutes = -1, nic1_after = -1, nic0_after = -1;
  ASSERT_TRUE(hosts->RunInA([&] {
    EXPECT_TRUE(testing::PagesFreeAt(a0, port + 1, 30s));
    reroutes = MetricSum(a0, port + 1, "pdserve:kv_transfer_nic_reroutes_total", kRole);
    nic0_after = NicBytes(a0, port + 1, a0);
    nic1_after = NicBytes(a0, port + 1, a1);
  }));
  ASSERT_TRUE(hosts->RunInB([&] { EXPECT_TRUE(testing::PagesFreeAt(b0, port + 2, 30s)); }));
  int answered = 0;
  for (const auto& g : got) answered += g.first == 200 ? 1 : 0;
  std::printf(
      "[ measured ] two NICs: %d warm-up requests put %.0f KV bytes on NIC 0 and %.0f on NIC 1; "
      "NIC 1's link down mid-run: %d of %d requests answered (colocated text), %.0f transfer(s) "
      "rerouted, all ended %.2f s after the link went down; KV bytes since: NIC 0 +%.0f, "
      "NIC 1 +%.0f\n",
      kWarm, nic0, nic1, answered, kRequests, reroutes, ended_s, nic0_after - nic0,
      nic1_after - nic1);
  EXPECT_EQ(answered, kRequests);
  EXPECT_EQ(decode.Stop(SIGTERM, 30s), 0);
  EXPECT_EQ(prefill.Stop(SIGTERM, 30s), 0);
  EXPECT_EQ(colocated.Stop(SIGTERM, 30s), 0);
  if (HasFailure()) ADD_FAILURE() << decode.output() << "\n--- prefill:\n" << prefill.output();
}

}  // namespace
}  // namespace pd
