// The prefix index and the page pool's cached-evictable pages: matching, collisions, LRU
// eviction (descendants go with their parent), acquisition all-or-nothing, and the recount.
#include "engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "engine/kv_cache.h"

namespace pd::engine {
namespace {

constexpr int kPage = 4;

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = i * 7 + salt;
  return t;
}

std::vector<uint64_t> Keys(const std::vector<int32_t>& tokens, uint64_t root = 1) {
  std::vector<uint64_t> keys;
  ExtendPageKeys(root, tokens, kPage, &keys);
  return keys;
}

// Registers pages as a chain holding tokens' full pages.
void RegisterChain(PagePool& pool, const std::vector<int32_t>& pages,
                   const std::vector<int32_t>& tokens) {
  const std::vector<uint64_t> keys = Keys(tokens);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(pool.Register(pages[i], i == 0 ? -1 : pages[i - 1], keys[i],
                              std::span<const int32_t>(tokens).subspan(i * kPage, kPage)));
  }
}

TEST(PrefixCacheKeysTest, KeysChainAndDependOnTheRoot) {
  const auto a = Tokens(10, 0);
  auto b = a;
  b[1] += 1;  // differs in page 0 only
  const auto ka = Keys(a), kb = Keys(b);
  ASSERT_EQ(ka.size(), 2u);  // 10 tokens: 2 full pages
  EXPECT_NE(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]) << "page 1's key depends on page 0's tokens";
  EXPECT_NE(Keys(a, 2)[0], ka[0]) << "the root (model, KV format) is in every key";
  KvCacheSpec f32, bf16;
  bf16.dtype = KvDType::kBF16;
  EXPECT_NE(PrefixCacheRoot(5, f32), PrefixCacheRoot(5, bf16));
  KvCacheSpec fp8;
  fp8.dtype = KvDType::kFP8E4M3;
  fp8.num_layers = 2;
  EXPECT_NE(PrefixCacheRoot(5, fp8), PrefixCacheRoot(5, f32));
  EXPECT_NE(PrefixCacheRoot(5, fp8), PrefixCacheRoot(5, bf16));
  KvCacheSpec fp8_scaled = fp8;
  fp8_scaled.scales = {{1.0f, 1.0f}, {0.5f, 1.0f}};
  EXPECT_NE(PrefixCacheRoot(5, fp8), PrefixCacheRoot(5, fp8_scaled)) << "the scales are in it";
  EXPECT_NE(PrefixCacheRoot(5, f32), PrefixCacheRoot(6, f32));
  std::vector<uint64_t> grown = {ka[0]};
  ExtendPageKeys(1, a, kPage, &grown);
  EXPECT_EQ(grown, ka);
}

TEST(PrefixCachePoolTest, ReleasedPagesStayCachedUntilThePoolNeedsThem) {
  PagePool pool(6, kPage);
  const auto tokens = Tokens(13, 0);  // 3 full pages
  auto pages = pool.Allocate(4);
  ASSERT_TRUE(pages.ok());
  RegisterChain(pool, *pages, tokens);
  EXPECT_EQ(pool.num_cached(), 3);
  pool.Release(*pages);
  EXPECT_EQ(pool.num_free(), 6) << "cached-evictable pages count as free";
  EXPECT_EQ(pool.num_evictable(), 3);
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency().ToString();

  // A longer query sharing 2 pages then differing.
  auto query = tokens;
  query[9] += 1;
  const auto hits = pool.MatchPrefix(Keys(query), query);
  EXPECT_EQ(hits, std::vector<int32_t>(pages->begin(), pages->begin() + 2));
  auto got = pool.AcquirePrefix(hits, 2);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->size(), 4u);
  EXPECT_EQ(pool.RefCount((*pages)[0]), 1);
  EXPECT_EQ(pool.num_evictable(), 1) << "the third page is still cached, unreferenced";
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency().ToString();
  pool.Release(*got);
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency().ToString();
}

TEST(PrefixCachePoolTest, EvictionTakesTheLeastRecentTailFirstAndDescendantsWithIt) {
  PagePool pool(4, kPage);
  const auto a = Tokens(8, 0), b = Tokens(8, 100);
  auto pa = pool.Allocate(2);
  ASSERT_TRUE(pa.ok());
  RegisterChain(pool, *pa, a);
  pool.Release(*pa);  // a's page 1 is evicted before its page 0
  auto pb = pool.Allocate(2);
  ASSERT_TRUE(pb.ok());
  RegisterChain(pool, *pb, b);
  pool.Release(*pb);
  EXPECT_EQ(pool.num_evictable(), 4);
  auto one = pool.Allocate(1);  // evicts a's page 1
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)[0], (*pa)[1]);
  EXPECT_EQ(pool.MatchPrefix(Keys(a), a).size(), 1u);
  EXPECT_EQ(pool.MatchPrefix(Keys(b), b).size(), 2u);
  pool.Release(*one);
  // Evicting a's page 0 (next in line) also uncaches nothing else; then b's pages go, tail first.
  auto three = pool.Allocate(3);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(pool.MatchPrefix(Keys(a), a).size(), 0u);
  EXPECT_EQ(pool.num_cached(), 1);
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency().ToString();
  pool.Release(*three);

  // A parent evicted while its child is referenced: the child is uncached too, and freed (not
  // cached) when its reference goes.
  PagePool p2(3, kPage);
  auto chain = p2.Allocate(2);
  ASSERT_TRUE(chain.ok());
  RegisterChain(p2, *chain, a);
  p2.Release(std::span<const int32_t>(*chain).first(1));  // only the parent is unreferenced
  auto two = p2.Allocate(2);                              // the free page and the parent
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(p2.num_cached(), 0);
  p2.Release(std::span<const int32_t>(*chain).subspan(1));
  EXPECT_EQ(p2.num_evictable(), 0);
  ASSERT_TRUE(p2.CheckConsistency().ok()) << p2.CheckConsistency().ToString();
  p2.Release(*two);
  EXPECT_EQ(p2.num_free(), 3);
}

TEST(PrefixCachePoolTest, AcquireIsAllOrNothingAndDoesNotEvictItsOwnHits) {
  PagePool pool(3, kPage);
  const auto a = Tokens(8, 0);
  auto pa = pool.Allocate(2);
  ASSERT_TRUE(pa.ok());
  RegisterChain(pool, *pa, a);
  pool.Release(*pa);
  const auto hits = pool.MatchPrefix(Keys(a), a);
  ASSERT_EQ(hits.size(), 2u);
  // 3 pages, 2 of them the hits: 1 new page fits, 2 do not.
  auto too_many = pool.AcquirePrefix(hits, 2);
  EXPECT_EQ(too_many.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.num_evictable(), 2) << "nothing taken";
  auto ok = pool.AcquirePrefix(hits, 1);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(std::vector<int32_t>(ok->begin(), ok->begin() + 2), hits);
  EXPECT_EQ(pool.num_cached(), 2);
  pool.Release(*ok);
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency().ToString();
}

TEST(PrefixCacheIndexTest, ACollidingKeyNeverMatchesAnotherPrefix) {
  // Keys forged to collide: every page of both prompts gets the same key sequence.
  PrefixIndex index(8, kPage);
  const auto a = Tokens(8, 0), b = Tokens(8, 50);
  const std::vector<uint64_t> keys = {42, 43};
  ASSERT_TRUE(index.Insert(0, -1, keys[0], std::span<const int32_t>(a).first(kPage)));
  ASSERT_TRUE(index.Insert(1, 0, keys[1], std::span<const int32_t>(a).subspan(kPage)));
  EXPECT_EQ(index.Match(keys, a), (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(index.Match(keys, b).empty()) << "same keys, other tokens";
  // Same first page, other second page: only the first matches.
  auto c = a;
  c[6] = 999;
  EXPECT_EQ(index.Match(keys, c), (std::vector<int32_t>{0}));
  // The key is taken: b's page cannot be registered under it.
  EXPECT_FALSE(index.Insert(2, -1, keys[0], std::span<const int32_t>(b).first(kPage)));
  // A page whose parent is not the matched page is not accepted, even with the right tokens.
  PrefixIndex other(8, kPage);
  ASSERT_TRUE(other.Insert(0, -1, 7, std::span<const int32_t>(b).first(kPage)));
  ASSERT_TRUE(other.Insert(3, -1, 42, std::span<const int32_t>(a).first(kPage)));
  ASSERT_TRUE(other.Insert(1, 0, 43, std::span<const int32_t>(a).subspan(kPage)));
  EXPECT_EQ(other.Match(keys, a), (std::vector<int32_t>{3})) << "page 1's parent is b's page";
  std::vector<int32_t> removed;
  other.Remove(0, &removed);
  EXPECT_EQ(removed, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(other.CheckConsistency().ok()) << other.CheckConsistency().ToString();
  EXPECT_EQ(other.num_cached(), 1);
}

TEST(PrefixCachePoolTest, WithoutAPrefixPageSizeNothingIsCached) {
  PagePool pool(2);
  EXPECT_FALSE(pool.prefix_caching());
  auto p = pool.Allocate(1);
  ASSERT_TRUE(p.ok());
  const auto t = Tokens(4, 0);
  EXPECT_FALSE(pool.Register((*p)[0], -1, 1, t));
  pool.Release(*p);
  EXPECT_EQ(pool.num_evictable(), 0);
  EXPECT_TRUE(pool.MatchPrefix(Keys(t), t).empty());
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

}  // namespace
}  // namespace pd::engine
