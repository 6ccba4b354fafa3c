#include "planner/validate_trace.h"

#include <gtest/gtest.h>

#include <cmath>

namespace pd::planner {
namespace {

// An event at `ms` milliseconds lasting `dur_ms`.
TraceEvent Ev(const std::string& name, double ms, double dur_ms, TraceArgs args,
              const std::string& cat = "") {
  TraceEvent e;
  e.name = name;
  e.cat = cat;
  e.ph = dur_ms > 0 ? 'X' : 'i';
  e.ts_ns = std::llround(ms * 1e6);
  e.dur_ns = std::llround(dur_ms * 1e6);
  e.args = std::move(args);
  return e;
}
TraceArg Int(const std::string& key, int64_t v) { return {key, v}; }
TraceArg Text(const std::string& key, const std::string& v) { return {key, v}; }

// Request "a" (16 tokens): sent at 1 ms, got at 2, computed by prefill step 7 (3-8 ms), KV ready
// at 7.5, first decode step 8-9, written at 9.2 and 9.8. Request "b" has no KV ready: left out.
struct TwoTraces {
  std::vector<TraceEvent> prefill, decode;
  TwoTraces() {
    prefill = {
        Ev("transfer", 2, 0.5, {Text("request", "a")}),
        Ev("post writes", 5, 0.1, {Text("request", "a"), Int("step", 7)}),
        Ev("step", 3, 5, {Int("step", 7), Int("decodes", 0), Int("prefill_tokens", 16)}, "engine")};
    decode = {Ev("prefill request sent", 1, 0,
                 {Text("request", "a"), Int("tokens", 15), Int("engine_request", 1)}),
              Ev("prefill request sent", 1.5, 0, {Text("request", "b"), Int("tokens", 15)}),
              Ev("kv ready", 7.5, 0, {Text("request", "a")}),
              Ev("step", 8, 1, {Int("decodes", 1), Int("prefill_tokens", 0)}, "engine"),
              Ev("first token written", 9.2, 0, {Int("request", 1)}),
              Ev("last token written", 9.8, 0, {Int("request", 1)})};
  }
};

TEST(ValidateTrace, JoinsARequestsPartsAcrossTheTwoTraces) {
  const TwoTraces t;
  const std::vector<TracedRequest> r = TracedRequests(t.prefill, t.decode);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].prompt_tokens, 16);
  EXPECT_NEAR(r[0].arrived_s(), 2e-3, 1e-12);
  EXPECT_NEAR(r[0].step_begin_s, 3e-3, 1e-12);
  EXPECT_NEAR(r[0].engines_s(), 7e-3, 1e-12);  // 2 ms to the decode step's end at 9
  EXPECT_NEAR(r[0].last_written_s - r[0].first_written_s, 0.6e-3, 1e-12);
  auto f = KvReadyFraction(r, 1);
  ASSERT_TRUE(f.ok());
  EXPECT_NEAR(*f, 0.9, 1e-12);  // 4.5 ms into a 5 ms step
  EXPECT_EQ(KvReadyFraction(r, 2).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(InWindow(r, &TracedRequest::sent_s, 0, 0.5e-3).size(), 0u);
  EXPECT_EQ(InWindow(r, &TracedRequest::sent_s, 0, 1e-3).size(), 1u);
  auto steps = EngineSteps(t.decode);
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 1u);
  EXPECT_EQ((*steps)[0].decode_seqs, 1);
  const std::vector<TraceEvent> bad = {Ev("step", 1, 1, {Text("decodes", "x")}, "engine")};
  EXPECT_EQ(EngineSteps(bad).status().code(), StatusCode::kInvalidArgument);
}

// Client requests sent at 0, 10, 20 ms (the client's clock) reach the decode instance 100 ms
// later on the traces' clock (+0.1 ms for the second): each joins its own traced request.
TEST(ValidateTrace, OutsideLatencyJoinsByOffsetAndPromptLength) {
  std::vector<TracedRequest> traced(3);
  std::vector<ClientRequest> client;
  for (int i = 0; i < 3; ++i) {
    TracedRequest& t = traced[i];
    t.prompt_tokens = 16 + i;
    t.sent_s = 0.100 + 0.010 * i + (i == 1 ? 0.0001 : 0);
    t.got_s = t.step_begin_s = t.sent_s + 0.001 * (i + 1);
    t.first_step_end_s = t.got_s + 0.005;
    t.first_written_s = t.first_step_end_s;
    t.last_written_s = t.first_written_s + 0.002;
    client.push_back({0.010 * i, 16 + i, 0.008, 0.0025});
  }
  client.push_back({0.5, 99, 0.01, 0.0025});  // no traced request of its length
  auto j = JoinOutsideLatency(client, traced);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  ASSERT_EQ(j->outside_s.size(), 3u);
  for (double o : j->outside_s) EXPECT_NEAR(o, 0.003, 1e-9);  // TTFT less the 5 ms engines part
  EXPECT_NEAR(j->inbound_s[2] - j->inbound_s[0], 0.002, 1e-9);
  ASSERT_EQ(j->tail_s.size(), 3u);
  EXPECT_NEAR(j->tail_s[0], 0.0005, 1e-9);
  EXPECT_FALSE(JoinOutsideLatency(std::vector<ClientRequest>{{0, 99, 0.01}}, traced).ok());
}

TEST(ValidateTrace, OutsideLatencyDrawsTheSameSampleForARequestEveryTime) {
  const OutsideLatency c = OutsideLatency::Constant(0.002);
  EXPECT_DOUBLE_EQ(c.For(5), 0.002);
  EXPECT_DOUBLE_EQ(c.InboundFor(5), 0.0);
  OutsideSamples s{{0.001, 0.002, -0.001, 0.004}, {0.0, 0.001, 0.002, 0.003}, {}};
  auto o = OutsideLatency::Sampled(s, 7);
  ASSERT_TRUE(o.ok());
  for (int64_t id = 0; id < 50; ++id) {
    const double v = o->For(id);
    EXPECT_EQ(v, o->For(id));
    EXPECT_TRUE(v == 0.001 || v == 0.002 || v == 0.0 || v == 0.004) << v;  // negative: 0
    EXPECT_GE(o->InboundFor(id), 0.0);
    EXPECT_EQ(o->TailFor(id), 0.0);
  }
  s.tail_s = {0.1};
  EXPECT_FALSE(OutsideLatency::Sampled(s, 7).ok());  // not in step with the samples
  EXPECT_FALSE(OutsideLatency::Sampled({{NAN}, {}, {}}, 7).ok());
  EXPECT_FALSE(OutsideLatency::Sampled({}, 7).ok());
}

TEST(ValidateTrace, MarkCorunSaysWhetherTheOtherInstanceWasMidStep) {
  std::vector<StepRecord> decode = {{0.0, 1.0}, {2.0, 1.0}, {5.5, 1.0}};
  const std::vector<StepRecord> prefill = {{1.5, 1.0}, {4.0, 1.0}, {5.0, 2.0}};
  MarkCorun(decode, prefill);
  EXPECT_FALSE(decode[0].corun);
  EXPECT_TRUE(decode[1].corun);  // the prefill step 1.5-2.5 runs at 2.0
  EXPECT_TRUE(decode[2].corun);  // 5.0-7.0 runs at 5.5
  EXPECT_EQ(InWindow(decode, &StepRecord::start_s, 1.0, 5.5).size(), 2u);
}

}  // namespace
}  // namespace pd::planner
