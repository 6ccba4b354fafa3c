// KV-aware routing against plain HTTP backends that publish a real KvEventLog at
// GET /v1/kv_events: a prompt goes where its prefix is cached, a backend that tokenizes
// differently or whose stream fails is routed by load only (and resnapshots once it answers
// again), and a backend removed from the router leaves the index.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/kv_events.h"
#include "engine/prefix_cache.h"
#include "server/kv_events_wire.h"
#include "server/prompt_tokens.h"
#include "server/router.h"
#include "server/test_fakes.h"
#include "server/test_http.h"
#include "server/test_kv_backend.h"

namespace pd::server {
namespace {

using namespace std::chrono_literals;
constexpr int kPage = testing::kKvBackendPage;
constexpr uint64_t kRoot = testing::kKvBackendRoot;

using testing::KvBackend;

class RouterKvTest : public ::testing::Test {
 protected:
  std::unique_ptr<Router> Start(const std::vector<std::string>& backends, bool dynamic = false) {
    RouterOptions o;
    o.port = 0;
    o.http.num_threads = 2;
    o.backends = backends;
    o.dynamic_backends = dynamic;
    o.routing = RoutingPolicy::kKvAware;
    o.kv.tokenizer = &tokenizer_;
    o.kv.wait_ms = 200;
    o.kv.retry_ms = 20;
    auto r = Router::Create(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return nullptr;
    EXPECT_TRUE((*r)->Start().ok());
    return std::move(r).value();
  }
  bool WaitSynced(const Router& r, const std::string& url, size_t min_keys) {
    return testing::WaitFor(
        [&] {
          const KvBackendState s = r.kv_index()->State(url);
          return s.synced && s.num_keys >= min_keys;
        },
        10s);
  }
  // The prompt as text, or (ids) as its token ids, as benchmark clients send it.
  void Complete(const Router& r, const std::string& prompt, bool ids = false) {
    httplib::Client c("127.0.0.1", r.port());
    c.set_read_timeout(10, 0);
    nlohmann::json body = {{"max_tokens", 1}, {"logprobs", 25}};
    if (ids) {
      body["prompt"] = Tokens(prompt);
    } else {
      body["prompt"] = prompt;
    }
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
  }
  std::vector<int32_t> Tokens(const std::string& prompt) { return tokenizer_.Encode(prompt); }

  testing::FakeTokenizer tokenizer_;
  const uint64_t fingerprint_ = TokenizerFingerprint(tokenizer_);
};

const std::string kPrefixA = "You are a helpful assistant who answers in French only. ";
const std::string kPrefixB = "Summarise the following legal document in three bullet points. ";

TEST_F(RouterKvTest, APromptGoesWhereItsPrefixIsCached) {
  KvBackend a(fingerprint_), b(fingerprint_);
  a.Cache(Tokens(kPrefixA + "Q0"));
  b.Cache(Tokens(kPrefixB + "Q0"));
  auto router = Start({a.url(), b.url()});
  ASSERT_NE(router, nullptr);
  ASSERT_TRUE(WaitSynced(*router, a.url(), 10));
  ASSERT_TRUE(WaitSynced(*router, b.url(), 10));
  for (int i = 1; i <= 4; ++i) {
    Complete(*router, kPrefixA + "Q" + std::to_string(i));
    Complete(*router, kPrefixB + "Q" + std::to_string(i));
  }
  EXPECT_EQ(a.completions(), 4);
  EXPECT_EQ(b.completions(), 4);
  // Token ids (any id and logprobs count: the instance checks them) route the same way.
  Complete(*router, kPrefixB + "Q9", /*ids=*/true);
  EXPECT_EQ(b.completions(), 5);
  // A key stored after the snapshot arrives as an event and moves the choice.
  const std::string prefix_c = "Translate this paragraph into formal German, keeping names. ";
  b.Cache(Tokens(prefix_c + "Q0"));
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        const std::vector<int32_t> t = Tokens(prefix_c + "Q1");
        std::vector<uint64_t> keys;
        engine::ExtendPageKeys(kRoot, std::span(t).first(8), kPage, &keys);
        return router->kv_index()->CachedPages(b.url(), keys) == 2;
      },
      10s));
  Complete(*router, prefix_c + "Q1");
  EXPECT_EQ(b.completions(), 6);
  const std::string metrics = httplib::Client("127.0.0.1", router->port()).Get("/metrics")->body;
  EXPECT_NE(metrics.find("pdserve:router_kv_synced{backend=\"" + a.url() + "\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_GT(testing::MetricValue(metrics, "pdserve:router_kv_cached_pages_total"), 100);
}

TEST_F(RouterKvTest, AnotherTokenizerOrAFailingStreamIsRoutedByLoadOnly) {
  KvBackend a(fingerprint_ + 1), b(fingerprint_);
  a.Cache(Tokens(kPrefixA));
  auto router = Start({a.url(), b.url()});
  ASSERT_NE(router, nullptr);
  ASSERT_TRUE(WaitSynced(*router, b.url(), 0));
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        return router->kv_index()->State(a.url()).why_unsynced.find("tokenizes differently") !=
               std::string::npos;
      },
      10s))
      << router->kv_index()->State(a.url()).why_unsynced;
  // A is unsynced: it counts as caching what B does (nothing), so requests spread by load.
  for (int i = 0; i < 4; ++i) Complete(*router, kPrefixA + "Q" + std::to_string(i));
  EXPECT_GE(a.completions(), 1);
  EXPECT_GE(b.completions(), 1);

  a.set_fingerprint(fingerprint_);  // fixed: A resnapshots
  ASSERT_TRUE(WaitSynced(*router, a.url(), 10));
  const uint64_t snapshots = router->kv_index()->State(a.url()).snapshots;
  a.set_failing(true);
  ASSERT_TRUE(testing::WaitFor([&] { return !router->kv_index()->State(a.url()).synced; }, 10s));
  a.set_failing(false);
  ASSERT_TRUE(WaitSynced(*router, a.url(), 10));
  EXPECT_GT(router->kv_index()->State(a.url()).snapshots, snapshots);
}

TEST_F(RouterKvTest, ABackendRemovedLeavesTheIndex) {
  KvBackend a(fingerprint_), b(fingerprint_);
  auto router = Start({a.url(), b.url()}, /*dynamic=*/true);
  ASSERT_NE(router, nullptr);
  ASSERT_TRUE(WaitSynced(*router, a.url(), 0));
  ASSERT_TRUE(WaitSynced(*router, b.url(), 0));
  ASSERT_TRUE(router->SetBackends({b.url()}).ok());
  EXPECT_EQ(router->kv_index()->Backends(), std::vector<std::string>{b.url()});
}

TEST(RoutingPolicyTest, ParsesTheThreeNamesAndKvAwareNeedsATokenizer) {
  for (const char* name : {"round-robin", "least-loaded", "kv-aware"}) {
    auto p = ParseRoutingPolicy(name);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(RoutingPolicyName(*p), name);
  }
  EXPECT_NE(ParseRoutingPolicy("random").status().message().find("kv-aware"), std::string::npos);
  RouterOptions o;
  o.backends = {"http://127.0.0.1:1"};
  o.routing = RoutingPolicy::kKvAware;
  auto r = Router::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tokenizer"), std::string::npos);
}

}  // namespace
}  // namespace pd::server
