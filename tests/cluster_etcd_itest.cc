// A cluster found through etcd (cluster/discovery.h), across three network namespaces ("hosts"),
// under steady load through the router, with a real etcd the test starts itself:
//   - a decode instance added mid-run receives requests within 5 s of registering;
//   - a decode instance killed with -9 stops receiving within its lease TTL (plus a second), and
//     its requests end with an error or are retried: none hangs;
//   - a prefill instance drained with SIGTERM exits 0, deregistered, and loses no request;
//   - etcd restarted without its data: every live instance registers again and service goes on;
//   - every answered request's greedy tokens equal a colocated instance's.
// Needs root (namespaces) and Debian's etcd; skipped saying why otherwise.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cluster/etcd_client.h"
#include "cluster/etcd_test_server.h"
#include "cluster/member.h"
#include "tests/disagg_process.h"
#include "tests/three_hosts.h"

namespace pd {
namespace {

using namespace std::chrono_literals;
using testing::Process;
using Clock = std::chrono::steady_clock;

const std::string kBinary = PDSERVE_BINARY;
const std::string kModel = PD_DEMO_MODEL_DIR;
constexpr int kTtlS = 3;
constexpr int kMaxTokens = 6;
constexpr int kRouterPort = 8000, kPrefillPort = 8101, kDecodePort = 8102;

struct Answer {
  std::vector<int> prompt;
  int status = -1;  // -1: no answer within the read timeout (a hang)
  std::string text;
  Clock::time_point start, end;
};

// Steady load of greedy completions through the router, every answer recorded.
class RecordingLoad {
 public:
  RecordingLoad(const std::string& host, int port, int clients) {
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([this, host, port, c] {
        for (int i = 0; !stop_; ++i) {
          Answer a;
          a.prompt = testing::PromptOf(20 + c, i % 16);  // 16 prompts per client, repeated
          a.start = Clock::now();
          auto [status, body] = testing::CompleteAt(host, port, a.prompt, kMaxTokens, 30);
          a.end = Clock::now();
          a.status = status;
          if (status == 200 && body.is_object()) a.text = body["choices"][0].value("text", "");
          std::lock_guard<std::mutex> lock(mu_);
          answers_.push_back(std::move(a));
        }
      });
    }
  }
  ~RecordingLoad() { Stop(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }
  std::vector<Answer> answers() {
    std::lock_guard<std::mutex> lock(mu_);
    return answers_;
  }
  bool SucceedsAfter(Clock::time_point t, std::chrono::milliseconds timeout) {
    return testing::WaitFor(
        [&] {
          std::lock_guard<std::mutex> lock(mu_);
          for (const Answer& a : answers_)
            if (a.start >= t && a.status == 200) return true;
          return false;
        },
        timeout);
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Answer> answers_;
  std::vector<std::thread> threads_;
};

class ClusterEtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    etcd_binary_ = cluster::testing::EtcdServer::Find(&why);
    if (etcd_binary_.empty()) GTEST_SKIP() << why;
    hosts_ = testing::ThreeHosts::Create(&why);
    if (hosts_ == nullptr) GTEST_SKIP() << why;
    etcd_ = std::make_unique<cluster::testing::EtcdServer>(etcd_binary_, hosts_->addr(0));
    ASSERT_TRUE(etcd_->Start(hosts_->In(0, {})).ok());
    secret_ = testing::WriteTempFile(testing::TempPathFor("pd_etcd_itest_", "secret"),
                                     "etcd-itest-secret\n");
  }
  void TearDown() override {
    procs_.clear();
    etcd_.reset();
    hosts_.reset();
    if (!secret_.empty()) std::remove(secret_.c_str());
  }
  std::vector<std::string> Discovery() const {
    return {"--cluster-secret-file",
            secret_,
            "--discovery",
            etcd_->url(),
            "--cluster",
            "itest",
            "--discovery-ttl-s",
            std::to_string(kTtlS)};
  }
  // Starts `role` on host k and waits for its ready line.
  Process* StartInstance(const std::string& name, int k, const std::string& role) {
    std::vector<std::string> extra = {"--role",
                                      role,
                                      "--host",
                                      hosts_->addr(k),
                                      "--fabric-node",
                                      hosts_->addr(k),
                                      "--drain-timeout-s",
                                      "10"};
    const std::vector<std::string> d = Discovery();
    extra.insert(extra.end(), d.begin(), d.end());
    if (role == "decode")  // every prompt goes through a discovered prefill instance
      extra.insert(extra.end(), testing::kTransferEveryPrompt.begin(),
                   testing::kTransferEveryPrompt.end());
    const int port = role == "prefill" ? kPrefillPort : kDecodePort;
    auto& p = procs_[name];
    p = std::make_unique<Process>();
    const auto started = testing::StartAndWaitFor(
        *p, hosts_->In(k, testing::ServeArgv(kBinary, kModel, port, 2048, extra)),
        role == "prefill" ? "prefill instance on" : "pdserve: serving", 120s);
    EXPECT_TRUE(started) << name;
    return started ? p.get() : nullptr;
  }
  double Metric(int k, int port, const std::string& name, const std::string& labels = "") {
    return testing::MetricSum(hosts_->addr(k), port, name, labels);
  }
  std::vector<cluster::KeyValue> Keys(const std::string& role) {
    cluster::EtcdClient client(etcd_->options());
    auto r = client.RangePrefix(cluster::RolePrefix("itest", role));
    return r.ok() ? r->kvs : std::vector<cluster::KeyValue>();
  }

  std::string etcd_binary_, secret_;
  std::unique_ptr<testing::ThreeHosts> hosts_;
  std::unique_ptr<cluster::testing::EtcdServer> etcd_;
  std::map<std::string, std::unique_ptr<Process>> procs_;
};

TEST_F(ClusterEtcdTest, MembersJoinDieDrainAndReRegisterUnderLoad) {
  // Host 0: etcd, prefill 0, the router. Host 1: prefill 1, decode 0. Host 2: decode 1 (later).
  ASSERT_NE(StartInstance("prefill0", 0, "prefill"), nullptr);
  ASSERT_NE(StartInstance("prefill1", 1, "prefill"), nullptr);
  ASSERT_NE(StartInstance("decode0", 1, "decode"), nullptr);
  const std::vector<std::string> router = {kBinary,
                                           "router",
                                           "--host",
                                           hosts_->addr(0),
                                           "--port",
                                           std::to_string(kRouterPort),
                                           "--discovery",
                                           etcd_->url(),
                                           "--cluster",
                                           "itest",
                                           "--cluster-secret-file",
                                           secret_};
  auto& rp = procs_["router"];
  rp = std::make_unique<Process>();
  ASSERT_TRUE(testing::StartAndWaitFor(*rp, hosts_->In(0, router), "router on", 30s));
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        return Metric(0, kRouterPort, "pdserve:router_backends") == 1 &&
               Metric(1, kDecodePort, "pdserve:kv_prefill_peers", "state=\"accepted\"") == 2;
      },
      30s));

  RecordingLoad load(hosts_->addr(0), kRouterPort, 2);
  ASSERT_TRUE(load.SucceedsAfter(Clock::now(), 30s));

  // A decode instance joins: requests within 5 s of its registration.
  ASSERT_NE(StartInstance("decode1", 2, "decode"), nullptr);
  const auto joined = Clock::now();
  ASSERT_TRUE(testing::WaitFor(
      [&] { return Metric(2, kDecodePort, "pdserve:request_success_total") > 0; }, 20s));
  const double join_s = std::chrono::duration<double>(Clock::now() - joined).count();
  EXPECT_LT(join_s, 5.0);

  // kill -9 of decode 0: out of the router within its TTL.
  const auto killed = Clock::now();
  ASSERT_EQ(procs_["decode0"]->Stop(SIGKILL, 10s), 128 + SIGKILL);
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        return Metric(0, kRouterPort, "pdserve:router_backends") == 1 && Keys("decode").size() == 1;
      },
      std::chrono::seconds(kTtlS + 5)));
  const auto dropped = Clock::now();
  const double drop_s = std::chrono::duration<double>(dropped - killed).count();
  EXPECT_LE(drop_s, kTtlS + 1.0);

  // SIGTERM drains prefill 1: deregistered, exit 0, no request lost meanwhile.
  const auto term = Clock::now();
  ASSERT_EQ(procs_["prefill1"]->Stop(SIGTERM, 30s), 0) << procs_["prefill1"]->output();
  const auto drained = Clock::now();
  EXPECT_EQ(Keys("prefill").size(), 1u);
  ASSERT_TRUE(load.SucceedsAfter(drained, 20s));

  // etcd restarted without its data: everyone alive registers again.
  etcd_->Kill();
  etcd_->WipeData();
  ASSERT_TRUE(etcd_->Start(hosts_->In(0, {})).ok());
  const auto restarted = Clock::now();
  ASSERT_TRUE(testing::WaitFor(
      [&] { return Keys("prefill").size() == 1 && Keys("decode").size() == 1; }, 20s));
  const double reregister_s = std::chrono::duration<double>(Clock::now() - restarted).count();
  ASSERT_TRUE(load.SucceedsAfter(Clock::now(), 20s));
  load.Stop();

  // Every answer came (none hung); every 200 has a colocated instance's greedy text.
  Process colocated;
  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  const int coloc_port = testing::PickPortBlock(rng, 27000);
  ASSERT_TRUE(testing::StartAndWaitFor(colocated,
                                       testing::ServeArgv(kBinary, kModel, coloc_port, 2048, {}),
                                       "pdserve: serving", 60s));
  std::map<std::vector<int>, std::string> reference;
  int ok = 0, errors = 0, lost_in_drain = 0;
  for (const Answer& a : load.answers()) {
    ASSERT_NE(a.status, -1) << "a request hung";
    if (a.status != 200) {
      ++errors;
      // Only requests in flight on the killed decode instance may fail.
      if (a.start >= dropped && a.end <= drained) ++lost_in_drain;
      continue;
    }
    ++ok;
    if (reference.count(a.prompt) == 0) {
      auto [status, body] = testing::CompleteAt("127.0.0.1", coloc_port, a.prompt, kMaxTokens);
      ASSERT_EQ(status, 200);
      reference[a.prompt] = body["choices"][0].value("text", "");
    }
    EXPECT_EQ(a.text, reference[a.prompt]);
  }
  EXPECT_EQ(lost_in_drain, 0) << "requests failed while prefill 1 drained";
  std::printf(
      "[ measured ] decode joined -> first request %.2f s; kill -9 -> out of the router %.2f s "
      "(TTL %d s); prefill SIGTERM -> exit 0 %.2f s; etcd restart -> all re-registered %.2f s; "
      "%d answered (all equal to colocated), %d errors\n",
      join_s, drop_s, kTtlS, std::chrono::duration<double>(drained - term).count(), reregister_s,
      ok, errors);
  if (HasFailure()) {
    for (auto& [name, p] : procs_) ADD_FAILURE() << name << ":\n" << p->output();
  }
}

}  // namespace
}  // namespace pd
