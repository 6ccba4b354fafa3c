#include "planner/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "planner/goodput.h"
#include "planner/test_data.h"

namespace pd::planner {
namespace {

StepCoeffs ConstantPrefill(double ms) {
  StepCoeffs c;
  c.prefill = {ms, 0, 0};
  return c;
}

// A prefill instance of 4 ms steps and a decode instance whose steps take `decode` (a, b, c) ms.
std::vector<InstanceConfig> PrefillOf4MsThenDecode(const std::array<double, 3>& decode) {
  InstanceConfig prefill;
  prefill.role = Role::kPrefill;
  prefill.coeffs = ConstantPrefill(4);
  InstanceConfig d;
  d.role = Role::kDecode;
  d.coeffs.decode_small = d.coeffs.decode_large = decode;
  return {prefill, d};
}

// M/D/1: Poisson arrivals, one server, deterministic service D. Mean wait W = ρ·D / (2(1 − ρ)).
TEST(Simulator, PrefillQueueMatchesMD1MeanWait) {
  const double d = 0.1;  // seconds per prompt
  for (double rho : {0.5, 0.8}) {
    InstanceConfig inst;
    inst.coeffs = ConstantPrefill(d * 1e3);
    inst.policy.max_num_batched_tokens = 100;  // one 100-token prompt per step
    std::vector<LengthPair> lengths = {{100, 1}};
    ArrivalOptions arrivals;
    arrivals.num_requests = 200000;
    arrivals.seed = 42;
    auto reqs = AtRate(MakeUnitRateWorkload(lengths, arrivals), rho / d);
    auto r = Simulate({&inst, 1}, ClusterLinks{}, reqs, SimOptions{});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    double wait = 0;
    for (const auto& q : r->requests) {
      ASSERT_TRUE(q.done());
      wait += q.ttft_s() - d;
    }
    wait /= r->requests.size();
    const double expected = rho * d / (2 * (1 - rho));
    EXPECT_NEAR(wait, expected, 0.04 * expected) << "rho " << rho;
  }
}

// B sequences decode together from t = 0: each step costs a + b·B·(L + k + 1) + c·B.
TEST(Simulator, FixedBatchDecodeStepTime) {
  const int batch = 8, prompt = 100, output = 21;
  InstanceConfig prefill;
  prefill.role = Role::kPrefill;
  prefill.policy.max_num_batched_tokens = 1 << 20;  // all prompts in one zero-cost step
  InstanceConfig decode;
  decode.role = Role::kDecode;
  decode.coeffs.decode_small = {5.0, 0.01, 0.5};
  decode.coeffs.decode_large = {1000, 1000, 1000};  // must not be used: batch < threshold
  decode.coeffs.decode_threshold = 95;
  std::vector<InstanceConfig> insts = {prefill, decode};
  std::vector<SimRequest> reqs;
  for (int i = 0; i < batch; ++i) reqs.push_back({i, 0.0, prompt, output});
  auto r = Simulate(insts, ClusterLinks{}, reqs, SimOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  double total_ms = 0;
  for (int k = 0; k < output - 1; ++k)
    total_ms += 5.0 + 0.01 * batch * (prompt + k + 1) + 0.5 * batch;
  for (const auto& q : r->requests) {
    EXPECT_DOUBLE_EQ(q.ttft_s(), 0.0);
    EXPECT_NEAR(q.tpot_s(), total_ms / (output - 1) * 1e-3, 1e-12);
  }
  EXPECT_EQ(r->num_steps, 1 + (output - 1));
}

// A prefill of 10 ms and decode steps of 1 ms. Request 0 arrives at 0 (prefill alone: 10 ms),
// request 1 at 10.5 ms, while request 0 decodes: its prefill step starts with the decode
// instance mid-step, so it takes 10 ms x corun_slowdown when both share a node, 10 ms otherwise.
TEST(Simulator, CorunSlowdownStretchesStepsThatOverlapAnotherInstancesStep) {
  auto run = [](double slowdown, int decode_node) {
    InstanceConfig prefill;
    prefill.role = Role::kPrefill;
    prefill.coeffs = ConstantPrefill(10);
    prefill.corun_slowdown = slowdown;
    InstanceConfig decode;
    decode.role = Role::kDecode;
    decode.node = decode_node;
    decode.coeffs.decode_small = decode.coeffs.decode_large = {1.0, 0, 0};
    decode.corun_slowdown = slowdown;
    std::vector<InstanceConfig> insts = {prefill, decode};
    std::vector<SimRequest> reqs = {{0, 0.0, 100, 11}, {1, 0.0105, 100, 2}};
    auto r = Simulate(insts, ClusterLinks{}, reqs, SimOptions{});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return *r;
  };
  const SimResult alone = run(1.0, 0), shared = run(2.0, 0), apart = run(2.0, 1);
  EXPECT_NEAR(alone.requests[0].ttft_s(), 0.010, 1e-9);
  EXPECT_NEAR(shared.requests[0].ttft_s(), 0.010, 1e-9);  // nothing else ran: not slowed
  EXPECT_NEAR(alone.requests[1].ttft_s(), 0.010, 1e-9);
  EXPECT_NEAR(shared.requests[1].ttft_s(), 0.020, 1e-9);
  EXPECT_NEAR(apart.requests[1].ttft_s(), 0.010, 1e-9);  // another node: independent
  // Request 0's decode steps that start during request 1's prefill take 2 ms instead of 1.
  EXPECT_GT(shared.requests[0].finish_s, alone.requests[0].finish_s + 0.005);
  EXPECT_NEAR(apart.requests[0].finish_s, alone.requests[0].finish_s, 1e-9);
}

TEST(Simulator, KvTransferDelaysDecodeByBytesOverBandwidth) {
  InstanceConfig prefill, decode;
  prefill.role = Role::kPrefill;
  decode.role = Role::kDecode;
  decode.node = 1;
  ClusterLinks links;
  links.kv_bytes_per_token = 1e6;
  links.inter_node_bw = 1e9;  // 1000 tokens → 1 s
  std::vector<InstanceConfig> insts = {prefill, decode};
  std::vector<SimRequest> reqs = {{0, 0.0, 1000, 3}};
  auto r = Simulate(insts, links, reqs, SimOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->requests[0].finish_s - r->requests[0].first_token_s, 1.0, 1e-12);
  decode.node = 0;  // same node: per-shard NVLink bandwidth
  EXPECT_NEAR(KvTransferSeconds(prefill, decode, links, 1000), 1e9 / links.intra_node_bw, 1e-12);
}

// pdserve's hand-over: TTFT = prefill step + (latency + bytes / bandwidth) + the decode step
// that runs the last prompt token; the decode instance then yields every output token.
TEST(Simulator, FirstTokenOnDecodeCountsTransferAndDecodeStepInTtft) {
  InstanceConfig prefill, decode;
  prefill.role = Role::kPrefill;
  prefill.coeffs = ConstantPrefill(50);
  decode.role = Role::kDecode;
  decode.node = 1;
  decode.coeffs.decode_small = {10, 0, 0};
  ClusterLinks links;
  links.kv_bytes_per_token = 1e6;
  links.inter_node_bw = 1e9;  // 100 tokens → 0.1 s
  links.transfer_latency_s = 0.02;
  std::vector<InstanceConfig> insts = {prefill, decode};
  std::vector<SimRequest> reqs = {{0, 0.0, 100, 4}};
  SimOptions o;
  o.first_token_on_decode = true;
  auto r = Simulate(insts, links, reqs, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->requests[0].ttft_s(), 0.05 + 0.02 + 0.1 + 0.01, 1e-12);
  EXPECT_NEAR(r->requests[0].tpot_s(), 0.01, 1e-12);
  EXPECT_EQ(r->num_steps, 1 + 4);  // one prefill step, four decode steps
  // The TTFT's parts: the prefill step ends, the KV arrives, the decode step gives the token.
  EXPECT_NEAR(r->requests[0].prefill_done_s, 0.05, 1e-12);
  EXPECT_NEAR(r->requests[0].kv_arrived_s, 0.05 + 0.02 + 0.1, 1e-12);
  // A one-token answer still moves to the decode instance for its only token.
  reqs[0].output_len = 1;
  auto one = Simulate(insts, links, reqs, o);
  ASSERT_TRUE(one.ok());
  EXPECT_NEAR(one->requests[0].ttft_s(), 0.18, 1e-12);
  // DistServe's accounting: the first token leaves the prefill step; the latency is in TPOT.
  reqs[0].output_len = 4;
  auto ds = Simulate(insts, links, reqs, SimOptions{});
  ASSERT_TRUE(ds.ok());
  EXPECT_NEAR(ds->requests[0].ttft_s(), 0.05, 1e-12);
  EXPECT_EQ(ds->requests[0].prefill_done_s, -1.0);  // the first token left the prefill step
  EXPECT_NEAR(ds->requests[0].finish_s, 0.05 + 0.12 + 3 * 0.01, 1e-12);
}

// A prefill instance of `prefill_ms` steps, one prompt of up to 100 tokens a step, whose KV is
// ready 0.8 of the way through, and a decode instance of `decode_ms` steps.
std::vector<InstanceConfig> OnePromptAStep(double prefill_ms, double decode_ms) {
  InstanceConfig prefill, decode;
  prefill.role = Role::kPrefill;
  prefill.coeffs = ConstantPrefill(prefill_ms);
  prefill.kv_ready_fraction = 0.8;
  prefill.policy.max_num_batched_tokens = 100;
  decode.role = Role::kDecode;
  decode.coeffs.decode_small = {decode_ms, 0, 0};
  return {prefill, decode};
}

// pdserve streams the KV layer by layer: with kv_ready_fraction f the transfer starts f of the
// way through the prefill step, so the decode step can start (and end) before the prefill step
// does; the prefill instance still holds its compute for the whole step.
TEST(Simulator, EarlyHandOverStartsTheTransferPartWayThroughThePrefillStep) {
  ClusterLinks links;
  links.transfer_latency_s = 0.002;
  std::vector<InstanceConfig> insts = OnePromptAStep(50, 5);
  std::vector<SimRequest> reqs = {{0, 0.0, 100, 3}, {1, 0.0, 100, 1}};
  SimOptions o;
  o.first_token_on_decode = true;
  auto r = Simulate(insts, links, reqs, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const RequestResult& a = r->requests[0];
  EXPECT_NEAR(a.kv_arrived_s, 0.8 * 0.05 + 0.002, 1e-12);
  EXPECT_NEAR(a.prefill_done_s, 0.05, 1e-12);  // the step still ends at 50 ms
  EXPECT_NEAR(a.ttft_s(), 0.042 + 0.005, 1e-12);
  EXPECT_LT(a.ttft_s(), a.prefill_done_s);  // the hand-over came before the step's end
  EXPECT_NEAR(a.tpot_s(), 0.005, 1e-12);
  // The second prompt's step starts when the first one's ends, not at its hand-over.
  const RequestResult& b = r->requests[1];
  EXPECT_NEAR(b.prefill_done_s, 0.1, 1e-12);
  EXPECT_NEAR(b.kv_arrived_s, 0.05 + 0.04 + 0.002, 1e-12);
  EXPECT_TRUE(b.done());  // a one-token answer finishes on the decode instance
  // 1 is the hand-over at the step's end, as before.
  insts[0].kv_ready_fraction = 1.0;
  auto end = Simulate(insts, links, reqs, o);
  ASSERT_TRUE(end.ok());
  EXPECT_NEAR(end->requests[0].kv_arrived_s, 0.052, 1e-12);
  EXPECT_NEAR(end->requests[0].ttft_s(), 0.057, 1e-12);
  // With PP the hand-over comes the same share of a step before the batch leaves the pipeline,
  // which for a short prompt behind a long one is after the long one leaves, not at its own
  // start + 0.8 step. 0.5 ms per prompt token: 50 ms and 5 ms, plus the stages' overhead.
  std::vector<InstanceConfig> piped = insts;
  piped[0].pp = 2;
  piped[0].kv_ready_fraction = 0.8;
  piped[0].coeffs.prefill = {0, 0.5, 0};
  const std::vector<SimRequest> long_short = {{0, 0.0, 100, 2}, {1, 0.0, 10, 2}};
  auto pp = Simulate(piped, links, long_short, o);
  ASSERT_TRUE(pp.ok()) << pp.status().ToString();
  const double over = kPpStageOverheadMs * 1e-3;
  const double long_step = 2 * (0.025 + over), short_step = 2 * (0.0025 + over);
  EXPECT_NEAR(pp->requests[0].prefill_done_s, long_step, 1e-12);
  EXPECT_NEAR(pp->requests[0].kv_arrived_s, 0.8 * long_step + 0.002, 1e-12);
  EXPECT_NEAR(pp->requests[1].prefill_done_s, long_step, 1e-12);  // leaves behind the long one
  EXPECT_NEAR(pp->requests[1].kv_arrived_s, long_step - 0.2 * short_step + 0.002, 1e-12);
  // DistServe's accounting (the first token from the prefill step) ignores the fraction.
  insts[0].kv_ready_fraction = 0.8;
  auto ds = Simulate(insts, links, reqs, SimOptions{});
  ASSERT_TRUE(ds.ok());
  EXPECT_NEAR(ds->requests[0].ttft_s(), 0.05, 1e-12);
  EXPECT_NEAR(ds->requests[0].kv_arrived_s, 0.052, 1e-12);
}

TEST(Simulator, RejectsAKvReadyFractionOutsideZeroToOne) {
  InstanceConfig p, d;
  p.role = Role::kPrefill;
  d.role = Role::kDecode;
  std::vector<SimRequest> reqs = {{0, 0.0, 10, 2}};
  for (double bad : {0.0, -0.5, 1.5, std::nan("")}) {
    p.kv_ready_fraction = bad;
    std::vector<InstanceConfig> insts = {p, d};
    auto r = Simulate(insts, ClusterLinks{}, reqs, {});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("kv_ready_fraction"), std::string::npos);
  }
}

// Decode steps of 1 ms with the factors {1, 2, 3}: the five decode steps of a six-token answer
// take 1, 2, 3, 1, 2 ms in turn (the sequence wraps); the prefill instance, with none, keeps its
// model's time.
TEST(Simulator, StepFactorsMultiplyAnInstancesStepsInTurn) {
  std::vector<InstanceConfig> insts = PrefillOf4MsThenDecode({1.0, 0, 0});
  insts[1].calibration = std::make_shared<const StepCalibration>(StepCalibration{{1, 2, 3}, 0.0});
  std::vector<SimRequest> reqs = {{0, 0.0, 10, 6}};
  SimOptions o;
  o.record_steps = true;
  auto r = Simulate(insts, ClusterLinks{}, reqs, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->requests[0].ttft_s(), 0.004, 1e-12);
  EXPECT_NEAR(r->requests[0].finish_s, 0.004 + 0.009, 1e-12);
  std::vector<double> decode_ms;
  for (const SimStep& s : r->steps)
    if (s.instance == 1) decode_ms.push_back(s.duration_s * 1e3);
  ASSERT_EQ(decode_ms.size(), 5u);
  const double want[] = {1, 2, 3, 1, 2};
  for (int k = 0; k < 5; ++k) EXPECT_NEAR(decode_ms[k], want[k], 1e-9) << k;
  // Without a calibration, or with no factors, every step is the model's 1 ms.
  for (auto none :
       {std::shared_ptr<const StepCalibration>(), std::make_shared<const StepCalibration>()}) {
    insts[1].calibration = none;
    auto plain = Simulate(insts, ClusterLinks{}, reqs, {});
    ASSERT_TRUE(plain.ok());
    EXPECT_NEAR(plain->requests[0].finish_s, 0.004 + 0.005, 1e-12);
  }
}

// The engine loop between steps: a step starts no sooner than loop_gap_s after the last one
// ended, whether its request queued (1, 2) or came while the loop ran (2); one that comes later
// starts at once (3).
TEST(Simulator, LoopGapHoldsTheNextStepAfterAStepEnds) {
  InstanceConfig inst;
  inst.role = Role::kColocated;
  inst.coeffs = ConstantPrefill(4);
  inst.policy.max_num_seqs = 1;
  const std::vector<SimRequest> reqs = {
      {0, 0.0, 10, 1}, {1, 0.001, 10, 1}, {2, 0.0086, 10, 1}, {3, 0.020, 10, 1}};
  for (double gap : {0.0, 0.0005}) {
    SCOPED_TRACE(gap);
    inst.calibration = std::make_shared<const StepCalibration>(StepCalibration{{}, gap});
    auto r = Simulate(std::vector<InstanceConfig>{inst}, ClusterLinks{}, reqs, {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_NEAR(r->requests[0].ttft_s(), 0.004, 1e-12);
    EXPECT_NEAR(r->requests[1].ttft_s(), 0.007 + gap, 1e-12);      // 4 + gap .. 8 + gap
    const double third_start = std::max(0.0086, 0.008 + 2 * gap);  // after the second's gap
    EXPECT_NEAR(r->requests[2].ttft_s(), third_start + 0.004 - 0.0086, 1e-12);
    EXPECT_NEAR(r->requests[3].ttft_s(), 0.004, 1e-12);
  }
}

TEST(Simulator, RejectsALoopGapThatIsNegativeOrNotFinite) {
  InstanceConfig inst;
  inst.role = Role::kColocated;
  std::vector<SimRequest> reqs = {{0, 0.0, 10, 2}};
  for (double bad : {-1e-3, std::nan(""), std::numeric_limits<double>::infinity()}) {
    inst.calibration = std::make_shared<const StepCalibration>(StepCalibration{{}, bad});
    auto r = Simulate(std::vector<InstanceConfig>{inst}, ClusterLinks{}, reqs, {});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("loop_gap_s"), std::string::npos);
  }
}

TEST(Simulator, RejectsStepFactorsThatAreNotPositiveAndFinite) {
  InstanceConfig p, d;
  p.role = Role::kPrefill;
  d.role = Role::kDecode;
  std::vector<SimRequest> reqs = {{0, 0.0, 10, 2}};
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    d.calibration = std::make_shared<const StepCalibration>(StepCalibration{{1.0, bad}, 0.0});
    std::vector<InstanceConfig> insts = {p, d};
    auto r = Simulate(insts, ClusterLinks{}, reqs, {});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("step_factors"), std::string::npos);
  }
}

TEST(Simulator, StopsOnceEnoughRequestsMetTheSlo) {
  InstanceConfig inst;
  inst.coeffs = ConstantPrefill(100);
  inst.policy.max_num_batched_tokens = 10;  // one prompt per step: request k ends at 0.1·(k+1)
  std::vector<SimRequest> reqs;
  for (int i = 0; i < 10; ++i) reqs.push_back({i, 0.0, 10, 1});
  SimOptions o;
  o.slo = {10.0, 10.0};
  o.stop_after_meets = 4;
  auto r = Simulate({&inst, 1}, ClusterLinks{}, reqs, o);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->reached_meets);
  EXPECT_FALSE(r->stopped_early);
  int done = 0;
  for (const auto& q : r->requests) done += q.done();
  EXPECT_EQ(done, 4);
  EXPECT_NEAR(r->end_time_s, 0.4, 1e-9);
  // Misses do not count: with a TTFT SLO of 0.25 s only the first two meet it.
  o.slo.ttft_s = 0.25;
  auto missed = Simulate({&inst, 1}, ClusterLinks{}, reqs, o);
  ASSERT_TRUE(missed.ok());
  EXPECT_FALSE(missed->reached_meets);
  EXPECT_NEAR(missed->end_time_s, 1.0, 1e-9);
}

// With a miss budget, misses count as soon as they are certain: a TTFT miss at its deadline, a
// TPOT miss once the time so far plus the fastest possible remaining steps exceeds the SLO.
TEST(Simulator, MissesCountAsSoonAsTheyAreCertain) {
  InstanceConfig inst;
  inst.coeffs = ConstantPrefill(1000);  // 1 s per prompt
  inst.policy.max_num_batched_tokens = 10;
  std::vector<SimRequest> reqs = {{0, 0.0, 10, 1}, {1, 0.0, 10, 1}};
  SimOptions o;
  o.slo = {0.3, 1.0};
  o.max_misses = 0;
  auto r = Simulate({&inst, 1}, ClusterLinks{}, reqs, o);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->stopped_early);
  EXPECT_NEAR(r->end_time_s, 0.3, 1e-9);  // the deadline, not the first token at 1 s
  // Decode at 10 ms per step (batch 1, context 1) against a TPOT SLO of 5 ms: certain at the
  // KV's arrival, before any decode step.
  InstanceConfig prefill, decode;
  prefill.role = Role::kPrefill;
  prefill.coeffs = ConstantPrefill(1);
  decode.role = Role::kDecode;
  decode.coeffs.decode_small = {10, 0, 0};
  decode.coeffs.decode_large = {10, 0, 0};
  std::vector<InstanceConfig> insts = {prefill, decode};
  std::vector<SimRequest> one = {{0, 0.0, 10, 50}};
  o.slo = {10.0, 0.005};
  auto d = Simulate(insts, ClusterLinks{}, one, o);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->stopped_early);
  EXPECT_NEAR(d->end_time_s, 0.001, 1e-12);  // when the KV arrived, after the prefill step
  // Without a miss budget the run goes to the end and reports the same miss.
  o.max_misses = -1;
  auto full = Simulate(insts, ClusterLinks{}, one, o);
  ASSERT_TRUE(full.ok());
  EXPECT_FALSE(full->stopped_early);
  EXPECT_NEAR(full->requests[0].tpot_s(), 0.01, 1e-12);
}

TEST(Simulator, PipelineKeepsSeveralBatchesInFlight) {
  InstanceConfig inst;
  inst.coeffs = ConstantPrefill(100);
  inst.policy.max_num_batched_tokens = 10;
  std::vector<SimRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back({i, 0.0, 10, 1});
  auto serial = Simulate({&inst, 1}, ClusterLinks{}, reqs, SimOptions{});
  inst.pp = 2;
  auto piped = Simulate({&inst, 1}, ClusterLinks{}, reqs, SimOptions{});
  ASSERT_TRUE(serial.ok() && piped.ok());
  EXPECT_NEAR(serial->end_time_s, 0.4, 1e-9);
  // Stages of 51 ms: four batches leave at 102, 153, 204, 255 ms.
  EXPECT_NEAR(piped->end_time_s, 0.255, 1e-9);
}

TEST(Simulator, RejectsBadDeployments) {
  InstanceConfig c, p, d;
  p.role = Role::kPrefill;
  d.role = Role::kDecode;
  std::vector<SimRequest> reqs = {{0, 0.0, 10, 2}};
  EXPECT_EQ(Simulate({}, ClusterLinks{}, reqs, {}).status().code(), StatusCode::kInvalidArgument);
  std::vector<InstanceConfig> mixed = {c, p, d};
  EXPECT_EQ(Simulate(mixed, ClusterLinks{}, reqs, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Simulate({&p, 1}, ClusterLinks{}, reqs, {}).status().code(),
            StatusCode::kInvalidArgument);
  c.tp = 0;
  EXPECT_EQ(Simulate({&c, 1}, ClusterLinks{}, reqs, {}).status().code(),
            StatusCode::kInvalidArgument);
  c.tp = 1;
  std::vector<SimRequest> bad = {{0, 0.0, 0, 2}};
  EXPECT_EQ(Simulate({&c, 1}, ClusterLinks{}, bad, {}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(Simulator, RequestLargerThanKvCacheFailsInsteadOfHanging) {
  InstanceConfig c;
  c.coeffs = ConstantPrefill(1);
  c.policy.kv_capacity_tokens = 256;
  std::vector<SimRequest> reqs = {{0, 0.0, 1000, 2}, {1, 0.0, 10, 2}};
  auto r = Simulate({&c, 1}, ClusterLinks{}, reqs, {});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->requests[0].failed);
  EXPECT_TRUE(r->requests[1].done());
  EXPECT_EQ(Summarize(r->requests, Slo{10, 10}).attainment, 0.5);
}

TEST(Simulator, KvPressurePreemptsAndStillFinishes) {
  InstanceConfig c;
  c.coeffs = ConstantPrefill(1);
  c.coeffs.decode_small = c.coeffs.decode_large = {1, 0, 0};
  c.policy.kv_capacity_tokens = 16 * 20;  // 20 pages
  std::vector<SimRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back({i, 0.0, 30, 40});  // each grows to 5 pages
  auto r = Simulate({&c, 1}, ClusterLinks{}, reqs, {});
  ASSERT_TRUE(r.ok());
  for (const auto& q : r->requests) EXPECT_TRUE(q.done());
  EXPECT_GT(r->num_preemptions, 0);
}

TEST(Simulator, ReplayOfRealA100TraceLandsNearMeasuredAttainment) {
  PD_REQUIRE_DISTSERVE_DATA();
  auto model = LoadProfile(testing::DistServePath("a100-profile/profiler-a100-80g.vllm.json"),
                           "facebook/opt-13b");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::string name = "vllm-300-3.json";
  auto trace = LoadTraceJson(testing::DistServePath("real-a100-opt13b-sharegpt/workloads/" + name));
  auto measured =
      LoadMeasuredJson(testing::DistServePath("real-a100-opt13b-sharegpt/measured/" + name));
  ASSERT_TRUE(trace.ok() && measured.ok());
  InstanceConfig inst;
  inst.coeffs = *(*model)->Coeffs(1);
  inst.policy.kv_capacity_tokens = 66144;
  auto r = Simulate({&inst, 1}, ClusterLinks{}, *trace, {});
  ASSERT_TRUE(r.ok());
  const Slo slo{0.25, 0.1};
  const Summary sim = Summarize(r->requests, slo);
  const Summary meas = Summarize(MeasuredResults(*measured), slo);
  RecordProperty("sim_attainment", std::to_string(sim.attainment));
  RecordProperty("real_attainment", std::to_string(meas.attainment));
  std::printf("%s: attainment sim %.3f real %.3f; TTFT p50 sim %.3f real %.3f s\n", name.c_str(),
              sim.attainment, meas.attainment, sim.ttft_p50_s, meas.ttft_p50_s);
  EXPECT_NEAR(sim.attainment, meas.attainment, 0.25);
}

}  // namespace
}  // namespace pd::planner
