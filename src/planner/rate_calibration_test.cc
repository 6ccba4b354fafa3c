#include "planner/rate_calibration.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <tuple>
#include <vector>

namespace pd::planner {
namespace {

TEST(ValidateRateCalibration, UpperMedianIndexPicksTheMiddleOfAnOddCount) {
  const std::vector<double> v = {3.0, 1.0, 2.0};
  auto k = UpperMedianIndex(v);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, 2u);  // the value 2.0
}

TEST(ValidateRateCalibration, UpperMedianIndexPicksTheUpperOfTwoMiddleOnesAndTheFirstOfTies) {
  const std::vector<double> even = {4.0, 1.0, 3.0, 2.0};
  EXPECT_EQ(*UpperMedianIndex(even), 2u);  // 3.0, as UpperMedian
  const std::vector<double> ties = {5.0, 5.0, 1.0};
  EXPECT_EQ(*UpperMedianIndex(ties), 0u);
  const std::vector<double> one = {7.0};
  EXPECT_EQ(*UpperMedianIndex(one), 0u);
}

TEST(ValidateRateCalibration, UpperMedianIndexRefusesNoValuesAndNonFinite) {
  EXPECT_EQ(UpperMedianIndex({}).status().code(), StatusCode::kInvalidArgument);
  const std::vector<double> nan = {1.0, std::nan("")};
  EXPECT_EQ(UpperMedianIndex(nan).status().code(), StatusCode::kInvalidArgument);
  const std::vector<double> inf = {std::numeric_limits<double>::infinity()};
  EXPECT_EQ(UpperMedianIndex(inf).status().code(), StatusCode::kInvalidArgument);
}

StepRecord Step(double duration_s, int64_t prefill_tokens, int decodes = 0) {
  StepRecord s;
  s.duration_s = duration_s;
  s.prefill_tokens = prefill_tokens;
  s.decode_seqs = decodes;
  return s;
}

TEST(ValidateRateCalibration, PrefillBusyStretchIsTheTotalsRatioOverPrefillSteps) {
  // Real: 10 + 30 ms of prefill (a decode-only step left out); simulated: 8 + 12 ms.
  const std::vector<StepRecord> real = {Step(0.010, 100), Step(0.5, 0, 4), Step(0.030, 200)};
  const std::vector<StepRecord> sim = {Step(0.008, 100), Step(0.012, 200), Step(0.9, 0, 2)};
  auto k = PrefillBusyStretch(real, sim, 2);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_DOUBLE_EQ(*k, 2.0);  // 40 / 20, not the per-step median (1.25 / 2.5)
}

TEST(ValidateRateCalibration, PrefillBusyStretchNeedsStepsOnBothSides) {
  const std::vector<StepRecord> real = {Step(0.010, 100), Step(0.5, 0, 4)};
  const std::vector<StepRecord> sim = {Step(0.008, 100)};
  EXPECT_EQ(PrefillBusyStretch(real, sim, 2).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(PrefillBusyStretch(real, sim, 1).ok());
  const std::vector<StepRecord> no_prefill = {Step(0.5, 0, 4)};
  EXPECT_EQ(PrefillBusyStretch(real, no_prefill, 1).status().code(),
            StatusCode::kFailedPrecondition);
}

StepRecord At(double start_s, double duration_s, int64_t prefill_tokens) {
  StepRecord s = Step(duration_s, prefill_tokens);
  s.start_s = start_s;
  return s;
}

TracedRequest Computed(double got_s, double step_begin_s) {
  TracedRequest r;
  r.got_s = got_s;
  r.step_begin_s = step_begin_s;
  return r;
}

// The arrival work left out: (40 - 4) / 20; more than half the traced time left out, or a
// negative amount, is refused.
TEST(ValidateRateCalibration, PrefillBusyStretchLeavesTheArrivalWorkOut) {
  const std::vector<StepRecord> real = {Step(0.010, 100), Step(0.030, 200)};
  const std::vector<StepRecord> sim = {Step(0.008, 100), Step(0.012, 200)};
  auto k = PrefillBusyStretch(real, sim, 2, 0.004);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_DOUBLE_EQ(*k, 1.8);
  for (double bad : {0.021, -1e-3, std::nan("")}) {
    EXPECT_EQ(PrefillBusyStretch(real, sim, 2, bad).status().code(),
              StatusCode::kFailedPrecondition)
        << bad;
  }
}

// 0.1 ms per prompt token. Free steps run x1.2 the model (12 ms for 100 tokens, 24 for 200);
// the step at 70 ms, which one request came during, ran 1.5 ms over that, and the one at 90 ms,
// two, 2.5 ms over: 4 ms over three requests. A request that came during the step that computed
// it is that step's own (the one at 91 ms), a co-run step has no free co-run step to go by, and
// a decode-only step is no prefill step.
TEST(ValidateRateCalibration, PrefillArrivalWorkIsTheHeldStepsTimeOverTheFreeOnesPerRequest) {
  StepCoeffs model;
  model.prefill = {0, 0.1, 0};
  StepRecord corun = At(0.130, 0.030, 100);
  corun.corun = true;
  const std::vector<StepRecord> steps = {At(0.000, 0.012, 100),
                                         At(0.020, 0.024, 200),
                                         At(0.050, 0.012, 100),
                                         At(0.065, 0.002, 0),
                                         At(0.070, 0.0135, 100),
                                         At(0.090, 0.0265, 200),
                                         corun};
  const std::vector<TracedRequest> traced = {
      Computed(0.000, 0.000), Computed(0.020, 0.020), Computed(0.050, 0.050),
      Computed(0.075, 0.090), Computed(0.091, 0.090),  // came during its own step
      Computed(0.095, 0.130), Computed(0.100, 0.130), Computed(0.140, 0.170),
  };
  auto w = MeasurePrefillArrivalWork(steps, traced, model, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_NEAR(w->held_s, 0.004 / 3, 1e-12);
  EXPECT_EQ(w->held_steps, 2);
  EXPECT_EQ(w->free_steps, 3);
  EXPECT_EQ(w->arrivals, 3);
  // By chance: 8 requests over the steps' 160 ms, 50 a second; each non-co-run step free with
  // probability exp(-50 x its time).
  const double rate = 8 / 0.160;
  const double real[] = {0.012, 0.024, 0.012, 0.0135, 0.0265};
  const double modelled[] = {0.010, 0.020, 0.010, 0.010, 0.020};
  double free_real = 0, free_model = 0, excess = 0, arrivals = 0;
  for (int i = 0; i < 5; ++i) {
    free_real += std::exp(-rate * real[i]) * real[i];
    free_model += std::exp(-rate * real[i]) * modelled[i];
  }
  for (int i = 0; i < 5; ++i) {
    excess += (1 - std::exp(-rate * real[i])) * (real[i] - modelled[i] * free_real / free_model);
    arrivals += rate * real[i];
  }
  EXPECT_NEAR(w->chance_s, excess / arrivals, 1e-12);
  EXPECT_GT(w->chance_s, 0.0);
  EXPECT_NEAR(w->work_s, w->held_s - w->chance_s, 1e-12);
  EXPECT_NEAR(*w->total_s(), w->work_s * 3, 1e-12);
  EXPECT_EQ(MeasurePrefillArrivalWork(steps, traced, model, 3).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(MeasurePrefillArrivalWork(steps, {}, model, 1).status().code(),
            StatusCode::kFailedPrecondition);  // no held step
  // Held steps no longer than the free ones: no work, not less than none.
  std::vector<StepRecord> quick = steps;
  quick[4].duration_s = 0.011;
  quick[5].duration_s = 0.023;
  auto none = MeasurePrefillArrivalWork(quick, traced, model, 2);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->work_s, 0.0);
}

// Lengthens each step by `work_s` per request (`traced`, in got_s order) that came during it.
void AddWorkPerCaughtRequest(double work_s, const std::vector<TracedRequest>& traced,
                             std::vector<StepRecord>* steps) {
  for (StepRecord& s : *steps) {
    auto from = std::lower_bound(traced.begin(), traced.end(), s.start_s,
                                 [](const TracedRequest& r, double v) { return r.got_s < v; });
    for (auto it = from; it != traced.end() && it->got_s < s.start_s + s.duration_s; ++it) {
      s.duration_s += work_s;
    }
  }
}

// Steps of one size whose times spread (x0.7-1.3 around 10 ms) and requests that come at random,
// each costing nothing: the held steps still run longer (they caught more requests for being
// long), and the figure by chance takes that back out.
TEST(ValidateRateCalibration, PrefillArrivalWorkTakesOutWhatLongStepsCatchByChance) {
  StepCoeffs model;
  model.prefill = {10, 0, 0};
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> spread(0.7, 1.3);
  std::exponential_distribution<double> gap(40.0);  // 40 requests a second
  std::vector<StepRecord> steps;
  std::vector<TracedRequest> traced;
  double t = 0, next = gap(rng);
  for (int i = 0; i < 20000; ++i) {
    const StepRecord s = At(t, 0.010 * spread(rng), 100);
    steps.push_back(s);
    t += s.duration_s + 0.0002;
    // Each request counts as computed by a step long after (the test's own bookkeeping).
    for (; next < t; next += gap(rng)) traced.push_back(Computed(next, next + 1.0));
  }
  auto w = MeasurePrefillArrivalWork(steps, traced, model, 100);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_GT(w->held_s, 0.0002);  // ~0.3 ms by chance alone
  EXPECT_NEAR(w->chance_s, w->held_s, 0.00005);
  EXPECT_LT(w->work_s, 0.00005);
  // 0.5 ms added to each held step per request it caught comes back out as about that.
  AddWorkPerCaughtRequest(0.0005, traced, &steps);
  // The steps now overlap the requests' instants a little differently; the count stays close.
  auto worked = MeasurePrefillArrivalWork(steps, traced, model, 100);
  ASSERT_TRUE(worked.ok()) << worked.status().ToString();
  EXPECT_NEAR(worked->work_s, 0.0005, 0.0001);
}

// Prompts of 50-400 tokens whose steps take 2 + 0.04 ms a token (x0.9-1.1) against a model that
// knows no length (10 ms a step), and requests at random that cost nothing: the run's own fit of
// its free steps finds no work either; with 0.5 ms added per request a step caught, it finds
// that. The held measure is the held steps' excess alone, never below 0.
TEST(ValidateRateCalibration, PrefillArrivalWorkByItsOwnFitAndHeldAlone) {
  StepCoeffs model;
  model.prefill = {10, 0, 0};
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> spread(0.9, 1.1);
  std::uniform_int_distribution<int> tokens(50, 400);
  std::exponential_distribution<double> gap(40.0);
  std::vector<StepRecord> steps;
  std::vector<TracedRequest> traced;
  double t = 0, next = gap(rng);
  for (int i = 0; i < 20000; ++i) {
    const int n = tokens(rng);
    const StepRecord s = At(t, (2 + 0.04 * n) * 1e-3 * spread(rng), n);
    steps.push_back(s);
    t += s.duration_s + 0.0002;
    for (; next < t; next += gap(rng)) traced.push_back(Computed(next, next + 1.0));
  }
  auto w = MeasurePrefillArrivalWork(steps, traced, model, 100);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(w->fit_held_s && w->fit_chance_s);
  EXPECT_GT(*w->fit_held_s, 0.0);  // long steps still catch more
  ASSERT_TRUE(w->Work(ArrivalMeasure::kOwnFit));
  EXPECT_LT(*w->Work(ArrivalMeasure::kOwnFit), 0.00005);
  EXPECT_DOUBLE_EQ(*w->Work(ArrivalMeasure::kHeld), std::max(0.0, w->held_s));
  EXPECT_DOUBLE_EQ(*w->Work(ArrivalMeasure::kLessChance), w->work_s);
  EXPECT_NEAR(*w->total_s(ArrivalMeasure::kHeld), *w->Work(ArrivalMeasure::kHeld) * w->arrivals,
              1e-12);
  AddWorkPerCaughtRequest(0.0005, traced, &steps);
  auto worked = MeasurePrefillArrivalWork(steps, traced, model, 100);
  ASSERT_TRUE(worked.ok()) << worked.status().ToString();
  ASSERT_TRUE(worked->Work(ArrivalMeasure::kOwnFit));
  EXPECT_NEAR(*worked->Work(ArrivalMeasure::kOwnFit), 0.0005, 0.0001);
  EXPECT_GT(*worked->Work(ArrivalMeasure::kHeld), 0.0005);  // with what long steps catch
  // A held excess below 0 is no work by the held measure.
  PrefillArrivalWork less;
  less.held_s = -0.0002;
  less.arrivals = 4;
  EXPECT_EQ(*less.Work(ArrivalMeasure::kHeld), 0.0);
  EXPECT_EQ(*less.total_s(ArrivalMeasure::kHeld), 0.0);
  EXPECT_FALSE(less.Work(ArrivalMeasure::kOwnFit));  // no fit
  EXPECT_STREQ(ArrivalMeasureKey(ArrivalMeasure::kOwnFit), "own_fit_work");
}

// Steps at 0-10, 10.3-20, 20.5-30, 40-50, 50.2-60 and 60.9-70 ms (a decode-only one between);
// the gaps that count are those whose next step had a request in by the step's end.
TEST(ValidateRateCalibration, PrefillLoopGapIsTheMeanGapBeforeStepsWhoseWorkWaited) {
  const std::vector<StepRecord> steps = {At(0.000, 0.010, 100),   At(0.0103, 0.0097, 100),
                                         At(0.0205, 0.0095, 100), At(0.040, 0.010, 100),
                                         At(0.045, 0.001, 0),     At(0.0502, 0.0098, 100),
                                         At(0.0609, 0.0091, 100)};
  const std::vector<TracedRequest> traced = {
      Computed(0.000, 0.000),
      Computed(0.004, 0.0103),            // in by 10 ms: 0.3 ms counts
      Computed(0.015, 0.0205 + 2e-9),     // in by 20 ms (its step's start read apart): 0.5 ms
      Computed(0.0399, 0.040),            // came after 30 ms: the engine was idle
      Computed(0.049, 0.0502),            // in by 50 ms: 0.2 ms counts (the decode step skipped)
      Computed(0.0601, 0.0609),           // came after 60 ms: idle
      Computed(0.0605, 0.0609 + 0.0001),  // no such step: ignored
  };
  auto gap = PrefillLoopGap(steps, traced, 0.002, 3);
  ASSERT_TRUE(gap.ok()) << gap.status().ToString();
  EXPECT_NEAR(*gap, (0.0003 + 0.0005 + 0.0002) / 3, 1e-12);
  // A gap over max_gap_s is the engine waiting for its core: left out, and then too few.
  auto capped = PrefillLoopGap(steps, traced, 0.0004, 2);
  ASSERT_TRUE(capped.ok());
  EXPECT_NEAR(*capped, (0.0003 + 0.0002) / 2, 1e-12);
  EXPECT_EQ(PrefillLoopGap(steps, traced, 0.0004, 3).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(PrefillLoopGap(steps, {}, 0.002, 1).status().code(), StatusCode::kFailedPrecondition);
}

CalibrationRunFactors MakeRun(double rate, double cpu_per_request, double stretch, double corun,
                              std::vector<double> outside) {
  CalibrationRunFactors r;
  r.rate = rate;
  r.client_cpu = ClientCpuCost{cpu_per_request, 0.0001};
  r.prefill_stretch = stretch + 0.1;
  r.decode_stretch = stretch;
  r.decode_seq_stretch = stretch + 0.2;
  r.decode_corun = corun;
  r.prefill_loop_gap_s = stretch * 1e-3;
  for (size_t m = 0; m < kArrivalMeasures; ++m) {  // each measure its own figures
    r.prefill_arrival_work_s[m] = stretch * 0.5e-3 * static_cast<double>(m + 1);
    r.prefill_stretch_left_out[m] = stretch + 0.05 * static_cast<double>(m + 1);
  }
  r.outside_s = std::move(outside);
  for (double o : r.outside_s) r.inbound_s.push_back(o / 2);  // each run's own ways in
  for (double o : r.outside_s) r.tail_s.push_back(-o / 4);    // and tails
  return r;
}

// The 03:22 case: one run of three in a slow spell moves none of the factors.
TEST(ValidateRateCalibration, OneSlowRunOfThreeMovesNoFactor) {
  const std::vector<CalibrationRunFactors> runs = {
      MakeRun(40, 0.0017, 1.02, 1.04, {0.002, 0.003}),
      MakeRun(40, 0.0030, 1.26, 1.12, {0.004, 0.009}),  // the slow spell
      MakeRun(40, 0.0016, 1.04, 1.05, {0.002, 0.002}),
  };
  auto c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->rate, 40);
  EXPECT_EQ(c->runs, 3);
  ASSERT_TRUE(c->decode_stretch && c->decode_corun && c->client_cpu);
  EXPECT_DOUBLE_EQ(*c->decode_stretch, 1.04);
  ASSERT_TRUE(c->decode_seq_stretch);
  EXPECT_DOUBLE_EQ(*c->decode_seq_stretch, 1.24);
  EXPECT_DOUBLE_EQ(*c->prefill_stretch, 1.14);
  EXPECT_EQ(c->prefill_runs, 3);
  ASSERT_TRUE(c->prefill_loop_gap_s);
  EXPECT_DOUBLE_EQ(*c->prefill_loop_gap_s, 1.04e-3);
  EXPECT_EQ(c->loop_gap_runs, 3);
  for (size_t m = 0; m < kArrivalMeasures; ++m) {
    ASSERT_TRUE(c->prefill_arrival_work_s[m] && c->prefill_stretch_left_out[m]) << m;
    EXPECT_DOUBLE_EQ(*c->prefill_arrival_work_s[m], 0.52e-3 * static_cast<double>(m + 1));
    EXPECT_DOUBLE_EQ(*c->prefill_stretch_left_out[m], 1.04 + 0.05 * static_cast<double>(m + 1));
    EXPECT_EQ(c->arrival_work_runs[m], 3);
    EXPECT_EQ(c->left_out_runs[m], 3);
  }
  EXPECT_DOUBLE_EQ(*c->decode_corun, 1.05);
  EXPECT_EQ(c->client_run, 0u);  // 1.7 ms + 32 x 0.1 ms: the middle cost
  EXPECT_DOUBLE_EQ(c->client_cpu->per_request_s, 0.0017);
  EXPECT_DOUBLE_EQ(c->client_cpu->per_token_s, 0.0001);
  EXPECT_EQ(c->outside_run, 0u);  // means 2.5, 6.5, 2.0 ms: the first run's whole sample
  EXPECT_EQ(c->outside_s, (std::vector<double>{0.002, 0.003}));
  EXPECT_EQ(c->inbound_s, (std::vector<double>{0.001, 0.0015}));   // the same run's ways in
  EXPECT_EQ(c->tail_s, (std::vector<double>{-0.0005, -0.00075}));  // and tails
  EXPECT_EQ(c->stretch_runs, 3);
  EXPECT_EQ(c->corun_runs, 3);
  EXPECT_EQ(c->client_runs, 3);
  EXPECT_EQ(c->outside_runs, 3);
}

// The step factors: every run's sequence whole, one after another in run order (a round holds
// as much of the host's time as the rate's runs together); runs without one are skipped.
TEST(ValidateRateCalibration, StepFactorsAreTheRunsSequencesInRunOrder) {
  std::vector<CalibrationRunFactors> runs = {MakeRun(20, 0.002, 1.0, 1.0, {}),
                                             MakeRun(20, 0.002, 1.0, 1.0, {}),
                                             MakeRun(20, 0.002, 1.0, 1.0, {})};
  runs[0].decode_step_factors = {1.0, 1.2};
  runs[2].decode_step_factors = {3.0, 0.9, 1.1};
  runs[1].prefill_step_factors = {0.8, 1.2};
  auto c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->step_factor_runs, 2);
  EXPECT_EQ(c->decode_step_factors, (std::vector<double>{1.0, 1.2, 3.0, 0.9, 1.1}));
  EXPECT_EQ(c->prefill_factor_runs, 1);
  EXPECT_EQ(c->prefill_step_factors, (std::vector<double>{0.8, 1.2}));
  for (auto& r : runs) r.decode_step_factors.clear(), r.prefill_step_factors.clear();
  c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->step_factor_runs, 0);
  EXPECT_TRUE(c->decode_step_factors.empty());
  EXPECT_TRUE(c->prefill_step_factors.empty());
  runs[2].prefill_step_factors = {std::nan("")};
  EXPECT_EQ(CombineCalibrationRuns(runs, 32).status().code(), StatusCode::kInvalidArgument);
}

TEST(ValidateRateCalibration, AFactorIsTakenOverTheRunsThatGaveIt) {
  std::vector<CalibrationRunFactors> runs = {
      MakeRun(10, 0.002, 1.10, 1.00, {}),
      MakeRun(10, 0.003, 1.00, 1.08, {0.005}),
      MakeRun(10, 0.001, 1.20, 1.02, {0.001, 0.002}),
  };
  runs[0].decode_corun.reset();    // too few co-run steps
  runs[2].decode_stretch.reset();  // too few alone steps
  runs[2].decode_seq_stretch.reset();
  runs[0].decode_seq_stretch = 1.5;
  runs[1].prefill_stretch.reset();
  runs[1].client_cpu.reset();
  auto c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->decode_run, 0u);                // the upper of 1.00 and 1.10
  EXPECT_DOUBLE_EQ(*c->decode_stretch, 1.10);  // and that run's pair
  EXPECT_DOUBLE_EQ(*c->decode_seq_stretch, 1.50);
  EXPECT_EQ(c->stretch_runs, 2);
  EXPECT_DOUBLE_EQ(*c->prefill_stretch, 1.30);  // the upper of 1.20 and 1.30
  EXPECT_EQ(c->prefill_runs, 2);
  EXPECT_DOUBLE_EQ(*c->decode_corun, 1.08);  // the upper of 1.02 and 1.08
  EXPECT_EQ(c->corun_runs, 2);
  EXPECT_EQ(c->client_run, 0u);  // runs 0 and 2: the upper cost
  EXPECT_EQ(c->client_runs, 2);
  EXPECT_EQ(c->outside_run, 1u);  // runs 1 (5 ms) and 2 (1.5 ms): the upper mean
  EXPECT_EQ(c->outside_runs, 2);
}

// The 17:40 case at 60% load: four runs' split decode stretches trade per step against per
// sequence. Their medians taken apart (x0.937 per step, x1.278 per sequence) were slower at every
// batch size than any run measured; the pair is the run with the median unsplit stretch.
TEST(ValidateRateCalibration, TheDecodeStretchPairIsOneRunsWhole) {
  const double step[] = {0.677, 0.518, 0.937, 0.975};
  const double seq[] = {1.278, 1.521, 1.115, 1.033};
  const double alone[] = {1.02, 1.08, 1.05, 1.00};
  std::vector<CalibrationRunFactors> runs;
  for (int i = 0; i < 4; ++i) {
    runs.push_back(MakeRun(50, 0.002, step[i], 1.0, {}));
    runs.back().decode_seq_stretch = seq[i];
    runs.back().decode_alone_stretch = alone[i];
  }
  auto c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->decode_run, 2u);  // unsplit 1.00, 1.02, 1.05, 1.08: the upper middle one
  EXPECT_DOUBLE_EQ(*c->decode_stretch, 0.937);
  EXPECT_DOUBLE_EQ(*c->decode_seq_stretch, 1.115);
  EXPECT_EQ(c->stretch_runs, 4);
  // A run without the unsplit figure is ordered by its per-step stretch; one without a
  // per-sequence stretch (unsplit) gives its per-step one for both.
  runs[3].decode_alone_stretch.reset();  // ordered by 0.975
  runs[3].decode_seq_stretch.reset();
  runs[0].decode_alone_stretch = 0.95;
  runs[2].decode_alone_stretch = 0.9;
  c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->decode_run, 3u);  // 0.9, 0.95, 0.975, 1.08: the upper middle
  EXPECT_DOUBLE_EQ(*c->decode_stretch, 0.975);
  EXPECT_DOUBLE_EQ(*c->decode_seq_stretch, 0.975);
  runs[1].decode_seq_stretch = std::nan("");
  EXPECT_EQ(CombineCalibrationRuns(runs, 32).status().code(), StatusCode::kInvalidArgument);
}

// Rows of b = 1..4 sequences: simulated alone steps 0.3 ms per step + 0.2 ms per sequence, real
// ones (step + loop) `a` x 0.3 + `c` x 0.2 per sequence, `n1` steps of one sequence and fewer of
// more (as DecodeFactorsUnderLoad's split test).
void SplitRows(double a, double c, int64_t n1, CalibrationRunFactors* r) {
  r->decode_real_rows.clear();
  r->decode_sim_rows.clear();
  for (int b = 1; b <= 4; ++b) {
    BatchStepStats real, sim;
    real.batch = sim.batch = b;
    real.count = sim.count = b == 1 ? n1 : n1 / (4 * b);
    real.gap_count = real.count;
    real.mean_alone_s = (a * 0.3 + c * 0.2 * b - 0.05) * 1e-3;
    real.mean_gap_s = 0.05e-3;
    sim.mean_alone_s = (0.3 + 0.2 * b) * 1e-3;
    r->decode_real_rows.push_back(real);
    r->decode_sim_rows.push_back(sim);
  }
  r->decode_fixed_s = 0.3e-3;
}

// The split over the runs' rows together, at the taken run's level: three runs whose steps all
// split x0.9 per step and x1.5 per sequence give that split, scaled to the median run's unsplit
// stretch; runs whose own splits scatter give the split of their rows merged.
TEST(ValidateRateCalibration, ThePooledSplitIsFittedOverTheRunsRowsTogether) {
  std::vector<CalibrationRunFactors> runs;
  for (double level : {1.1, 1.3, 1.2}) {
    runs.push_back(MakeRun(30, 0.002, 0.8, 1.0, {}));
    runs.back().decode_alone_stretch = level;
    SplitRows(0.9, 1.5, 1000, &runs.back());
  }
  auto one = DecodeFactorsUnderLoad(runs[0].decode_real_rows, runs[0].decode_sim_rows, 1, 0.3e-3);
  ASSERT_TRUE(one.ok() && one->split);
  auto c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->decode_run, 2u);  // 1.1, 1.3, 1.2: the median is run 2's 1.2
  ASSERT_TRUE(c->pooled_decode_stretch && c->pooled_decode_seq_stretch);
  EXPECT_EQ(c->pooled_split_runs, 3);
  EXPECT_NEAR(*c->pooled_decode_stretch, 0.9 * 1.2 / one->stretch, 1e-9);
  EXPECT_NEAR(*c->pooled_decode_seq_stretch, 1.5 * 1.2 / one->stretch, 1e-9);

  // Scattered runs: the pooled split is the merged rows' split, not any run's.
  SplitRows(0.6, 1.7, 400, &runs[0]);
  SplitRows(1.1, 1.3, 1000, &runs[1]);
  c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok() && c->pooled_decode_stretch);
  auto real = MergeDecodeStepStats(runs[0].decode_real_rows, runs[1].decode_real_rows);
  auto sim = MergeDecodeStepStats(runs[0].decode_sim_rows, runs[1].decode_sim_rows);
  ASSERT_TRUE(real.ok() && sim.ok());
  real = MergeDecodeStepStats(*real, runs[2].decode_real_rows);
  sim = MergeDecodeStepStats(*sim, runs[2].decode_sim_rows);
  ASSERT_TRUE(real.ok() && sim.ok());
  auto pooled = DecodeFactorsUnderLoad(*real, *sim, 1, 0.3e-3);
  ASSERT_TRUE(pooled.ok() && pooled->split);
  EXPECT_NEAR(*c->pooled_decode_stretch, pooled->step_stretch * 1.2 / pooled->stretch, 1e-9);
  EXPECT_NEAR(*c->pooled_decode_seq_stretch, pooled->seq_stretch * 1.2 / pooled->stretch, 1e-9);
  EXPECT_GT(*c->pooled_decode_seq_stretch / *c->pooled_decode_stretch, 1.3 / 1.1);
  EXPECT_LT(*c->pooled_decode_seq_stretch / *c->pooled_decode_stretch, 1.7 / 0.6);

  // Two runs with rows still pool; one does not; nor do runs split at other per-step parts.
  runs[0].decode_real_rows.clear();
  c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pooled_split_runs, 2);
  runs[1].decode_sim_rows.clear();
  c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->pooled_decode_stretch);
  EXPECT_EQ(c->pooled_split_runs, 0);
  SplitRows(0.9, 1.5, 1000, &runs[0]);
  SplitRows(0.9, 1.5, 1000, &runs[1]);
  runs[1].decode_fixed_s = 0.25e-3;
  c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->pooled_decode_stretch);
}

// The paired rule's variants: the rate's pooled split at a round's own run's level, or at the
// mean level of the runs before and after the round.
TEST(ValidateRateCalibration, ThePooledSplitMovesToARunsLevelAndTheBracketsMean) {
  std::vector<CalibrationRunFactors> runs;
  for (double level : {1.1, 1.3, 1.2}) {
    runs.push_back(MakeRun(30, 0.002, 0.8, 1.0, {}));
    runs.back().decode_alone_stretch = level;
    SplitRows(0.9, 1.5, 1000, &runs.back());
  }
  auto c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok() && c->pooled_decode_stretch) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->pooled_split_level, 1.2);  // the median run's
  for (const CalibrationRunFactors& r : runs) {
    auto at = PooledSplitAtLevel(*c, *DecodeLevel(r));
    ASSERT_TRUE(at.ok() && *at);
    EXPECT_NEAR((*at)->step, *c->pooled_decode_stretch * *r.decode_alone_stretch / 1.2, 1e-12);
    EXPECT_NEAR((*at)->seq, *c->pooled_decode_seq_stretch * *r.decode_alone_stretch / 1.2, 1e-12);
    // The shape stays the pooled one's.
    EXPECT_NEAR((*at)->seq / (*at)->step, *c->pooled_decode_seq_stretch / *c->pooled_decode_stretch,
                1e-12);
  }
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_EQ(PooledSplitAtLevel(*c, bad).status().code(), StatusCode::kInvalidArgument);
  }
  // No pooled split: none at any level.
  RateCalibration none;
  auto at = PooledSplitAtLevel(none, 1.2);
  ASSERT_TRUE(at.ok());
  EXPECT_FALSE(*at);

  // A run's level: its unsplit stretch, or its stretch without a split; none without either.
  CalibrationRunFactors unsplit;
  EXPECT_FALSE(DecodeLevel(unsplit));
  EXPECT_FALSE(BracketedDecodeLevel(unsplit, &runs[0]));
  unsplit.decode_stretch = 1.4;
  EXPECT_DOUBLE_EQ(*DecodeLevel(unsplit), 1.4);
  // Bracketed: the mean of before and after; before alone without an after or its level.
  EXPECT_DOUBLE_EQ(*BracketedDecodeLevel(runs[0], &runs[1]), 1.2);
  EXPECT_DOUBLE_EQ(*BracketedDecodeLevel(runs[0], nullptr), 1.1);
  CalibrationRunFactors no_level;
  EXPECT_DOUBLE_EQ(*BracketedDecodeLevel(runs[1], &no_level), 1.3);
  EXPECT_DOUBLE_EQ(*BracketedDecodeLevel(runs[1], &unsplit), (1.3 + 1.4) / 2);
}

// The batch factors: a run's against its own split (the paired rule's variant), the rate's over
// the runs' rows together against the pooled split before its scaling (a shape, not a level).
TEST(ValidateRateCalibration, DecodeBatchFactorsOfARunAndOfTheRunsTogether) {
  std::vector<CalibrationRunFactors> runs;
  for (double level : {1.1, 1.3, 1.2}) {
    runs.push_back(MakeRun(30, 0.002, 0.8, 1.0, {}));
    runs.back().decode_alone_stretch = level;
    SplitRows(0.9, 1.5, 1000, &runs.back());
  }
  // Batch 3 of the second run ran 10% longer than its linear split says.
  runs[1].decode_real_rows[2].mean_alone_s += 0.1 * (0.9 * 0.3 + 1.5 * 0.2 * 3) * 1e-3;
  for (auto& r : runs) {
    auto own = DecodeFactorsUnderLoad(r.decode_real_rows, r.decode_sim_rows, 1, 0.3e-3);
    ASSERT_TRUE(own.ok() && own->split);
    r.decode_stretch = own->step_stretch;
    r.decode_seq_stretch = own->seq_stretch;
  }
  const std::vector<double> first = RunDecodeBatchFactors(runs[0]);
  ASSERT_EQ(first.size(), 4u);
  for (double k : first) EXPECT_NEAR(k, 1.0, 1e-9);  // a linear run: nothing to reshape
  const std::vector<double> second = RunDecodeBatchFactors(runs[1]);
  ASSERT_EQ(second.size(), 4u);
  EXPECT_GT(second[2], second[1]);
  EXPECT_GT(second[2], 1.05);
  auto c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->pooled_decode_batch_factors.size(), 4u);
  // Pooled, batch 3 is a third as long beyond the split as in the second run alone (and the
  // split moves a little toward it).
  EXPECT_GT(c->pooled_decode_batch_factors[2], 1.0);
  EXPECT_LT(c->pooled_decode_batch_factors[2], second[2]);
  // No split without rows or stretches; no pooled factors without a pooled split.
  CalibrationRunFactors bare = runs[0];
  bare.decode_seq_stretch.reset();
  EXPECT_TRUE(RunDecodeBatchFactors(bare).empty());
  bare = runs[0];
  bare.decode_real_rows.clear();
  EXPECT_TRUE(RunDecodeBatchFactors(bare).empty());
  for (size_t i = 1; i < runs.size(); ++i) runs[i].decode_real_rows.clear();
  c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->pooled_decode_batch_factors.empty());
}

// The prefill chunk factors are fitted over every run's steps together: two runs of 10 two-prompt
// steps each give one count with 20.
TEST(ValidateRateCalibration, PrefillChunkFactorsPoolTheRunsSteps) {
  std::vector<CalibrationRunFactors> runs;
  for (int k = 0; k < 2; ++k) {
    runs.push_back(MakeRun(30, 0.002, 1.0, 1.0, {}));
    for (auto [chunks, n, real_ms, sim_ms] : {std::tuple{1, int64_t{30}, 55.0, 50.0},
                                              std::tuple{2, kMinSplitRowSteps / 2, 120.0, 100.0}}) {
      for (int i = 0; i < n; ++i) {
        StepRecord s;
        s.prefill_tokens = 100 * chunks;
        s.prefill_chunks = chunks;
        s.duration_s = real_ms * 1e-3;
        runs.back().prefill_real_steps.push_back(s);
        s.duration_s = sim_ms * 1e-3;
        runs.back().prefill_sim_steps.push_back(s);
      }
    }
  }
  auto one = CombineCalibrationRuns(std::span(runs).first(1), 32);
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->prefill_chunk_factors.empty());  // a run's 10 two-prompt steps: too few
  auto c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->prefill_chunk_factors.size(), 2u);
  const double busy = (30 * 55.0 + 10 * 120.0) / (30 * 50.0 + 10 * 100.0);
  EXPECT_NEAR(c->prefill_chunk_factors[0], 1.1 / busy, 1e-12);
  EXPECT_NEAR(c->prefill_chunk_factors[1], 1.2 / busy, 1e-12);
  for (auto& r : runs) r.prefill_real_steps.clear();
  c = CombineCalibrationRuns(runs, 32);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->prefill_chunk_factors.empty());
}

TEST(ValidateRateCalibration, FactorsNoRunGaveStayUnset) {
  CalibrationRunFactors r;
  r.rate = 5;
  auto c = CombineCalibrationRuns(std::vector<CalibrationRunFactors>{r, r}, 32);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->decode_stretch);
  EXPECT_FALSE(c->decode_seq_stretch);
  EXPECT_FALSE(c->prefill_stretch);
  EXPECT_FALSE(c->prefill_loop_gap_s);
  EXPECT_EQ(c->loop_gap_runs, 0);
  for (size_t m = 0; m < kArrivalMeasures; ++m) {
    EXPECT_FALSE(c->prefill_arrival_work_s[m]);
    EXPECT_FALSE(c->prefill_stretch_left_out[m]);
    EXPECT_EQ(c->arrival_work_runs[m] + c->left_out_runs[m], 0);
  }
  EXPECT_FALSE(c->decode_corun);
  EXPECT_FALSE(c->client_cpu);
  EXPECT_FALSE(c->client_run);
  EXPECT_FALSE(c->outside_run);
  EXPECT_FALSE(c->decode_run);
  EXPECT_TRUE(c->outside_s.empty());
  EXPECT_TRUE(c->inbound_s.empty());
  EXPECT_TRUE(c->tail_s.empty());
  EXPECT_EQ(c->runs, 2);
  EXPECT_EQ(c->stretch_runs + c->prefill_runs + c->corun_runs + c->client_runs + c->outside_runs,
            0);
}

TEST(ValidateRateCalibration, CombineRefusesNoRunsMixedRatesAndBadFigures) {
  EXPECT_EQ(CombineCalibrationRuns({}, 32).status().code(), StatusCode::kInvalidArgument);
  std::vector<CalibrationRunFactors> mixed = {MakeRun(10, 0.001, 1, 1, {}),
                                              MakeRun(20, 0.001, 1, 1, {})};
  EXPECT_EQ(CombineCalibrationRuns(mixed, 32).status().code(), StatusCode::kInvalidArgument);
  std::vector<CalibrationRunFactors> zero = {MakeRun(0, 0.001, 1, 1, {})};
  EXPECT_EQ(CombineCalibrationRuns(zero, 32).status().code(), StatusCode::kInvalidArgument);
  std::vector<CalibrationRunFactors> ok = {MakeRun(10, 0.001, 1, 1, {})};
  EXPECT_EQ(CombineCalibrationRuns(ok, -1).status().code(), StatusCode::kInvalidArgument);
  std::vector<CalibrationRunFactors> cost = {MakeRun(10, std::nan(""), 1, 1, {})};
  EXPECT_EQ(CombineCalibrationRuns(cost, 32).status().code(), StatusCode::kInvalidArgument);
  std::vector<CalibrationRunFactors> stretch = {MakeRun(10, 0.001, std::nan(""), 1, {})};
  EXPECT_EQ(CombineCalibrationRuns(stretch, 32).status().code(), StatusCode::kInvalidArgument);
  std::vector<CalibrationRunFactors> outside = {MakeRun(10, 0.001, 1, 1, {std::nan("")})};
  EXPECT_EQ(CombineCalibrationRuns(outside, 32).status().code(), StatusCode::kInvalidArgument);
  for (double bad : {-1e-3, std::nan("")}) {
    std::vector<CalibrationRunFactors> gap = {MakeRun(10, 0.001, 1, 1, {})};
    gap[0].prefill_loop_gap_s = bad;
    EXPECT_EQ(CombineCalibrationRuns(gap, 32).status().code(), StatusCode::kInvalidArgument);
    for (size_t m = 0; m < kArrivalMeasures; ++m) {
      std::vector<CalibrationRunFactors> work = {MakeRun(10, 0.001, 1, 1, {})};
      work[0].prefill_arrival_work_s[m] = bad;
      auto refused = CombineCalibrationRuns(work, 32);
      EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << m;
      EXPECT_NE(refused.status().message().find("arrival work"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace pd::planner
