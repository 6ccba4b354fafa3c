#include "planner/step_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace pd::planner {
namespace {

// A Chrome trace as `pdserve serve --trace` writes it: engine steps among other events.
std::string Trace() {
  return R"({"traceEvents":[
    {"name":"thread_name","cat":"__metadata","ph":"M","ts":0,"pid":1,"tid":1,"args":{"name":"engine"}},
    {"name":"step","cat":"engine","ph":"X","ts":3000,"dur":500,"pid":1,"tid":1,
     "args":{"step":2,"prefill_chunks":0,"prefill_tokens":0,"decodes":2}},
    {"name":"layer","cat":"compute","ph":"X","ts":1000,"dur":100,"pid":1,"tid":1,"args":{}},
    {"name":"step","cat":"engine","ph":"X","ts":1000,"dur":400,"pid":1,"tid":1,
     "args":{"step":1,"prefill_chunks":0,"prefill_tokens":0,"decodes":1}},
    {"name":"step","cat":"engine","ph":"X","ts":9000,"dur":900,"pid":1,"tid":1,
     "args":{"step":3,"prefill_chunks":1,"prefill_tokens":16,"decodes":1}},
    {"name":"http request","cat":"http","ph":"i","ts":1500,"pid":1,"tid":2,"args":{}}
  ],"displayTimeUnit":"ms"})";
}

TEST(StepStats, EngineStepsFromTraceKeepsStepsInTheWindowInStartOrder) {
  auto all = EngineStepsFromTrace(Trace(), 0.0, 1.0);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_DOUBLE_EQ((*all)[0].start_s, 1e-3);
  EXPECT_DOUBLE_EQ((*all)[0].duration_s, 0.4e-3);
  EXPECT_EQ((*all)[0].decode_seqs, 1);
  EXPECT_EQ((*all)[1].decode_seqs, 2);
  EXPECT_EQ((*all)[2].prefill_tokens, 16);
  // A step counts when it starts in the window.
  auto window = EngineStepsFromTrace(Trace(), 2e-3, 9e-3);
  ASSERT_TRUE(window.ok());
  ASSERT_EQ(window->size(), 2u);
  EXPECT_EQ((*window)[0].decode_seqs, 2);
}

TEST(StepStats, EngineStepsFromTraceRefusesWhatIsNotATrace) {
  EXPECT_FALSE(EngineStepsFromTrace("not json", 0, 1).ok());
  EXPECT_FALSE(EngineStepsFromTrace(R"({"events":[]})", 0, 1).ok());
  // A step without its batch arguments cannot be sorted into a row.
  EXPECT_FALSE(
      EngineStepsFromTrace(
          R"({"traceEvents":[{"name":"step","cat":"engine","ph":"X","ts":1,"dur":2}]})", 0, 1)
          .ok());
}

TEST(StepStats, MarkCorunIsTheOtherInstanceMidStepAtTheStart) {
  std::vector<StepRecord> decode = {{1.0, 0.1, 1, 0, true},
                                    {2.0, 0.1, 1, 0, false},
                                    {3.0, 0.1, 1, 0, false},
                                    {4.5, 0.1, 1, 0, false}};
  const std::vector<StepRecord> prefill = {{1.5, 1.0, 0, 128, false},   // covers 2.0
                                           {2.6, 0.4, 0, 128, false},   // ends exactly at 3.0
                                           {4.0, 1.0, 0, 128, false}};  // covers 4.5
  MarkCorun(decode, prefill);
  EXPECT_FALSE(decode[0].corun);  // before any prefill step (the stale flag is cleared)
  EXPECT_TRUE(decode[1].corun);
  EXPECT_FALSE(decode[2].corun);
  EXPECT_TRUE(decode[3].corun);
}

TEST(StepStats, SummarizeDecodeStepsByBatchWithLoopGaps) {
  // batch 1 alone 0.4 ms, gap 0.1 ms; batch 1 corun 0.6 ms, then a 5 ms wait (not a loop gap);
  // batch 2 0.5 ms, gap 0.2 ms; a prefill step (left out); batch 9 pooled into the last row.
  const std::vector<StepRecord> steps = {{0.0000, 0.0004, 1, 0, false},
                                         {0.0005, 0.0006, 1, 0, true},
                                         {0.0061, 0.0005, 2, 0, false},
                                         {0.0068, 0.0010, 1, 64, false},
                                         {0.0080, 0.0020, 9, 0, false}};
  const auto rows = SummarizeDecodeSteps(steps, 4, 2e-3);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].batch, 1);
  EXPECT_EQ(rows[0].count, 2);
  EXPECT_EQ(rows[0].corun_count, 1);
  EXPECT_NEAR(rows[0].mean_s, 0.0005, 1e-12);
  EXPECT_NEAR(rows[0].mean_alone_s, 0.0004, 1e-12);
  EXPECT_NEAR(rows[0].mean_corun_s, 0.0006, 1e-12);
  EXPECT_EQ(rows[0].gap_count, 1);  // the 5 ms wait is left out
  EXPECT_NEAR(rows[0].mean_gap_s, 0.0001, 1e-12);
  EXPECT_EQ(rows[1].count, 1);
  EXPECT_NEAR(rows[1].mean_gap_s, 0.0002, 1e-12);
  EXPECT_EQ(rows[2].count, 0);
  EXPECT_EQ(rows[3].batch, 4);
  EXPECT_EQ(rows[3].count, 1);      // 9 sequences, in the last row
  EXPECT_EQ(rows[3].gap_count, 0);  // the last step has no next
  const std::string table = FormatStepComparison(rows, rows);
  EXPECT_NE(table.find("4+"), std::string::npos);
  EXPECT_EQ(table.find("\n     3 |"), std::string::npos);  // no row with no steps
}

TEST(StepStats, DecodeStepFactorsAreEachStepOverItsClassMeanInStartOrder) {
  // ms: batch 1 alone 0.4 + gap 0.1; batch 1 alone 0.4 + a 5 ms wait for the core (kept);
  // batch 1, a KV ready in its gap (left out); batch 2 co-run 0.6 + 0.2; a step with a prefill
  // chunk (left out); batch 2 co-run 0.8 + 0.1; batch 2 co-run before a step that decodes
  // nothing (left out); that last step (no next).
  const std::vector<StepRecord> steps = {
      {0.0000, 0.0004, 1, 0, false}, {0.0005, 0.0004, 1, 0, false},  {0.0059, 0.0004, 1, 0, false},
      {0.0064, 0.0006, 2, 0, true},  {0.0072, 0.0010, 1, 64, false}, {0.0083, 0.0008, 2, 0, true},
      {0.0092, 0.0008, 2, 0, true},  {0.0101, 0.0010, 0, 64, false}};
  const std::vector<double> ready = {0.00635, 1e-7};  // any order
  const std::vector<double> k = DecodeStepFactors(steps, ready, 2e-3);
  // Class (1, alone): mean step 0.4 + mean short gap 0.1 = 0.5 ms; (2, co-run): 0.7 + 0.15.
  ASSERT_EQ(k.size(), 4u);
  EXPECT_NEAR(k[0], 0.5 / 0.5, 1e-9);
  EXPECT_NEAR(k[1], 5.4 / 0.5, 1e-9);  // the wait for the core stays in its step's factor
  EXPECT_NEAR(k[2], 0.8 / 0.85, 1e-9);
  EXPECT_NEAR(k[3], 0.9 / 0.85, 1e-9);
  // With every gap counted as the loop's, the class mean holds the wait and shares it out.
  const std::vector<double> all = DecodeStepFactors(steps, ready, 1.0);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_NEAR(all[1], 5.4 / (0.4 + 2.55), 1e-9);
  EXPECT_TRUE(DecodeStepFactors({}, ready, 2e-3).empty());
  EXPECT_TRUE(DecodeStepFactors({steps.data(), 1}, {}, 2e-3).empty());  // no next step
}

TEST(StepStats, PrefillStepFactorsAreEachStepOverTheModelOverItsCoRunMarksMean) {
  StepCoeffs model;
  model.prefill = {1.0, 0.1, 0.001};  // ms: 100 tokens 21 ms; two chunks of 50: 16 ms
  StepRecord one{0.000, 0.021, 0, 100, false}, two{0.030, 0.032, 0, 100, false};
  two.prefill_chunks = 2;
  one.prefill_chunks = 1;
  StepRecord busy = one, decode{0.080, 0.001, 3, 0, false};
  busy.start_s = 0.1;
  busy.duration_s = 0.063;  // 3x the model while the other instance ran: its own mark's mean
  busy.corun = true;
  const std::vector<StepRecord> steps = {one, two, decode, busy};
  const std::vector<double> k = PrefillStepFactors(steps, model);
  // Alone: ratios 1 and 2, mean 1.5; co-run: 3 alone in its mark.
  ASSERT_EQ(k.size(), 3u);
  EXPECT_NEAR(k[0], 1.0 / 1.5, 1e-9);
  EXPECT_NEAR(k[1], 2.0 / 1.5, 1e-9);
  EXPECT_NEAR(k[2], 1.0, 1e-9);
  EXPECT_TRUE(PrefillStepFactors({&decode, 1}, model).empty());
  EXPECT_TRUE(PrefillStepFactors(steps, StepCoeffs{}).empty());  // the model gives no time
  // The trace's chunk count is read with the step.
  auto parsed = EngineStepsFromTrace(Trace(), 0, 1);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->back().prefill_chunks, 1);
  EXPECT_EQ(parsed->front().prefill_chunks, 0);
}

TEST(StepStats, SimulatorRecordsEachStepWithItsCorunFlag) {
  InstanceConfig prefill;
  prefill.role = Role::kPrefill;
  prefill.coeffs.prefill = {10.0, 0, 0};      // 10 ms per step
  prefill.policy.max_num_batched_tokens = 8;  // one 8-token prompt per step
  InstanceConfig decode;
  decode.role = Role::kDecode;
  decode.coeffs.decode_small = {1.0, 0, 0};  // 1 ms per step
  decode.coeffs.decode_threshold = 95;
  decode.corun_slowdown = 2.0;
  const std::vector<InstanceConfig> insts = {prefill, decode};
  // The second prompt's prefill (10-20 ms) runs while the first one decodes (from 10 ms).
  const std::vector<SimRequest> reqs = {{0, 0.0, 8, 3}, {1, 0.0, 8, 3}};
  SimOptions so;
  so.record_steps = true;
  auto r = Simulate(insts, ClusterLinks{}, reqs, so);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto d = StepsOfInstance(*r, 1);
  const auto p = StepsOfInstance(*r, 0);
  ASSERT_FALSE(d.empty());
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(static_cast<int64_t>(d.size() + p.size()), r->num_steps);
  for (const StepRecord& s : d) {
    EXPECT_EQ(s.prefill_tokens, 0);
    EXPECT_NEAR(s.duration_s, s.corun ? 2e-3 : 1e-3, 1e-12);
  }
  EXPECT_TRUE(d.front().corun);  // the first decode step starts as the second prompt prefills
  EXPECT_NEAR(d.front().start_s, 0.010, 1e-12);
  // Without record_steps nothing is kept.
  auto quiet = Simulate(insts, ClusterLinks{}, reqs, SimOptions{});
  ASSERT_TRUE(quiet.ok());
  EXPECT_TRUE(quiet->steps.empty());
}

// A SummarizeDecodeSteps row: `alone` + `corun` steps of b sequences with these means (ms).
BatchStepStats Row(int b, int64_t alone, int64_t corun, double alone_ms, double corun_ms,
                   double gap_ms) {
  BatchStepStats r;
  r.batch = b;
  r.count = alone + corun;
  r.corun_count = corun;
  r.gap_count = r.count;
  r.mean_alone_s = alone_ms * 1e-3;
  r.mean_corun_s = corun_ms * 1e-3;
  r.mean_gap_s = gap_ms * 1e-3;
  return r;
}

TEST(StepStats, DecodeFactorsUnderLoadPoolBatchSizesByTheRealCounts) {
  // Real: 300 alone steps of 1 sequence at 0.5 + 0.1 ms loop, 100 of 2 at 0.7 + 0.2 ms; co-run:
  // 100 of 1 at 0.56 ms, 100 of 2 at 0.79 ms. Simulated alone: 0.5 and 0.75 ms.
  const std::vector<BatchStepStats> real = {Row(1, 300, 100, 0.5, 0.56, 0.1),
                                            Row(2, 100, 100, 0.7, 0.79, 0.2)};
  const std::vector<BatchStepStats> sim = {Row(1, 50, 10, 0.5, 0.6, 0.0),
                                           Row(2, 20, 5, 0.75, 0.9, 0.0)};
  auto f = DecodeFactorsUnderLoad(real, sim, 400);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->alone_steps, 400);
  EXPECT_EQ(f->corun_steps, 200);
  // (300 * 0.6 + 100 * 0.9) / (300 * 0.5 + 100 * 0.75) = 270 / 225.
  EXPECT_NEAR(f->stretch, 1.2, 1e-12);
  // (100 * 0.66 + 100 * 0.99) / (100 * 0.6 + 100 * 0.9) = 165 / 150.
  EXPECT_NEAR(f->corun, 1.1, 1e-12);
}

TEST(StepStats, DecodeFactorsUnderLoadSkipRowsWithoutACounterpart) {
  // Batch 2 has no simulated alone step (left out of the stretch) and batch 3 no real alone step
  // (left out of both); batch 1 has no co-run step, so only batch 2's count for the co-run.
  const std::vector<BatchStepStats> real = {Row(1, 10, 0, 0.5, 0.0, 0.1),
                                            Row(2, 5, 5, 0.7, 0.84, 0.0), Row(3, 0, 7, 0, 9.0, 1)};
  const std::vector<BatchStepStats> sim = {Row(1, 10, 0, 0.4, 0.0, 0.0), Row(2, 0, 3, 0, 2.0, 0)};
  auto f = DecodeFactorsUnderLoad(real, sim, 10);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->alone_steps, 10);
  EXPECT_NEAR(f->stretch, 0.6 / 0.4, 1e-12);
  EXPECT_EQ(f->corun_steps, 5);
  EXPECT_NEAR(f->corun, 1.2, 1e-12);
  // No co-run step at all: the co-run factor stays 1.
  const std::vector<BatchStepStats> alone_only = {Row(1, 10, 0, 0.5, 0.0, 0.1)};
  auto g = DecodeFactorsUnderLoad(alone_only, sim, 1);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->corun_steps, 0);
  EXPECT_EQ(g->corun, 1.0);
}

TEST(StepStats, DecodeFactorsUnderLoadSplitTheStretchIntoStepAndSequenceParts) {
  // Simulated alone steps: 0.3 ms per step + 0.2 ms per sequence. Real (step + loop): 0.27 ms per
  // step + 0.3 ms per sequence, i.e. x0.9 and x1.5, with most steps of one sequence.
  auto real_ms = [](int b) { return 0.9 * 0.3 + 1.5 * 0.2 * b; };
  auto sim_ms = [](int b) { return 0.3 + 0.2 * b; };
  std::vector<BatchStepStats> real, sim;
  for (int b = 1; b <= 4; ++b) {
    const int64_t n = b == 1 ? 1000 : 1000 / (4 * b);
    real.push_back(Row(b, n, 0, real_ms(b) - 0.05, 0.0, 0.05));  // 0.05 ms of it in the loop
    sim.push_back(Row(b, n, 0, sim_ms(b), 0.0, 0.0));
  }
  auto f = DecodeFactorsUnderLoad(real, sim, 100, 0.3e-3);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE(f->split);
  EXPECT_NEAR(f->step_stretch, 0.9, 1e-9);
  EXPECT_NEAR(f->seq_stretch, 1.5, 1e-9);
  // The pooled factor is what one factor gives, dominated by the steps of one sequence.
  EXPECT_GT(f->stretch, 1.0);
  EXPECT_LT(f->stretch, 1.3);
  // Without the per-step part the stretch is not split: both parts take the pooled factor.
  auto g = DecodeFactorsUnderLoad(real, sim, 100);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->split);
  EXPECT_EQ(g->step_stretch, g->stretch);
  EXPECT_EQ(g->seq_stretch, g->stretch);
  // One batch size with enough steps cannot be split (the rest have under kMinSplitRowSteps).
  std::vector<BatchStepStats> one = real;
  for (size_t i = 1; i < one.size(); ++i) one[i].count = kMinSplitRowSteps - 1;
  auto h = DecodeFactorsUnderLoad(one, sim, 100, 0.3e-3);
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(h->split);
  EXPECT_EQ(h->seq_stretch, h->stretch);
  // A fit outside [0.5, 2] (real steps that shrink with the batch) is refused.
  std::vector<BatchStepStats> odd = real;
  for (int b = 1; b <= 4; ++b) odd[b - 1].mean_alone_s = (1.2 - 0.2 * b) * 1e-3;
  auto k = DecodeFactorsUnderLoad(odd, sim, 100, 0.3e-3);
  ASSERT_TRUE(k.ok());
  EXPECT_FALSE(k->split);
  EXPECT_EQ(k->step_stretch, k->stretch);
}

// A decode step concave in the batch (the engine on a CPU host) against a simulation linear in
// it: the split fits the batches most steps are, and the batch factors put each batch size's
// real mean back, weighted by the real counts averaging 1.
TEST(StepStats, DecodeBatchFactorsAreTheRealStepsOverTheSplitsByBatchSize) {
  // Real step + loop: 2.0, 3.0, 3.6, 4.1, 4.5 ms at 1-5 sequences; simulated: 1.2 + 0.6 ms per
  // sequence; 0.1 ms of the real in the loop.
  const double real_ms[] = {2.0, 3.0, 3.6, 4.1, 4.5};
  const int64_t count[] = {4000, 1500, 600, 200, 60};
  auto sim_ms = [](int b) { return 1.2 + 0.6 * b; };
  std::vector<BatchStepStats> real, sim;
  for (int b = 1; b <= 5; ++b) {
    real.push_back(Row(b, count[b - 1], 100, real_ms[b - 1] - 0.1, 9.0, 0.1));
    sim.push_back(Row(b, 300, 50, sim_ms(b), 9.0, 0.0));
  }
  auto f = DecodeFactorsUnderLoad(real, sim, 100, 1.2e-3);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE(f->split);
  const std::vector<double> k =
      DecodeBatchFactors(real, sim, 1.2e-3, f->step_stretch, f->seq_stretch, kMinSplitRowSteps);
  ASSERT_EQ(k.size(), 5u);
  double weighted = 0, real_total = 0, split_total = 0;
  for (int b = 1; b <= 5; ++b) {
    const double split_ms = f->step_stretch * 1.2 + f->seq_stretch * 0.6 * b;
    EXPECT_NEAR(k[b - 1] * split_ms, real_ms[b - 1], 1e-9) << b;
    weighted += count[b - 1] * k[b - 1] * split_ms;
    real_total += count[b - 1] * real_ms[b - 1];
    split_total += count[b - 1] * split_ms;
  }
  EXPECT_NEAR(weighted, real_total, 1e-6);
  // The least-squares split keeps the total: the factors reshape, they do not rescale.
  EXPECT_NEAR(split_total, real_total, 1e-6 * real_total);
  // Concave: the split is long at the larger batches.
  EXPECT_LT(k[4], k[2]);
  EXPECT_LT(k[4], 1.0);
}

// Prefill steps dearer per prompt than the model says: the factors put each prompt count's real
// mean back over the busy ratio; a count with too few real steps or no simulated one takes the
// count below's, and the vector ends at the last count with its own.
TEST(StepStats, PrefillChunkFactorsAreTheRealStepsOverTheSimulatedByPromptsComputed) {
  std::vector<StepRecord> real, sim;
  const auto add = [](std::vector<StepRecord>* v, int n, int chunks, double ms) {
    for (int k = 0; k < n; ++k) {
      StepRecord s;
      s.duration_s = ms * 1e-3;
      s.prefill_tokens = 100 * chunks;
      s.prefill_chunks = chunks;
      v->push_back(s);
    }
  };
  // Real: 60 ms a one-prompt step, 126 for two, 195 for three (3 steps only), 260 for four;
  // simulated: 50 a prompt. Decode-only steps on either side are left out.
  add(&real, 100, 1, 60);
  add(&real, 30, 2, 126);
  add(&real, 3, 3, 195);
  add(&real, 20, 4, 260);
  add(&real, 50, 0, 1);
  add(&sim, 90, 1, 50);
  add(&sim, 30, 2, 100);
  add(&sim, 5, 3, 150);
  add(&sim, 20, 4, 200);
  real.back().decode_seqs = 1;
  const double busy =
      (100 * 60.0 + 30 * 126 + 3 * 195 + 20 * 260) / (90 * 50.0 + 30 * 100 + 5 * 150 + 20 * 200);
  std::vector<double> k = PrefillChunkFactors(real, sim, 20);
  ASSERT_EQ(k.size(), 4u);
  EXPECT_NEAR(k[0], 60.0 / 50 / busy, 1e-12);
  EXPECT_NEAR(k[1], 126.0 / 100 / busy, 1e-12);
  EXPECT_EQ(k[2], k[1]);  // 3 real steps, under 20
  EXPECT_NEAR(k[3], 260.0 / 200 / busy, 1e-12);
  EXPECT_GT(k[1], k[0]);
  // A count past the last measured one: the vector ends there (the simulator holds the last).
  add(&real, 40, 6, 400);
  k = PrefillChunkFactors(real, sim, 20);  // no simulated step of 6 prompts
  EXPECT_EQ(k.size(), 4u);
  // Too few one-prompt steps, no larger count with its own, or no time on either side: none.
  EXPECT_TRUE(PrefillChunkFactors(real, sim, 101).empty());
  EXPECT_TRUE(PrefillChunkFactors(real, sim, 31).empty());  // only the 100 one-prompt steps
  EXPECT_TRUE(PrefillChunkFactors({}, sim, 20).empty());
  EXPECT_TRUE(PrefillChunkFactors(real, {}, 20).empty());
}

TEST(StepStats, DecodeBatchFactorsHoldTheLastMeasuredBatchAndNeedBatchOne) {
  // Batch 2 has too few real alone steps, batch 3 no simulated one, batch 4 is measured, batch 5
  // is not: 2 and 3 take batch 1's factor, and the factors end at batch 4.
  const std::vector<BatchStepStats> real = {
      Row(1, 100, 0, 1.9, 0, 0.1), Row(2, kMinSplitRowSteps - 1, 50, 2.5, 3, 0.1),
      Row(3, 100, 0, 3.0, 0, 0.1), Row(4, 100, 0, 3.9, 0, 0.1), Row(5, 5, 0, 9.0, 0, 0.1)};
  const std::vector<BatchStepStats> sim = {Row(1, 10, 0, 1.0, 0, 0), Row(2, 10, 0, 1.5, 0, 0),
                                           Row(3, 0, 4, 0.0, 2.5, 0), Row(4, 10, 0, 2.5, 0, 0),
                                           Row(5, 10, 0, 3.0, 0, 0)};
  // Split x1.5 on a 0.5 ms per-step part, x2 on the rest: batch 1 predicted 0.75 + 1.0.
  const std::vector<double> k = DecodeBatchFactors(real, sim, 0.5e-3, 1.5, 2.0, kMinSplitRowSteps);
  ASSERT_EQ(k.size(), 4u);
  EXPECT_NEAR(k[0], 2.0 / 1.75, 1e-12);
  EXPECT_EQ(k[1], k[0]);
  EXPECT_EQ(k[2], k[0]);
  EXPECT_NEAR(k[3], 4.0 / (0.75 + 2.0 * 2.0), 1e-12);
  // Batch 1 without enough steps, or a stretch or per-step part that is not usable: none.
  std::vector<BatchStepStats> no_one = real;
  no_one[0].count = no_one[0].corun_count = 0;
  EXPECT_TRUE(DecodeBatchFactors(no_one, sim, 0.5e-3, 1.5, 2.0, kMinSplitRowSteps).empty());
  EXPECT_TRUE(DecodeBatchFactors(real, sim, -1e-3, 1.5, 2.0, kMinSplitRowSteps).empty());
  EXPECT_TRUE(DecodeBatchFactors(real, sim, 0.5e-3, 0.0, 2.0, kMinSplitRowSteps).empty());
  EXPECT_TRUE(DecodeBatchFactors(real, sim, 0.5e-3, 1.5, std::nan(""), kMinSplitRowSteps).empty());
  EXPECT_TRUE(DecodeBatchFactors({}, sim, 0.5e-3, 1.5, 2.0, kMinSplitRowSteps).empty());
}

// Two runs' tables merged are the table of both runs' steps together (their gaps apart).
TEST(StepStats, MergeDecodeStepStatsIsTheTableOfBothRunsSteps) {
  auto step = [](double start_ms, double ms, int seqs, bool corun) {
    StepRecord s;
    s.start_s = start_ms * 1e-3;
    s.duration_s = ms * 1e-3;
    s.decode_seqs = seqs;
    s.corun = corun;
    return s;
  };
  const std::vector<StepRecord> a = {step(0, 0.5, 1, false), step(0.6, 0.7, 2, true),
                                     step(1.4, 0.6, 1, false), step(2.1, 0.9, 3, false)};
  const std::vector<StepRecord> b = {step(0, 0.4, 1, true), step(0.5, 0.8, 2, false),
                                     step(1.5, 0.5, 1, false)};
  std::vector<StepRecord> both = a;
  for (StepRecord s : b) {
    s.start_s += 1.0;  // a second later: the gap between the runs is over max_gap_s
    both.push_back(s);
  }
  const auto ta = SummarizeDecodeSteps(a, 4, 2e-3);
  const auto tb = SummarizeDecodeSteps(b, 2, 2e-3);  // a shorter table
  auto merged = MergeDecodeStepStats(ta, tb);
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  const auto want = SummarizeDecodeSteps(both, 4, 2e-3);
  ASSERT_EQ(merged->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ((*merged)[i].batch, want[i].batch);
    EXPECT_EQ((*merged)[i].count, want[i].count);
    EXPECT_EQ((*merged)[i].corun_count, want[i].corun_count);
    EXPECT_EQ((*merged)[i].gap_count, want[i].gap_count);
    EXPECT_NEAR((*merged)[i].mean_s, want[i].mean_s, 1e-15);
    EXPECT_NEAR((*merged)[i].mean_alone_s, want[i].mean_alone_s, 1e-15);
    EXPECT_NEAR((*merged)[i].mean_corun_s, want[i].mean_corun_s, 1e-15);
    EXPECT_NEAR((*merged)[i].mean_gap_s, want[i].mean_gap_s, 1e-15);
  }
  EXPECT_EQ((*merged)[0].count, 4);  // batch 1: two steps of each run
  // Merging with nothing gives the table back; a row out of place is refused.
  auto same = MergeDecodeStepStats(ta, {});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ((*same)[1].count, ta[1].count);
  std::vector<BatchStepStats> shifted = tb;
  shifted[0].batch = 2;
  EXPECT_EQ(MergeDecodeStepStats(ta, shifted).status().code(), StatusCode::kInvalidArgument);
}

TEST(StepStats, DecodeFactorsUnderLoadRefuseTooFewSteps) {
  const std::vector<BatchStepStats> real = {Row(1, 10, 0, 0.5, 0.0, 0.1)};
  const std::vector<BatchStepStats> sim = {Row(1, 10, 0, 0.4, 0.0, 0.0)};
  auto f = DecodeFactorsUnderLoad(real, sim, 11);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(DecodeFactorsUnderLoad(real, {}, 1).ok());  // nothing simulated
  EXPECT_FALSE(DecodeFactorsUnderLoad({}, {}, 0).ok());    // nothing at all
}

}  // namespace
}  // namespace pd::planner
