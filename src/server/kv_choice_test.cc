// The KV-aware choice shared by the router and the decode instance (kv_choice.h): the candidates'
// cached pages per the index, and KvPeerChooser, which a decode instance uses to pick its prefill
// instance, fed by real GET /v1/kv_events streams (test_kv_backend.h).
#include "server/kv_choice.h"

#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <string>
#include <vector>

#include "engine/prefix_cache.h"
#include "server/test_http.h"
#include "server/test_kv_backend.h"

namespace pd::server {
namespace {

using namespace std::chrono_literals;
using testing::KvBackend;
constexpr int kPage = testing::kKvBackendPage;

std::vector<int32_t> Prompt(int first, int n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

KvPeerChooserOptions Options(const std::string& api_key = "") {
  KvPeerChooserOptions o;
  o.feed.api_key = api_key;
  o.feed.check_tokenizer = false;  // ids travel, not text
  o.feed.wait_ms = 50;
  o.feed.retry_ms = 50;
  return o;
}

bool WaitSynced(const KvPeerChooser& c, const std::string& url) {
  return testing::WaitFor([&] { return c.index().State(url).synced; }, 10s);
}

TEST(KvCandidatesForTest, CountsTheLeadingCachedPagesInEachPeersFormat) {
  KvIndex index;
  const std::vector<int32_t> prompt = Prompt(100, 4 * kPage + 1);  // 4 full pages before the last
  std::vector<uint64_t> keys;
  engine::ExtendPageKeys(7, std::span(prompt).first(3 * kPage), kPage, &keys);  // 3 of them
  engine::KvEventBatch snap;
  snap.epoch = 1;
  snap.root = 7;
  snap.page_size = kPage;
  snap.snapshot = true;
  snap.keys = {keys[0], keys[2]};  // the second page is missing: only the first counts
  index.ApplySnapshot("a", snap);
  snap.keys = keys;
  index.ApplySnapshot("b", snap);
  snap.root = 8;  // another KV format: none of the prompt's keys in it
  index.ApplySnapshot("c", snap);
  const KvPeerLoad peers[] = {{"a", 0}, {"b", 3}, {"c", 0}, {"unsynced", 1}};
  const std::vector<KvCandidate> c = KvCandidatesFor(index, prompt, peers);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].prompt_pages, 4);
  EXPECT_EQ(c[0].cached_pages, 1);
  EXPECT_EQ(c[1].cached_pages, 3);
  EXPECT_EQ(c[1].load, 3);
  EXPECT_EQ(c[2].cached_pages, 0);
  EXPECT_EQ(c[3].cached_pages, -1);
  EXPECT_EQ(c[3].prompt_pages, 4);
  EXPECT_EQ(c[3].load, 1);
}

TEST(KvPeerChooserTest, PicksThePrefillInstanceHoldingThePrefixUnlessItIsTooBusy) {
  const std::string key = "secret";
  KvBackend a(/*tokenizer_fingerprint=*/1, key), b(/*tokenizer_fingerprint=*/2, key);
  const std::vector<int32_t> prompt_a = Prompt(10, 16 * kPage + 3);
  const std::vector<int32_t> prompt_b = Prompt(500, 16 * kPage + 3);
  a.Cache(prompt_a);
  b.Cache(prompt_b);
  const std::string ua = a.url(), ub = b.url();  // KvPeerLoad borrows the names
  KvPeerChooser chooser(Options(key));
  chooser.SetPeers({ua, ub});
  ASSERT_TRUE(WaitSynced(chooser, ua)) << chooser.index().State(ua).why_unsynced;
  ASSERT_TRUE(WaitSynced(chooser, ub)) << chooser.index().State(ub).why_unsynced;
  const KvPeerLoad idle[] = {{ua, 0}, {ub, 0}};
  for (int i = 0; i < 2; ++i) {  // each twice in a row: ties would go round
    EXPECT_EQ(chooser.Choose(prompt_a, idle), 0);
    EXPECT_EQ(chooser.Choose(prompt_a, idle), 0);
    EXPECT_EQ(chooser.Choose(prompt_b, idle), 1);
    EXPECT_EQ(chooser.Choose(prompt_b, idle), 1);
  }
  // 16 pages cached against 4 pages per transfer in flight: 5 in flight outweigh them.
  const KvPeerLoad busy[] = {{ua, 5}, {ub, 0}};
  EXPECT_EQ(chooser.Choose(prompt_a, busy), 1);
  EXPECT_EQ(chooser.Choose(prompt_a, busy), 1);
  // A key stored later arrives as an event and moves the choice.
  const std::vector<int32_t> prompt_c = Prompt(900, 8 * kPage + 1);
  b.Cache(prompt_c);
  ASSERT_TRUE(testing::WaitFor([&] { return chooser.index().State(ub).num_keys == 16 + 8; }, 10s));
  EXPECT_EQ(chooser.Choose(prompt_c, idle), 1);
  EXPECT_EQ(chooser.Choose(prompt_c, idle), 1);
  const std::string m = chooser.MetricsText("pdserve:prefill_kv");
  EXPECT_NE(m.find("pdserve:prefill_kv_synced{peer=\"" + ua + "\"} 1"), std::string::npos) << m;
  EXPECT_EQ(testing::MetricValue(m, "pdserve:prefill_kv_cached_pages_total"), 8 * 16 + 2 * 8) << m;
  // A peer left out stops being followed and leaves the index.
  chooser.SetPeers({ub});
  EXPECT_EQ(chooser.index().Backends(), std::vector<std::string>{ub});
}

TEST(KvPeerChooserTest, AWrongApiKeyLeavesThePeerUnsyncedAndChosenByLoad) {
  KvBackend a(1, "right"), b(1, /*api_key=*/"");
  const std::vector<int32_t> prompt = Prompt(10, 8 * kPage + 1);
  a.Cache(prompt);
  const std::string ua = a.url(), ub = b.url();
  KvPeerChooser chooser(Options("wrong"));
  chooser.SetPeers({ua, ub});
  ASSERT_TRUE(WaitSynced(chooser, ub));
  ASSERT_TRUE(testing::WaitFor(
      [&] { return chooser.index().State(ua).why_unsynced.find("401") != std::string::npos; }, 10s))
      << chooser.index().State(ua).why_unsynced;
  // Known, a's 8 cached pages would outweigh its transfer in flight; unknown, its cache counts as
  // b's (nothing), and the less loaded wins.
  const KvPeerLoad peers[] = {{ua, 1}, {ub, 0}};
  EXPECT_EQ(chooser.Choose(prompt, peers), 1);
}

}  // namespace
}  // namespace pd::server
