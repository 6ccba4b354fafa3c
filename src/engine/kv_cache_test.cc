#include "engine/kv_cache.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace pd::engine {
namespace {

KvCacheSpec SmallSpec(KvLayout layout, KvDType dtype) {
  KvCacheSpec spec;
  spec.num_layers = 3;
  spec.num_kv_heads = 2;
  spec.head_dim = 40;
  spec.page_size = 3;
  spec.layout = layout;
  spec.dtype = dtype;
  return spec;
}

TEST(KvNamesTest, ParseAndName) {
  EXPECT_EQ(KvLayoutName(KvLayout::kNHD), "nhd");
  EXPECT_EQ(KvLayoutName(KvLayout::kHND), "hnd");
  EXPECT_EQ(*ParseKvLayout("nhd"), KvLayout::kNHD);
  EXPECT_EQ(*ParseKvLayout("HND"), KvLayout::kHND);
  EXPECT_EQ(ParseKvLayout("nch").status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ParseKvLayout("nch").status().message().find("nch"), std::string::npos);
  EXPECT_EQ(KvDTypeName(KvDType::kF32), "f32");
  EXPECT_EQ(KvDTypeName(KvDType::kBF16), "bf16");
  EXPECT_EQ(*ParseKvDType("bf16"), KvDType::kBF16);
  EXPECT_EQ(*ParseKvDType("float32"), KvDType::kF32);
  EXPECT_FALSE(ParseKvDType("f16").ok());
}

TEST(KvCacheSpecTest, PageBytesAndOffsets) {
  KvCacheSpec hnd = SmallSpec(KvLayout::kHND, KvDType::kBF16);
  EXPECT_EQ(hnd.page_bytes(), 3u * 2 * 2 * 40 * 2);
  // HND: (head, kv, token, dim); a head's K and V are contiguous.
  EXPECT_EQ(hnd.ElemOffset(0, 1, 0), 2u * 3 * 40);
  EXPECT_EQ(hnd.ElemOffset(2, 0, 1), 3u * 40 + 2 * 40);
  KvCacheSpec nhd = SmallSpec(KvLayout::kNHD, KvDType::kF32);
  EXPECT_EQ(nhd.ElemOffset(1, 0, 0), 2u * 2 * 40);
  EXPECT_EQ(nhd.ElemOffset(0, 1, 1), 3u * 40);
}

TEST(KvRegionTest, OddSizeIsPageAlignedAndZeroed) {
  KvCacheSpec spec = SmallSpec(KvLayout::kNHD, KvDType::kBF16);
  auto region = KvRegion::Create(spec, 7);
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  KvRegion& r = **region;
  const size_t os_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r.base()) % os_page, 0u);
  EXPECT_GE(r.size_bytes(), 7u * 3 * spec.page_bytes());
  EXPECT_EQ(r.size_bytes() % os_page, 0u);
  EXPECT_GE(r.fd(), 0);
  for (size_t i = 0; i < r.size_bytes(); ++i) ASSERT_EQ(r.base()[i], 0) << i;
  EXPECT_EQ(r.BlockOffset(2, 5), (2u * 7 + 5) * spec.page_bytes());
  EXPECT_EQ(r.Block(1, 0), r.base() + 7 * spec.page_bytes());
  // The last block is writable.
  std::memset(r.Block(2, 6), 0xab, spec.page_bytes());
}

TEST(KvRegionTest, SecondMappingOfTheFdSeesWrites) {
  auto region = KvRegion::Create(SmallSpec(KvLayout::kHND, KvDType::kF32), 5);
  ASSERT_TRUE(region.ok());
  KvRegion& r = **region;
  void* other = mmap(nullptr, r.size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, r.fd(), 0);
  ASSERT_NE(other, MAP_FAILED);
  uint8_t* o = static_cast<uint8_t*>(other);
  r.Block(2, 4)[17] = 42;
  EXPECT_EQ(o[r.BlockOffset(2, 4) + 17], 42);
  o[r.BlockOffset(0, 1)] = 7;  // and the other way round
  EXPECT_EQ(r.Block(0, 1)[0], 7);
  munmap(other, r.size_bytes());
}

TEST(KvRegionTest, BadSpecIsAnError) {
  KvCacheSpec spec = SmallSpec(KvLayout::kHND, KvDType::kF32);
  EXPECT_EQ(KvRegion::Create(spec, 0).status().code(), StatusCode::kInvalidArgument);
  spec.page_size = 0;
  auto r = KvRegion::Create(spec, 4);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("page_size=0"), std::string::npos);
}

TEST(KvRegionTest, HugeRegionFailsWithSyscallName) {
  KvCacheSpec spec = SmallSpec(KvLayout::kHND, KvDType::kF32);
  spec.head_dim = 1 << 20;
  spec.num_layers = 1 << 12;
  auto r = KvRegion::Create(spec, 1 << 20);  // far beyond any address space
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_TRUE(m.find("ftruncate") != std::string::npos || m.find("mmap") != std::string::npos) << m;
}

TEST(PagePoolTest, AllocateReleaseAndRefcounts) {
  PagePool pool(5);
  EXPECT_EQ(pool.num_total(), 5);
  EXPECT_EQ(pool.num_free(), 5);
  auto a = pool.Allocate(3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.RefCount(1), 1);
  pool.AddRef(std::vector<int32_t>{1});
  EXPECT_EQ(pool.RefCount(1), 2);
  pool.Release(*a);
  EXPECT_EQ(pool.num_free(), 4);  // page 1 still referenced
  EXPECT_EQ(pool.RefCount(1), 1);
  EXPECT_EQ(pool.RefCount(0), 0);
  pool.Release(std::vector<int32_t>{1});
  EXPECT_EQ(pool.num_free(), 5);
  auto all = pool.Allocate(5);
  ASSERT_TRUE(all.ok());
  std::vector<int32_t> sorted = *all;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int32_t>{0, 1, 2, 3, 4}));
}

TEST(PagePoolTest, ExhaustionAllocatesNothing) {
  PagePool pool(4);
  auto a = pool.Allocate(3);
  ASSERT_TRUE(a.ok());
  auto b = pool.Allocate(2);
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_TRUE(pool.Allocate(1).ok());
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_TRUE(pool.Allocate(0).ok());
  EXPECT_FALSE(pool.Allocate(-1).ok());
}

TEST(PagePoolDeathTest, DoubleReleaseIsABug) {
  PagePool pool(2);
  auto a = pool.Allocate(1);
  ASSERT_TRUE(a.ok());
  pool.Release(*a);
  EXPECT_DEATH(pool.Release(*a), "double release of page 0");
  EXPECT_DEATH(pool.AddRef(std::vector<int32_t>{1}), "AddRef on free page 1");
  EXPECT_DEATH(pool.Release(std::vector<int32_t>{9}), "out of range");
}

}  // namespace
}  // namespace pd::engine
