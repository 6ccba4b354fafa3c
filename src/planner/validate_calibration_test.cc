#include "planner/validate_calibration.h"

#include <gtest/gtest.h>

namespace pd::planner {
namespace {

// Decode steps of b sequences alone, `n` of them, each taking fixed + b x per_seq ms with a
// `gap_ms` loop after it.
void AddSteps(std::vector<StepRecord>* steps, int b, int n, double fixed_ms, double per_seq_ms,
              double gap_ms) {
  for (int i = 0; i < n; ++i) {
    const double start =
        steps->empty() ? 0.0 : steps->back().start_s + steps->back().duration_s + gap_ms * 1e-3;
    steps->push_back({start, (fixed_ms + b * per_seq_ms) * 1e-3, b, 0, false});
  }
}

TEST(ValidateCalibration, DecodeStretchSplitsIntoAPerStepAndAPerSequencePart) {
  // Simulated: 1 ms + 0.5 ms a sequence; real: 1.2 ms + 0.75 ms a sequence, loop included.
  std::vector<StepRecord> sim, real;
  for (int b : {1, 2, 4}) AddSteps(&sim, b, 100, 1.0, 0.5, 0.0);
  for (int b : {1, 2, 4}) AddSteps(&real, b, 100, 1.1, 0.75, 0.1);
  AddSteps(&real, 1, 50, 1.1 * 1.3, 0.75 * 1.3, 0.1);  // while a prefill step ran: x1.3
  for (size_t i = real.size() - 50; i < real.size(); ++i) real[i].corun = true;
  auto m = DecodeFactorsUnderLoad(real, sim, 150, 1e-3);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->alone_steps, 300);
  EXPECT_NEAR(m->step_stretch, 1.2, 1e-9);
  EXPECT_NEAR(m->seq_stretch, 1.5, 1e-9);
  EXPECT_NEAR(m->stretch, (3 * 1.2 + 7 * 0.75) / (3 + 7 * 0.5), 1e-9);  // pooled by counts
  EXPECT_EQ(m->corun_steps, 50);
  EXPECT_NEAR(m->corun, (1.85 * 1.3 + 0.1) / 1.95, 1e-9);  // loop included on both sides
  // No per-step part given: unsplit; too few steps: none.
  auto unsplit = DecodeFactorsUnderLoad(real, sim, 150, 0.0);
  ASSERT_TRUE(unsplit.ok());
  EXPECT_EQ(unsplit->step_stretch, unsplit->stretch);
  EXPECT_EQ(DecodeFactorsUnderLoad(real, sim, 301, 1e-3).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(ValidateCalibration, StepFactorsAreEachStepOverItsClassMeanInOrder) {
  // One-sequence steps back to back, the second slow: the class's mean is 5/3 ms.
  const std::vector<StepRecord> steps = {
      {0.0, 1e-3, 1, 0}, {1e-3, 3e-3, 1, 0}, {4e-3, 1e-3, 1, 0}, {5e-3, 1e-3, 1, 0}};
  const std::vector<double> none;
  const std::vector<double> k = DecodeStepFactors(steps, none);
  ASSERT_EQ(k.size(), 3u);  // the last has no step after it
  EXPECT_NEAR(k[0], 1.0 / (5.0 / 3), 1e-9);
  EXPECT_NEAR(k[1], 3.0 / (5.0 / 3), 1e-9);
  // A KV ready between two steps: the engine may have waited for it, so that step counts not.
  const std::vector<double> ready = {steps[1].start_s + steps[1].duration_s};
  EXPECT_EQ(DecodeStepFactors(steps, ready).size(), 2u);
}

TEST(ValidateCalibration, PrefillStretchAndLoopGap) {
  // Three prompt steps 0-10, 10.3-20.3, 30-40 ms; requests of the second and third came during
  // the step before (a queued prompt) and after the second ended.
  const std::vector<StepRecord> real = {
      {0.0, 0.010, 0, 100}, {0.0103, 0.010, 0, 100}, {0.030, 0.010, 0, 100}};
  const std::vector<StepRecord> sim = {{0.0, 0.008, 0, 100}, {0.01, 0.008, 1, 0}};
  auto k = PrefillBusyStretch(real, sim, 3);
  ASSERT_TRUE(k.ok());
  EXPECT_NEAR(*k, 0.030 / 0.008, 1e-9);
  EXPECT_FALSE(PrefillBusyStretch(real, sim, 4).ok());
  std::vector<TracedRequest> traced(2);
  traced[0].step_begin_s = 0.0103;
  traced[0].got_s = 0.005;
  traced[1].step_begin_s = 0.030;
  traced[1].got_s = 0.025;
  auto gap = PrefillLoopGap(real, traced, 1);
  ASSERT_TRUE(gap.ok());
  EXPECT_NEAR(*gap, 0.0003, 1e-12);  // the 9.7 ms gap is over kMaxLoopGapS
  EXPECT_FALSE(PrefillLoopGap(real, traced, 2).ok());
}

TEST(ValidateCalibration, InstancesTakeTheOverheadsStretchesAndARunsFigures) {
  StepCoeffs model;
  model.prefill = {1.0, 0.01, 0.0};
  model.decode_small = model.decode_large = {0.5, 0.0, 0.1};
  Calibration probes;
  probes.overheads.prefill_scale = 2.0;
  probes.overheads.decode_fixed_ms = 0.1;
  probes.overheads.decode_seq_ms = 0.2;
  probes.overheads.transfer_s_per_token = 1e-5;
  SchedPolicy policy;
  auto insts = CalibratedInstances(model, probes, policy);
  ASSERT_EQ(insts.size(), 2u);
  EXPECT_NEAR(insts[0].coeffs.PrefillMs(100, 0), 2 * 2.0, 1e-9);
  EXPECT_NEAR(insts[1].coeffs.DecodeMs(2, 10), 0.6 + 2 * 0.3, 1e-9);
  EXPECT_FALSE(insts[0].calibration);  // the probes alone calibrate no step
  EXPECT_NEAR(CalibratedLinks(100, probes.overheads).intra_node_bw, 1e7, 1e-3);

  RunCalibration run;
  run.prefill_stretch = 1.5;
  run.decode = DecodeLoadFactors{1.1, 1.3, 500, 100, 1.2, 1.4};
  run.decode_step_factors = {1.0, 2.0};
  run.prefill_loop_gap_s = 3e-4;
  run.kv_ready_fraction = 0.9;
  run.outside = {{0.002, 0.003}, {}, {}};
  const Calibration cal = WithRun(probes, run, true, 1);
  EXPECT_EQ(cal.overheads.corun_decode, 1.3);
  EXPECT_EQ(cal.overheads.kv_ready_fraction, 0.9);
  EXPECT_EQ(cal.overheads.transfer_s_per_token, 0.0);  // the traced hand-over includes it
  EXPECT_EQ(WithRun(probes, run, false, 1).overheads.corun_decode, 1.0);
  insts = CalibratedInstances(model, cal, policy);
  EXPECT_NEAR(insts[0].coeffs.PrefillMs(100, 0), 2 * 2.0 * 1.5, 1e-9);
  EXPECT_NEAR(insts[1].coeffs.DecodeMs(2, 10), 0.6 * 1.2 + 2 * 0.3 * 1.4, 1e-9);
  EXPECT_EQ(insts[1].calibration->step_factors, run.decode_step_factors);
  EXPECT_EQ(insts[0].calibration->loop_gap_s, 3e-4);
  EXPECT_EQ(insts[0].kv_ready_fraction, 0.9);

  // The outside latency comes on top of each request's first token and end.
  const std::vector<SimRequest> reqs = {{0, 0.0, 16, 4}, {1, 0.5, 16, 4}};
  auto plain = SimulateCalibrated(insts, CalibratedLinks(100, cal.overheads), reqs, {});
  auto outside = SimulateCalibrated(insts, CalibratedLinks(100, cal.overheads), reqs,
                                    OutsideLatency::Constant(0.004), true);
  ASSERT_TRUE(plain.ok() && outside.ok());
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(outside->requests[i].ttft_s() - plain->requests[i].ttft_s(), 0.004, 1e-12);
    EXPECT_NEAR(outside->requests[i].finish_s - plain->requests[i].finish_s, 0.004, 1e-12);
  }
  EXPECT_FALSE(outside->steps.empty());
  EXPECT_TRUE(plain->steps.empty());
}

}  // namespace
}  // namespace pd::planner
