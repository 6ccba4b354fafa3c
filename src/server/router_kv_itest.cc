// End to end: two colocated `pdserve serve` instances behind `pdserve router --routing kv-aware`
// (separate processes, a tiny synthetic qwen3 model): requests sharing a prefix land on the
// instance that holds it, so every request after a prefix's first reports it cached.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/test_http.h"
#include "server/test_process.h"

namespace pd::server {
namespace {

using json = nlohmann::json;
using testing::ChildProcess;
using testing::MetricValue;
using testing::WaitFor;
using namespace std::chrono_literals;

const std::string kBinary = PDSERVE_BINARY;

std::string ModelDir() {
  static const std::string dir = [] {
    std::string d = (std::filesystem::temp_directory_path() /
                     ("pdserve_kvroute_model_" + std::to_string(::getpid())))
                        .string();
    std::string out;
    int rc = testing::RunCommand(
        {kBinary, "make-model", "--arch", "qwen3", "--preset", "tiny", "--seed", "3", "--out", d},
        &out, 120s);
    EXPECT_EQ(rc, 0) << out;
    return d;
  }();
  return dir;
}

// A child process printing "... http://HOST:PORT..." once it listens; port() is that PORT.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv, const std::string& ready) {
    EXPECT_TRUE(process_.Start(argv));
    const std::string line = process_.WaitForLine(ready, 60s);
    EXPECT_FALSE(line.empty()) << process_.output();
    const size_t at = line.find("http://127.0.0.1:");
    if (at != std::string::npos) port_ = std::atoi(line.c_str() + at + 17);
  }
  ~Child() { EXPECT_EQ(process_.Stop(SIGTERM, 30s), 0) << process_.output(); }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string Metrics() const {
    auto r = httplib::Client("127.0.0.1", port_).Get("/metrics");
    return r ? r->body : "";
  }

 private:
  ChildProcess process_;
  int port_ = 0;
};

std::unique_ptr<Child> StartInstance() {
  return std::make_unique<Child>(
      std::vector<std::string>{kBinary, "serve", "--model", ModelDir(), "--port", "0",
                               "--served-model-name", "tiny", "--max-model-len", "1024",
                               "--page-size", "16", "--threads", "1"},
      "on http://127.0.0.1:");
}

std::string Prefix(int k) {
  std::string words;
  for (int i = 0; i < 120; ++i) words += "w" + std::to_string((i * 31 + k * 7) % 97) + " ";
  return words;
}

TEST(RouterKvE2ETest, RequestsSharingAPrefixLandWhereItIsCached) {
  auto a = StartInstance();
  auto b = StartInstance();
  Child router({kBinary, "router", "--decode", a->url() + "," + b->url(), "--port", "0",
                "--routing", "kv-aware", "--model", ModelDir()},
               "router on http://127.0.0.1:");
  ASSERT_GT(router.port(), 0);
  auto synced = [&](const std::string& url) {
    return MetricValue(router.Metrics(), "pdserve:router_kv_synced{backend=\"" + url + "\"}") == 1;
  };
  ASSERT_TRUE(WaitFor([&] { return synced(a->url()) && synced(b->url()); }, 30s))
      << router.Metrics();
  httplib::Client client("127.0.0.1", router.port());
  client.set_read_timeout(60, 0);
  auto complete = [&](const std::string& prompt) {
    json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0.0}};
    auto r = client.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    return r ? json::parse(r->body, nullptr, false)["usage"] : json();
  };
  auto indexed = [&] {
    const std::string m = router.Metrics();
    return MetricValue(m, "pdserve:router_kv_indexed_pages{backend=\"" + a->url() + "\"}") +
           MetricValue(m, "pdserve:router_kv_indexed_pages{backend=\"" + b->url() + "\"}");
  };
  double expected_hits = 0;
  for (int k = 0; k < 3; ++k) {
    const double before = indexed();
    const json first = complete(Prefix(k) + "question zero");
    const int prefix_pages = first["prompt_tokens"].get<int>() / 16 - 1;
    // The router learns of the new pages from the instance's event stream.
    ASSERT_TRUE(WaitFor([&] { return indexed() >= before + prefix_pages; }, 30s))
        << router.Metrics();
    for (int q = 1; q <= 3; ++q) {
      const json usage = complete(Prefix(k) + "question " + std::to_string(q));
      EXPECT_GE(usage["prompt_tokens_details"]["cached_tokens"].get<int>(), prefix_pages * 16)
          << "prefix " << k << " question " << q << ": " << usage.dump();
      expected_hits += prefix_pages * 16;
    }
  }
  // The instances' own counters agree: every repeat hit its prefix.
  const std::string hits = "pdserve:prefix_cache_hits_total{model_name=\"tiny\"}";
  EXPECT_GE(MetricValue(a->Metrics(), hits) + MetricValue(b->Metrics(), hits), expected_hits);
}

}  // namespace
}  // namespace pd::server
