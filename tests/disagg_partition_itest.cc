// A network partition mid-transfer: the prefill instance in one network namespace, the decode
// instance and the clients in another (tests/two_hosts.h), the veth link between them taken down
// while KV transfers are in flight, then brought up again. Every request in flight ends (tokens
// or an error, none past its read timeout), both sides free every page, and once the link is up
// the decode instance greets the prefill instance again and requests succeed.
//
// Needs root and `ip` (iproute2); otherwise it skips and says why.
#include <gmock/gmock.h>
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

std::string TempPath(const std::string& name) {
  return testing::TempPathFor("pdserve_partition_", name);
}

[[maybe_unused]] const auto* const kTempCleanup =
    ::testing::AddGlobalTestEnvironment(new testing::TempPathCleanup("pdserve_partition_"));

std::vector<int> PromptOf(int len, int salt) { return testing::PromptOf(len, salt, 1990); }

TEST(DisaggPartitionTest, LinkDownMidTransferFailsCleanlyAndServiceResumesWhenItIsBack) {
  std::string why;
  std::unique_ptr<TwoHosts> hosts = TwoHosts::Create(&why);  // outlives the instances below
  if (!hosts) GTEST_SKIP() << "partition test skipped: " << why;
  std::mt19937 rng(static_cast<unsigned>(getpid()) * 31u);
  const int port = testing::PickPortBlock(rng, 24000, 2000);
  const std::string secret = testing::WriteTempFile(TempPath("secret"), "partition-secret");
  const std::string a = hosts->addr_a(), b = hosts->addr_b();

  // A slow prefill instance (one sequence at a time, chunks of 32 tokens) so that transfers are
  // in flight when the link goes down.
  Process prefill, decode;
  ASSERT_TRUE(StartAndWaitFor(
      prefill,
      hosts->InA(testing::ServeArgv(
          kBinary, kModel, port + 1, 512,
          {"--host", a, "--role", "prefill", "--cluster-secret-file", secret, "--fabric-node", a,
           "--max-num-seqs", "1", "--max-num-batched-tokens", "32"})),
      "prefill instance on", 120s));
  const std::string peer = "http://" + a + ":" + std::to_string(port + 1);
  ASSERT_TRUE(
      StartAndWaitFor(decode,
                      hosts->InB(testing::ServeArgv(
                          kBinary, kModel, port + 2, 512,
                          {"--host", b, "--role", "decode", "--cluster-secret-file", secret,
                           "--fabric-node", b, "--prefill-peers", peer, "--kv-transfer-timeout-ms",
                           "5000", "--local-prefill-max-tokens", "-1"})),
                      "on http://", 120s));

  // Six requests from host B; the link goes down once the prefill instance has finished a
  // transfer and has another in flight.
  constexpr int kRequests = 6;
  std::vector<int> status(kRequests, -2);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      if (!hosts->EnterB()) return;
      status[i] = CompleteAt(b, port + 2, PromptOf(240, i), 4, 60).first;
    });
  }
  bool mid_transfer = false;
  ASSERT_TRUE(hosts->RunInA([&] {
    mid_transfer = WaitFor(
        [&] {
          return MetricSum(a, port + 1, "pdserve:kv_transfers_total", kRole) >= 1 &&
                 MetricSum(a, port + 1, "pdserve:kv_transfers_active", kRole) >= 1;
        },
        60s);
  }));
  ASSERT_TRUE(mid_transfer) << prefill.output();
  ASSERT_TRUE(hosts->SetLink(false));
  const auto down = Clock::now();
  for (std::thread& t : clients) t.join();
  const double ended_s = std::chrono::duration<double>(Clock::now() - down).count();
  int ok = 0, failed = 0;
  for (int s : status) {
    EXPECT_NE(s, -1) << "a request got no answer within 60 s";
    EXPECT_NE(s, -2) << "a client could not enter the decode host's namespace";
    ++(s == 200 ? ok : failed);
  }
  EXPECT_GE(failed, 1) << "the partition failed nothing: it came too late";

  // Both sides give every page back while the link is still down.
  ASSERT_TRUE(hosts->RunInA([&] { EXPECT_TRUE(testing::PagesFreeAt(a, port + 1, 30s)); }));
  ASSERT_TRUE(hosts->RunInB([&] { EXPECT_TRUE(testing::PagesFreeAt(b, port + 2, 30s)); }));

  ASSERT_TRUE(hosts->SetLink(true));
  const auto up = Clock::now();
  bool served = false;
  ASSERT_TRUE(hosts->RunInB([&] {
    served =
        WaitFor([&] { return CompleteAt(b, port + 2, PromptOf(40, 99), 4, 30).first == 200; }, 60s);
  }));
  EXPECT_TRUE(served) << "no request succeeded within 60 s of the link coming back";
  std::printf(
      "[ measured ] partition mid-transfer: %d of %d requests in flight failed, all ended %.2f s "
      "after the link went down; link up -> a request succeeded %.2f s\n",
      failed, kRequests, ended_s, std::chrono::duration<double>(Clock::now() - up).count());
  ASSERT_TRUE(hosts->RunInA([&] { EXPECT_TRUE(testing::PagesFreeAt(a, port + 1, 30s)); }));
  ASSERT_TRUE(hosts->RunInB([&] { EXPECT_TRUE(testing::PagesFreeAt(b, port + 2, 30s)); }));
  EXPECT_EQ(decode.Stop(SIGTERM, 30s), 0);
  EXPECT_EQ(prefill.Stop(SIGTERM, 30s), 0);
  if (HasFailure()) ADD_FAILURE() << decode.output() << "\n--- prefill:\n" << prefill.output();
}

}  // namespace
}  // namespace pd
