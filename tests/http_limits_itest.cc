// The HTTP limits on the bootstrap server of `serve --role prefill`: it takes the same flags and
// enforces the same limits as the OpenAI front (an oversized head is 431, a request that does not
// arrive in time is 408), and counts what it refused in /metrics.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>

#include "tests/disagg_process.h"

namespace pd {
namespace {

using ::testing::HasSubstr;
using testing::Process;
using ::testing::StartsWith;
using namespace std::chrono_literals;

const std::string kBinary = PDSERVE_BINARY;

std::string TempPath(const std::string& name) {
  return testing::TempPathFor("pdserve_http_limits_", name);
}

// Removes the model and secret files when the binary ends.
[[maybe_unused]] const auto* const kTempCleanup =
    ::testing::AddGlobalTestEnvironment(new testing::TempPathCleanup("pdserve_http_limits_"));

// Sends `request` to 127.0.0.1:port and returns what comes back until the server closes or
// `timeout` passes.
std::string Exchange(int port, const std::string& request, std::chrono::milliseconds timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size())) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[4096];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

TEST(PrefillHttpLimitsTest, TheBootstrapServerHasTheFrontsLimits) {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()));
  const int port = testing::PickPortBlock(rng, 30000);
  const std::string model = testing::MakeModel(kBinary, "tiny", 5, TempPath("model"));
  const std::string secret = testing::WriteTempFile(TempPath("secret"), "limits-secret");
  Process prefill;
  ASSERT_TRUE(testing::StartAndWaitFor(
      prefill,
      testing::ServeArgv(
          kBinary, model, port, 256,
          {"--role", "prefill", "--cluster-secret-file", secret, "--max-header-bytes", "2048",
           "--read-timeout-ms", "400", "--request-timeout-ms", "800"}),
      "prefill instance on", 120s));

  const std::string big_header = "X-Filler: " + std::string(4096, 'a') + "\r\n";
  std::string resp =
      Exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\n" + big_header + "\r\n", 10s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 431"));
  EXPECT_THAT(resp, HasSubstr("request headers exceed the limit of 2048 bytes"));

  resp = Exchange(port, "GET /pd/inf", 10s);  // a request line that never ends
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 408"));
  EXPECT_THAT(resp, HasSubstr("800 ms for the whole request"));

  resp = Exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 10s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(
      testing::MetricSum("127.0.0.1", port, "pdserve:http_refused_total", "reason=\"headers\""), 1);
  EXPECT_EQ(
      testing::MetricSum("127.0.0.1", port, "pdserve:http_refused_total", "reason=\"timeout\""), 1);
  EXPECT_EQ(prefill.Stop(SIGTERM, 30s), 0);
}

}  // namespace
}  // namespace pd
