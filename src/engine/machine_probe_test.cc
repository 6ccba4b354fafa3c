#include "engine/machine_probe.h"

#include <gtest/gtest.h>

#include "engine/thread_pool.h"

namespace pd::engine {
namespace {

TEST(MachineProbeTest, ReadBandwidthIsPositiveAndRepeatable) {
  ThreadPool pool(2);
  auto probe = ReadBandwidthProbe::Create(pool, {size_t{8} << 20, 2});
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  EXPECT_EQ((*probe)->buffer_bytes() % (2 * 4096), 0u);
  EXPECT_LE((*probe)->buffer_bytes(), size_t{8} << 20);
  EXPECT_GT((*probe)->Measure(), 0.0);
  EXPECT_GT((*probe)->Measure(), 0.0);
}

TEST(MachineProbeTest, RejectsATinyBuffer) {
  ThreadPool pool(1);
  auto probe = ReadBandwidthProbe::Create(pool, {size_t{1} << 19, 1});
  ASSERT_FALSE(probe.ok());
  EXPECT_EQ(probe.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(probe.status().ToString().find("under 1 MiB"), std::string::npos);
  EXPECT_FALSE(MeasureReadBandwidth(pool, {1000, 1}).ok());
}

TEST(MachineProbeTest, PeakGflopsIsPositive) {
  ThreadPool pool(2);
  EXPECT_GT(MeasurePeakGflops(pool, 20000), 0.0);
}

TEST(MachineProbeTest, Bf16DotPeakIsPositiveWhenSupported) {
  ThreadPool pool(2);
  Result<double> gflops = MeasurePeakBf16DotGflops(pool, 20000);
  if (!DetectCpuFeatures().avx512_bf16) {
    EXPECT_EQ(gflops.status().code(), StatusCode::kUnimplemented);
    GTEST_SKIP() << "this CPU has no avx512_bf16";
  }
  ASSERT_TRUE(gflops.ok()) << gflops.status().ToString();
  EXPECT_GT(*gflops, 0.0);
}

TEST(MachineProbeTest, Bf16DotPeakIsUnimplementedWithoutTheFeature) {
  ThreadPool pool(1);
  CpuFeatures without = DetectCpuFeatures();
  without.avx512_bf16 = false;
  Result<double> gflops = MeasurePeakBf16DotGflops(pool, 20000, without);
  ASSERT_FALSE(gflops.ok());
  EXPECT_EQ(gflops.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(gflops.status().ToString().find("avx512_bf16"), std::string::npos);
}

TEST(MachineProbeTest, LastLevelCacheIsKnownOnLinux) {
  // sysfs may be absent in some containers; when present the size is at least 64 KiB.
  const size_t llc = LastLevelCacheBytes();
  if (llc == 0) GTEST_SKIP() << "no cache information in sysfs";
  EXPECT_GE(llc, size_t{64} << 10);
}

}  // namespace
}  // namespace pd::engine
