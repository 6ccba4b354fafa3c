#include "planner/engine_scheduler.h"

#include <gtest/gtest.h>

#include "planner/test_data.h"

namespace pd::planner {
namespace {

std::vector<SimRequest> Workload(double rate, int n) {
  std::vector<LengthPair> lengths = {{200, 20}, {800, 60}, {400, 5}, {1200, 120}, {100, 200}};
  ArrivalOptions a;
  a.num_requests = n;
  a.seed = 3;
  return AtRate(MakeUnitRateWorkload(lengths, a), rate);
}

StepCoeffs Coeffs() {
  StepCoeffs c;
  c.prefill = {18, 0.1, 7e-6};
  c.decode_small = c.decode_large = {20, 6e-4, 0.04};
  return c;
}

// The engine's scheduler and the native one implement the same policy: same step count and
// latencies on a colocated instance without KV pressure.
TEST(EngineScheduler, MatchesNativeSchedulerOnColocatedInstance) {
  InstanceConfig inst;
  inst.coeffs = Coeffs();
  inst.policy.max_num_batched_tokens = 2048;
  const auto reqs = Workload(2.0, 200);
  SimOptions native, engine;
  engine.make_scheduler = EngineSchedulerFactory();
  auto a = Simulate({&inst, 1}, ClusterLinks{}, reqs, native);
  auto b = Simulate({&inst, 1}, ClusterLinks{}, reqs, engine);
  ASSERT_TRUE(a.ok() && b.ok());
  const Slo slo{0.3, 0.035};
  const Summary sa = Summarize(a->requests, slo), sb = Summarize(b->requests, slo);
  std::printf("native: %lld steps, attainment %.3f; engine: %lld steps, attainment %.3f\n",
              (long long)a->num_steps, sa.attainment, (long long)b->num_steps, sb.attainment);
  EXPECT_EQ(sb.num_failed, 0);
  EXPECT_EQ(a->num_steps, b->num_steps);
  EXPECT_LT(sa.attainment, 1.0);  // the SLO binds, so the comparison means something
  EXPECT_NEAR(sa.attainment, sb.attainment, 0.03);
  EXPECT_NEAR(sa.ttft_mean_s, sb.ttft_mean_s, 0.05 * sa.ttft_mean_s);
  EXPECT_NEAR(sa.tpot_mean_s, sb.tpot_mean_s, 0.05 * sa.tpot_mean_s);
}

TEST(EngineScheduler, RunsDisaggregatedAndChunkedDeployments) {
  InstanceConfig p, d, c;
  p.role = Role::kPrefill;
  d.role = Role::kDecode;
  p.coeffs = d.coeffs = c.coeffs = Coeffs();
  d.policy.max_num_batched_tokens = 1 << 20;
  d.policy.kv_capacity_tokens = 8000;  // forces waits for page reservations
  c.policy.enable_chunked_prefill = true;
  c.policy.max_num_batched_tokens = 256;
  SimOptions engine;
  engine.make_scheduler = EngineSchedulerFactory();
  const auto reqs = Workload(3.0, 150);
  std::vector<InstanceConfig> disagg = {p, d};
  for (const auto& insts : {disagg, std::vector<InstanceConfig>{c}}) {
    auto r = Simulate(insts, ClusterLinks{}, reqs, engine);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const auto& q : r->requests) {
      ASSERT_TRUE(q.done()) << "request " << q.id;
      EXPECT_GE(q.first_token_s, q.arrival_s);
      EXPECT_GE(q.finish_s, q.first_token_s);
    }
  }
}

TEST(EngineScheduler, OversizedSequenceIsRejected) {
  SchedPolicy p;
  p.kv_capacity_tokens = 64;
  EngineStepScheduler s(p, Role::kColocated);
  EXPECT_EQ(s.Add(1, 1000, 0, 0.0).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(s.Add(2, 10, 0, 0.0).ok());
  EXPECT_EQ(s.Add(2, 10, 0, 0.0).code(), StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace pd::planner
