#include "planner/trace_replay.h"

#include <gtest/gtest.h>

#include "planner/test_data.h"

namespace pd::planner {
namespace {

TEST(TraceReplay, MatchesAllAGlobOrOneName) {
  PD_REQUIRE_DISTSERVE_DATA();
  const std::string dir = testing::DistServeDir();
  auto all = MatchTraces(dir, "all");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->size(), 37u);
  EXPECT_TRUE(std::is_sorted(all->begin(), all->end()));
  auto c21d12 = MatchTraces(dir, "distserve-c21d12-*");
  ASSERT_TRUE(c21d12.ok());
  EXPECT_EQ(c21d12->size(), 7u);
  auto one = MatchTraces(dir, "vllm-150-1.5.json");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, std::vector<std::string>{"vllm-150-1.5"});
  EXPECT_EQ(MatchTraces(dir, "sglang-*").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(MatchTraces("/no/such/dir", "all").status().code(), StatusCode::kNotFound);
}

TEST(TraceReplay, ATraceWithADecimalRateReplaysBesideItsMeasurements) {
  PD_REQUIRE_DISTSERVE_DATA();
  SetupOptions o;  // opt-13b on A100 with DistServe's profile, SLO 0.25 s / 0.1 s
  auto setup = BuildPlannerSetup(o);
  ASSERT_TRUE(setup.ok()) << setup.status().ToString();
  auto r = ReplayTrace(**setup, o.distserve_dir, "distserve-c21d11-300-4.5");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->system, "c21d11");
  EXPECT_DOUBLE_EQ(r->rate, 4.5);
  EXPECT_FALSE(r->assumed);
  EXPECT_TRUE(r->spec.disaggregated);
  EXPECT_EQ(r->num_requests, 300u);
  EXPECT_EQ(r->simulated.num_requests, 300);
  EXPECT_EQ(r->measured.num_requests, 300);
  EXPECT_NEAR(r->measured.attainment, 0.967, 0.001);  // what the real system did
  EXPECT_GT(r->simulated.attainment, 0.5);

  auto plain = ReplayTrace(**setup, o.distserve_dir, "distserve-100-1");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->assumed);
  EXPECT_EQ(plain->system, "distserve");
  const std::string table = FormatReplayTable({*r, *plain});
  EXPECT_NE(table.find("distserve-c21d11-300-4.5"), std::string::npos);
  EXPECT_NE(table.find("c21d11     1 traces"), std::string::npos);
  EXPECT_NE(table.find("distserve  1 traces"), std::string::npos);
  EXPECT_EQ(ReplayTrace(**setup, o.distserve_dir, "vllm-999-9").status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace pd::planner
