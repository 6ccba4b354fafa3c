// --kv-checksum and --fault-inject with real processes over tcp;ofi_rxm on loopback: a prefill
// instance whose fabric domain corrupts one KV write (hidden --fault-inject) is caught by the
// decode instance's per-layer CRC32C, the attempt is retried on a clean prefill instance and the
// answer equals the clean one's; the mismatch is counted on /metrics and every page ends free.
// Instances that disagree on --kv-checksum refuse each other at the handshake.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <random>

#include "tests/disagg_process.h"

namespace pd {
namespace {

using testing::CompleteAt;
using ::testing::HasSubstr;
using testing::MetricSum;
using testing::Process;
using testing::StartAndWaitFor;
using namespace std::chrono_literals;

const std::string kBinary = PDSERVE_BINARY;
const std::string kHost = "127.0.0.1";
const std::string kDecodeRole = "role=\"decode\"";

std::string TempPath(const std::string& name) {
  return testing::TempPathFor("pdserve_checksum_", name);
}

[[maybe_unused]] const auto* const kTempCleanup =
    ::testing::AddGlobalTestEnvironment(new testing::TempPathCleanup("pdserve_checksum_"));

const std::string& ModelDir() {
  static const std::string dir = testing::MakeModel(kBinary, "tiny", 11, TempPath("model"));
  return dir;
}

int PickPort() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 104729u);
  return testing::PickPortBlock(rng, 24000);
}

std::vector<std::string> Serve(int port, std::vector<std::string> extra) {
  return testing::ServeArgv(kBinary, ModelDir(), port, 256, extra);
}

std::string Url(int port) { return "http://127.0.0.1:" + std::to_string(port); }

TEST(DisaggChecksumTest, ACorruptedKvWriteIsCaughtAndRetriedOnTheCleanInstance) {
  const int port = PickPort();
  const std::string secret = testing::WriteTempFile(TempPath("secret"), "checksum-secret");
  const std::vector<std::string> prefill = {"--role", "prefill", "--cluster-secret-file", secret,
                                            "--kv-checksum"};
  std::vector<std::string> faulty = prefill;
  faulty.insert(faulty.end(), {"--fault-inject", "write:corrupt:3"});
  Process p0, p1, decode;
  ASSERT_TRUE(StartAndWaitFor(p0, Serve(port + 1, faulty), "prefill instance on", 120s));
  EXPECT_THAT(p0.output(), HasSubstr("fault injection armed"));
  ASSERT_TRUE(StartAndWaitFor(p1, Serve(port + 2, prefill), "prefill instance on", 120s));
  // The faulty instance first: with nothing outstanding anywhere the decode instance picks it.
  ASSERT_TRUE(StartAndWaitFor(
      decode,
      Serve(port + 8, {"--role", "decode", "--cluster-secret-file", secret, "--prefill-peers",
                       Url(port + 1) + "," + Url(port + 2), "--kv-transfer-timeout-ms", "5000",
                       "--kv-checksum", "--local-prefill-max-tokens", "-1"}),
      "on http://", 120s));

  const auto prompt = testing::PromptOf(40, 3);
  auto [status, got] = CompleteAt(kHost, port + 8, prompt, 6, 60);
  ASSERT_EQ(status, 200) << got.dump() << "\n" << decode.output();
  EXPECT_EQ(MetricSum(kHost, port + 8, "pdserve:kv_transfer_checksum_mismatch_total", kDecodeRole),
            1);
  EXPECT_EQ(MetricSum(kHost, port + 8, "pdserve:kv_transfer_retries_total", kDecodeRole), 1);
  // Again, now that the fault is spent: the first attempt succeeds, and the text is the same.
  auto [status2, want] = CompleteAt(kHost, port + 8, prompt, 6, 60);
  ASSERT_EQ(status2, 200) << want.dump();
  EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]);
  EXPECT_EQ(MetricSum(kHost, port + 8, "pdserve:kv_transfer_retries_total", kDecodeRole), 1);
  EXPECT_TRUE(testing::PagesFreeAt(kHost, port + 8, 30s));
  EXPECT_TRUE(testing::PagesFreeAt(kHost, port + 1, 30s));
  EXPECT_TRUE(testing::PagesFreeAt(kHost, port + 2, 30s));
  EXPECT_EQ(decode.Stop(SIGTERM, 30s), 0);
  EXPECT_THAT(decode.output(), HasSubstr("KV checksum mismatch in 1 of"));
  EXPECT_EQ(p0.Stop(SIGTERM, 30s), 0);
  EXPECT_EQ(p1.Stop(SIGTERM, 30s), 0);
}

TEST(DisaggChecksumTest, InstancesThatDisagreeRefuseEachOther) {
  const int port = PickPort();
  const std::string secret = testing::WriteTempFile(TempPath("secret2"), "checksum-secret");
  Process p0, decode;
  ASSERT_TRUE(StartAndWaitFor(
      p0, Serve(port + 1, {"--role", "prefill", "--cluster-secret-file", secret, "--kv-checksum"}),
      "prefill instance on", 120s));
  ASSERT_TRUE(
      decode.Start(Serve(port + 8, {"--role", "decode", "--cluster-secret-file", secret,
                                    "--prefill-peers", Url(port + 1), "--peer-wait-s", "10"})));
  EXPECT_NE(decode.Wait(60s), 0);
  EXPECT_THAT(decode.output(),
              HasSubstr("kv_checksum: ours on, theirs off"));  // the prefill's words
  EXPECT_EQ(p0.Stop(SIGTERM, 30s), 0);
}

TEST(DisaggChecksumTest, ABadFaultRuleIsRefusedAtStart) {
  Process p;
  ASSERT_TRUE(p.Start(Serve(PickPort(), {"--role", "prefill", "--fault-inject", "write:melt:1"})));
  EXPECT_NE(p.Wait(60s), 0);
  EXPECT_THAT(p.output(), HasSubstr("--fault-inject"));
  EXPECT_THAT(p.output(), HasSubstr("kind 'melt'"));
}

}  // namespace
}  // namespace pd
