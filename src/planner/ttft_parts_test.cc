#include "planner/ttft_parts.h"

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

namespace pd::planner {
namespace {

using nlohmann::json;

// Events as `pdserve serve --trace` writes them: "ts"/"dur" in microseconds.
json Instant(const std::string& name, double ts_ms, json args) {
  return {{"name", name}, {"cat", "kv"}, {"ph", "i"}, {"ts", ts_ms * 1e3}, {"args", args}};
}
json Span(const std::string& name, const std::string& cat, double ts_ms, double dur_ms, json args) {
  return {{"name", name},      {"cat", cat},          {"ph", "X"},
          {"ts", ts_ms * 1e3}, {"dur", dur_ms * 1e3}, {"args", args}};
}
std::string Doc(const std::vector<json>& events) { return json{{"traceEvents", events}}.dump(); }

// Request "a" (prompt 93 tokens: the trace says 92) in one prefill step; "b" (prompt 201) split
// over steps 1 and 2 (chunked prefill); "c" never got its KV (left out).
struct Traces {
  std::string prefill, decode;
};
Traces ThreeRequests() {
  std::vector<json> pre = {
      Instant("prefill request", 100.5, {{"request", "a"}, {"tokens", 92}}),
      Span("step", "engine", 101.0, 10.0, {{"step", 0}, {"prefill_tokens", 92}, {"decodes", 0}}),
      Span("post writes", "kv", 105.0, 0.01, {{"request", "a"}, {"layer", 0}, {"step", 0}}),
      Span("layer", "compute", 101.0, 2.0, {{"layer", 0}, {"step", 0}}),
      // "transfer" spans from admission to the done message; "b" was admitted at 107.6 ms, before
      // its "prefill request" instant.
      Span("transfer", "kv", 100.6, 12.0, {{"request", "a"}, {"tokens", 92}}),
      Span("transfer", "kv", 107.6, 20.0, {{"request", "b"}, {"tokens", 200}}),
      Instant("prefill request", 108.0, {{"request", "b"}, {"tokens", 200}}),
      Span("step", "engine", 111.5, 12.0, {{"step", 1}, {"prefill_tokens", 180}, {"decodes", 0}}),
      Span("post writes", "kv", 115.0, 0.01, {{"request", "b"}, {"layer", 0}, {"step", 1}}),
      Span("step", "engine", 124.0, 3.0, {{"step", 2}, {"prefill_tokens", 20}, {"decodes", 0}}),
      Span("post writes", "kv", 125.0, 0.01, {{"request", "b"}, {"layer", 3}, {"step", 2}}),
      Instant("prefill request", 130.0, {{"request", "c"}, {"tokens", 50}}),
      Span("step", "engine", 130.2, 5.0, {{"step", 3}, {"prefill_tokens", 50}, {"decodes", 0}}),
      Span("post writes", "kv", 131.0, 0.01, {{"request", "c"}, {"layer", 0}, {"step", 3}}),
  };
  std::vector<json> dec = {
      Instant("prefill request sent", 100.0, {{"request", "a"}, {"tokens", 92}, {"attempt", 1}}),
      Instant("prefill request sent", 107.0, {{"request", "b"}, {"tokens", 200}, {"attempt", 1}}),
      Instant("prefill request sent", 129.0, {{"request", "c"}, {"tokens", 50}, {"attempt", 1}}),
      Instant("kv ready", 112.0, {{"request", "a"}}),
      Span("step", "engine", 111.0, 0.5, {{"step", 7}, {"prefill_tokens", 0}, {"decodes", 1}}),
      Span("step", "engine", 112.3, 0.6, {{"step", 8}, {"prefill_tokens", 0}, {"decodes", 2}}),
      Instant("kv ready", 128.0, {{"request", "b"}}),
      Span("step", "engine", 128.4, 0.7, {{"step", 9}, {"prefill_tokens", 0}, {"decodes", 2}}),
  };
  return {Doc(pre), Doc(dec)};
}

TEST(TtftParts, TracedRequestsSplitTheEnginesPart) {
  const Traces t = ThreeRequests();
  auto r = TracedRequestsFromTraces(t.prefill, t.decode);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);  // "c" has no "kv ready"
  const TracedRequest& a = (*r)[0];
  EXPECT_EQ(a.id, "a");
  EXPECT_EQ(a.prompt_tokens, 93);
  EXPECT_NEAR(a.front_s(), 0.5e-3, 1e-9);
  EXPECT_NEAR(a.wait_s(), 0.5e-3, 1e-9);
  EXPECT_NEAR(a.step_s(), 10e-3, 1e-9);
  EXPECT_NEAR(a.handover_s(), 1e-3, 1e-9);
  // The decode step begun at 111.0 ms ran before the KV was ready: the first token's is 112.3.
  EXPECT_NEAR(a.decode_s(), 0.9e-3, 1e-9);
  EXPECT_NEAR(a.engines_s(), 112.9e-3 - 100.5e-3, 1e-9);
  const TracedRequest& b = (*r)[1];
  EXPECT_EQ(b.prompt_tokens, 201);
  // Admitted at 107.6 ms ("transfer"), traced "prefill request" at 108.0.
  EXPECT_NEAR(b.front_s(), 0.6e-3, 1e-9);
  // Chunked over steps 1 and 2: from the first one's begin to the last one's end.
  EXPECT_NEAR(b.wait_s(), 3.9e-3, 1e-9);
  EXPECT_NEAR(b.step_s(), 15.5e-3, 1e-9);
  EXPECT_NEAR(b.handover_s(), 1e-3, 1e-9);
  EXPECT_NEAR(b.decode_s(), 1.1e-3, 1e-9);
}

TEST(TtftParts, ARequestTracedAfterItsStepBeganArrivedAtTheStep) {
  // The prefill instance's compute thread started the step 2 ms before its messenger thread
  // (same core) traced "prefill request": the request had arrived by the step's start.
  const std::string pre = Doc({
      Span("step", "engine", 101.0, 10.0, {{"step", 0}, {"prefill_tokens", 92}, {"decodes", 0}}),
      Instant("prefill request", 103.0, {{"request", "a"}, {"tokens", 92}}),
      Span("post writes", "kv", 105.0, 0.01, {{"request", "a"}, {"layer", 0}, {"step", 0}}),
  });
  const std::string dec = Doc({
      Instant("prefill request sent", 100.0, {{"request", "a"}, {"tokens", 92}}),
      Instant("kv ready", 111.5, {{"request", "a"}}),
      Span("step", "engine", 111.6, 0.5, {{"step", 1}, {"prefill_tokens", 0}, {"decodes", 1}}),
  });
  auto r = TracedRequestsFromTraces(pre, dec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_NEAR((*r)[0].front_s(), 1e-3, 1e-9);
  EXPECT_NEAR((*r)[0].wait_s(), 0.0, 1e-9);
  EXPECT_NEAR((*r)[0].engines_s(), 11.1e-3, 1e-9);
}

TEST(TtftParts, TracedRequestsTakeTheirWritesThroughTheEngineRequestId) {
  // "a" (engine request 5) and "b" (engine request 6) as ThreeRequests, with the decode
  // instance's HTTP server writing each one's first and last token; "b" was retried (a second
  // attempt under another messenger id names the same engine request). Engine request 9 is
  // written but never sent (a prompt of one token decodes without the messenger).
  Traces t = ThreeRequests();
  json dec = json::parse(t.decode);
  auto& ev = dec["traceEvents"];
  for (json& e : ev) {
    if (e["name"] != "prefill request sent") continue;
    if (e["args"]["request"] == "a") e["args"]["engine_request"] = 5;
    if (e["args"]["request"] == "b") e["args"]["engine_request"] = 6;
  }
  ev.push_back(Instant("prefill request sent", 120.0,
                       {{"request", "b2"}, {"engine_request", 6}, {"tokens", 200}}));
  for (auto [name, id, ts] : {std::tuple{"first token written", 5, 113.1},
                              {"last token written", 5, 121.0},
                              {"first token written", 6, 129.5},
                              {"last token written", 6, 140.0},
                              {"first token written", 9, 150.0},
                              {"last token written", 9, 151.0}}) {
    json e = Instant(name, ts, {{"request", id}});
    e["cat"] = "http";
    ev.push_back(e);
  }
  auto r = TracedRequestsFromTraces(t.prefill, dec.dump());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_TRUE((*r)[0].has_written());
  EXPECT_NEAR((*r)[0].first_written_s, 113.1e-3, 1e-9);
  EXPECT_NEAR((*r)[0].written_span_s(), 7.9e-3, 1e-9);
  EXPECT_EQ((*r)[1].id, "b");
  EXPECT_NEAR((*r)[1].written_span_s(), 10.5e-3, 1e-9);
  // Without the engine request ids (an older trace) the writes stay unknown.
  auto old = TracedRequestsFromTraces(t.prefill, t.decode);
  ASSERT_TRUE(old.ok());
  for (const TracedRequest& q : *old) EXPECT_FALSE(q.has_written());
}

TEST(TtftParts, TracedRequestsRejectWhatIsNotATrace) {
  const Traces t = ThreeRequests();
  EXPECT_EQ(TracedRequestsFromTraces("{", t.decode).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TracedRequestsFromTraces(t.prefill, "{\"events\":[]}").status().code(),
            StatusCode::kInvalidArgument);
  auto none = TracedRequestsFromTraces(Doc({}), Doc({}));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TracedRequest Traced(double sent_s, int prompt, double engines_s) {
  TracedRequest r;
  r.sent_s = sent_s;
  r.prompt_tokens = prompt;
  r.got_s = sent_s + 0.0005;
  r.step_begin_s = r.step_end_s = r.kv_ready_s = r.got_s;
  r.first_step_end_s = r.got_s + engines_s;
  return r;
}

TracedRequest Stepped(double begin_s, double end_s, double kv_ready_s) {
  TracedRequest r = Traced(begin_s, 16, 0.001);
  r.step_begin_s = begin_s;
  r.step_end_s = end_s;
  r.kv_ready_s = kv_ready_s;
  return r;
}

TEST(TtftParts, KvReadyFractionIsTheMedianShareOfTheStepBeforeTheKvWasWhole) {
  const std::vector<TracedRequest> traced = {
      Stepped(1.0, 1.010, 1.009),   // 0.9
      Stepped(2.0, 2.020, 2.016),   // 0.8
      Stepped(3.0, 3.010, 3.0095),  // 0.95
      Stepped(4.0, 4.0, 4.001),     // no step length: left out
      Stepped(5.0, 5.010, 5.030)};  // after the step's end: capped at 1
  auto f = KvReadyFraction(traced, 3);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_NEAR(*f, 0.925, 1e-9);  // the median of 0.8, 0.9, 0.95, 1
  EXPECT_EQ(KvReadyFraction(traced, 5).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(KvReadyFraction({}, 0).status().code(), StatusCode::kFailedPrecondition);
  // A ready point at or before the step's start is a broken trace, not a fraction of 0.
  const std::vector<TracedRequest> broken = {Stepped(1.0, 1.010, 1.009),
                                             Stepped(2.0, 2.010, 1.999)};
  auto b = KvReadyFraction(broken, 1);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("before"), std::string::npos);
}

TEST(TtftParts, JoinFindsEachRequestsTraceByArrivalAndLength) {
  // The client's clock starts at steady-clock 5000 s; each request reaches the decode instance
  // 0.8-1.6 ms after it was sent. Requests 1 and 2 arrive 0.3 ms apart and are traced in the
  // other order; request 3 is missing from the trace (past its cap); a probe's request before
  // the run and one of the same length as request 0 long after it are in the trace too.
  const double t0 = 5000.0;
  const std::vector<ClientRequest> client = {{0.000, 100, 0.020},
                                             {0.050, 120, 0.030},
                                             {0.0503, 90, 0.025},
                                             {0.100, 150, 0.040},
                                             {0.160, 64, 0.018}};
  std::vector<TracedRequest> traced = {
      Traced(t0 - 3.0, 100, 0.010),             // a probe
      Traced(t0 + 0.0010, 100, 0.016),          // request 0: outside 4 ms
      Traced(t0 + 0.0503 + 0.0008, 90, 0.020),  // request 2, sent first
      Traced(t0 + 0.050 + 0.0016, 120, 0.025),  // request 1
      Traced(t0 + 0.160 + 0.0012, 64, 0.0135),  // request 4
      Traced(t0 + 0.400, 100, 0.010),           // a later request of request 0's length
  };
  auto j = JoinOutsideLatency(client, traced);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  std::map<size_t, std::pair<size_t, double>> by_client;
  for (const OutsideSample& s : *j) by_client[s.client] = {s.traced, s.outside_s};
  ASSERT_EQ(by_client.size(), 4u);
  EXPECT_EQ(by_client.count(3), 0u);
  EXPECT_EQ(by_client[0].first, 1u);
  EXPECT_EQ(by_client[1].first, 3u);
  EXPECT_EQ(by_client[2].first, 2u);
  EXPECT_EQ(by_client[4].first, 4u);
  EXPECT_NEAR(by_client[0].second, 0.004, 1e-9);
  EXPECT_NEAR(by_client[1].second, 0.005, 1e-9);
  EXPECT_NEAR(by_client[2].second, 0.005, 1e-9);
  EXPECT_NEAR(by_client[4].second, 0.0045, 1e-9);
}

TEST(TtftParts, JoinGivesEachRequestsTailFromBothSpans) {
  // Request 0: the client saw 10.0 ms from its first token to its last, the writes were 10.2 ms
  // apart (its last token got out 0.2 ms quicker than its first). Request 1: the client lacks
  // the span; request 2: the trace lacks the writes. Both of those have no tail.
  const double t0 = 40.0;
  std::vector<ClientRequest> client = {
      {0.0, 100, 0.02, 0.0100}, {0.1, 110, 0.02, -1}, {0.2, 120, 0.02, 0.008}};
  std::vector<TracedRequest> traced = {Traced(t0 + 0.001, 100, 0.015),
                                       Traced(t0 + 0.101, 110, 0.015),
                                       Traced(t0 + 0.201, 120, 0.015)};
  for (TracedRequest& r : {std::ref(traced[0]), std::ref(traced[1])}) {
    r.first_written_s = r.first_step_end_s + 0.0001;
    r.last_written_s = r.first_written_s + 0.0102;
  }
  auto j = JoinOutsideLatency(client, traced);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  ASSERT_EQ(j->size(), 3u);
  EXPECT_NEAR((*j)[0].tail_s, -0.0002, 1e-9);
  EXPECT_TRUE(std::isnan((*j)[1].tail_s));
  EXPECT_TRUE(std::isnan((*j)[2].tail_s));
}

TEST(TtftParts, JoinTakesTheNearestOfTwoRequestsOfOneLength) {
  // Two requests of 128 tokens 4 ms apart, their traces in order: each gets its own.
  const double t0 = 70.0;
  const std::vector<ClientRequest> client = {
      {1.000, 128, 0.030}, {1.004, 128, 0.010}, {2.000, 77, 0.012}};
  const std::vector<TracedRequest> traced = {Traced(t0 + 1.001, 128, 0.027),
                                             Traced(t0 + 1.005, 128, 0.006),
                                             Traced(t0 + 2.001, 77, 0.010)};
  auto j = JoinOutsideLatency(client, traced);
  ASSERT_TRUE(j.ok());
  ASSERT_EQ(j->size(), 3u);
  EXPECT_EQ((*j)[0].traced, 0u);
  EXPECT_NEAR((*j)[0].outside_s, 0.003, 1e-9);
  EXPECT_EQ((*j)[1].traced, 1u);
  EXPECT_NEAR((*j)[1].outside_s, 0.004, 1e-9);
}

TEST(TtftParts, JoinFailsWithoutACommonRequestOrWithBadOptions) {
  const std::vector<ClientRequest> client = {{0.0, 100, 0.02}};
  const std::vector<TracedRequest> other_len = {Traced(10.0, 99, 0.01)};
  EXPECT_EQ(JoinOutsideLatency(client, other_len).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(JoinOutsideLatency({}, other_len).status().code(), StatusCode::kInvalidArgument);
  const std::vector<TracedRequest> same = {Traced(10.0, 100, 0.01)};
  EXPECT_TRUE(JoinOutsideLatency(client, same).ok());
  EXPECT_EQ(JoinOutsideLatency(client, same, {0.0, 0.01}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(JoinOutsideLatency(client, same, {0.002, -1.0}).status().code(),
            StatusCode::kInvalidArgument);
  // A client request without a TTFT (NaN) is not joined.
  const std::vector<ClientRequest> no_ttft = {{0.0, 100, std::nan("")}};
  EXPECT_EQ(JoinOutsideLatency(no_ttft, same).status().code(), StatusCode::kInvalidArgument);
}

TEST(TtftParts, ConstantOutsideLatencyIsTheSameForEveryRequest) {
  const OutsideLatency c = OutsideLatency::Constant(0.0015);
  EXPECT_FALSE(c.sampled());
  EXPECT_DOUBLE_EQ(c.For(0), 0.0015);
  EXPECT_DOUBLE_EQ(c.For(123), 0.0015);
  EXPECT_DOUBLE_EQ(c.Quantile(0.9), 0.0015);
  EXPECT_DOUBLE_EQ(c.Mean(), 0.0015);
  EXPECT_DOUBLE_EQ(OutsideLatency().For(5), 0.0);
}

TEST(TtftParts, SampledOutsideLatencyDrawsEachSampleAlikeAndRepeatably) {
  auto o = OutsideLatency::Sampled({0.003, 0.004, -0.001, 0.005}, 7);
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->sampled());
  std::map<double, int> counts;
  for (int64_t id = 0; id < 40000; ++id) {
    const double v = o->For(id);
    EXPECT_DOUBLE_EQ(v, o->For(id));  // the same request draws the same sample
    ++counts[v];
  }
  // The negative sample counts as 0; each of the four is drawn about a quarter of the time.
  const std::set<double> values = {0.0, 0.003, 0.004, 0.005};
  ASSERT_EQ(counts.size(), 4u);
  for (const auto& [v, n] : counts) {
    EXPECT_EQ(values.count(v), 1u) << v;
    EXPECT_NEAR(n / 40000.0, 0.25, 0.02) << v;
  }
  EXPECT_DOUBLE_EQ(o->Quantile(0.0), 0.0);
  EXPECT_DOUBLE_EQ(o->Quantile(1.0), 0.005);
  EXPECT_NEAR(o->Quantile(0.5), 0.0035, 1e-12);
  EXPECT_NEAR(o->Mean(), 0.003, 1e-12);
  // Another seed draws another sequence.
  auto other = OutsideLatency::Sampled({0.003, 0.004, -0.001, 0.005}, 8);
  ASSERT_TRUE(other.ok());
  int differ = 0;
  for (int64_t id = 0; id < 100; ++id) differ += o->For(id) != other->For(id);
  EXPECT_GT(differ, 30);
}

TEST(TtftParts, SampledOutsideLatencyNeedsFiniteSamples) {
  EXPECT_EQ(OutsideLatency::Sampled({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OutsideLatency::Sampled({0.001, INFINITY}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OutsideLatency::Sampled({std::nan("")}).status().code(), StatusCode::kInvalidArgument);
}

TEST(TtftParts, JoinGivesEachRequestsWayInAgainstTheTypicalOne) {
  // As JoinFindsEachRequestsTraceByArrivalAndLength: the decode instance sends the prefill
  // requests 1.0, 1.6, 0.8 and 1.2 ms after the client sent them, and the prefill instance has
  // each 0.5 ms later; the way in differs by the same amounts.
  const double t0 = 5000.0;
  const std::vector<ClientRequest> client = {
      {0.000, 100, 0.020}, {0.050, 120, 0.030}, {0.0503, 90, 0.025}, {0.160, 64, 0.018}};
  const std::vector<TracedRequest> traced = {
      Traced(t0 + 0.0010, 100, 0.016), Traced(t0 + 0.0503 + 0.0008, 90, 0.020),
      Traced(t0 + 0.050 + 0.0016, 120, 0.025), Traced(t0 + 0.160 + 0.0012, 64, 0.0135)};
  auto j = JoinOutsideLatency(client, traced);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  ASSERT_EQ(j->size(), 4u);
  std::map<size_t, double> in;
  for (const OutsideSample& s : *j) in[s.client] = s.inbound_s;
  EXPECT_NEAR(in[1] - in[0], 0.0006, 1e-9);
  EXPECT_NEAR(in[2] - in[0], -0.0002, 1e-9);
  EXPECT_NEAR(in[3] - in[0], 0.0002, 1e-9);
  // Against the typical offset (the densest 2 ms window of the send offsets, all four here), a
  // way in of a millisecond or so at most.
  for (const auto& [i, v] : in) EXPECT_LT(std::abs(v), 0.002) << i;
}

TEST(TtftParts, SampledWithInboundDrawsEachRequestsWayInWithItsOutsideLatency) {
  // Four requests' outside latency and way in; the quickest way in (the 5th percentile of four:
  // the least) is 10.0 ms, so the delays drawn are 0.1, 0.2, 0 and 3 ms with their samples.
  auto o = OutsideLatency::SampledWithInbound({0.003, 0.004, -0.001, 0.005},
                                              {0.0101, 0.0102, 0.0100, 0.0130}, 7);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(o->has_inbound());
  const std::map<double, double> delay_of = {
      {0.003, 0.0001}, {0.004, 0.0002}, {0.0, 0.0}, {0.005, 0.003}};
  std::set<double> drawn;
  for (int64_t id = 0; id < 1000; ++id) {
    const double v = o->For(id);
    ASSERT_EQ(delay_of.count(v), 1u) << v;
    EXPECT_NEAR(o->InboundFor(id), delay_of.at(v), 1e-12) << id;
    EXPECT_DOUBLE_EQ(o->InboundFor(id), o->InboundFor(id));
    drawn.insert(v);
  }
  EXPECT_EQ(drawn.size(), 4u);
  // The outside latency draws as Sampled's with the same seed.
  auto plain = OutsideLatency::Sampled({0.003, 0.004, -0.001, 0.005}, 7);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->has_inbound());
  for (int64_t id = 0; id < 100; ++id) {
    EXPECT_DOUBLE_EQ(o->For(id), plain->For(id));
    EXPECT_DOUBLE_EQ(plain->InboundFor(id), 0.0);
  }
  EXPECT_DOUBLE_EQ(OutsideLatency::Constant(0.002).InboundFor(3), 0.0);
}

TEST(TtftParts, SampledWithInboundRejectsMismatchedOrNonFiniteWaysIn) {
  EXPECT_EQ(OutsideLatency::SampledWithInbound({0.001, 0.002}, {0.001}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OutsideLatency::SampledWithInbound({0.001}, {INFINITY}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OutsideLatency::SampledWithInbound({}, {}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TtftParts, SampledWithInboundDrawsEachRequestsTailWithItsOutsideLatency) {
  auto o =
      OutsideLatency::SampledWithInbound({0.003, 0.001, 0.002}, {}, 11, {-0.0003, 0.0001, -0.0001});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(o->has_tail());
  EXPECT_NEAR(o->TailMean(), -0.0001, 1e-12);
  const std::map<double, double> tail_of = {{0.003, -0.0003}, {0.001, 0.0001}, {0.002, -0.0001}};
  const OutsideLatency plain = o->WithoutTail();
  EXPECT_FALSE(plain.has_tail());
  for (int64_t id = 0; id < 200; ++id) {
    EXPECT_NEAR(o->TailFor(id), tail_of.at(o->For(id)), 1e-12) << id;
    EXPECT_DOUBLE_EQ(plain.For(id), o->For(id));
    EXPECT_DOUBLE_EQ(plain.TailFor(id), 0.0);
  }
  EXPECT_DOUBLE_EQ(OutsideLatency::Constant(0.002).TailFor(1), 0.0);
  EXPECT_EQ(OutsideLatency::SampledWithInbound({0.001, 0.002}, {}, 0, {0.0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OutsideLatency::SampledWithInbound({0.001}, {}, 0, {NAN}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TtftParts, WithInboundDelaysMovesEachArrivalByItsDrawnWayIn) {
  auto o = OutsideLatency::SampledWithInbound({0.001, 0.002, 0.003}, {0.0, 0.004, 0.0005}, 3);
  ASSERT_TRUE(o.ok());
  std::vector<SimRequest> sent;
  for (int i = 0; i < 50; ++i) sent.push_back({i, 0.01 * i, 100 + i, 8});
  const std::vector<SimRequest> got = WithInboundDelays(sent, *o);
  ASSERT_EQ(got.size(), sent.size());
  int late = 0;
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(got[i].id, sent[i].id);
    EXPECT_EQ(got[i].prompt_len, sent[i].prompt_len);
    EXPECT_EQ(got[i].output_len, sent[i].output_len);
    EXPECT_NEAR(got[i].arrival_s - sent[i].arrival_s, o->InboundFor(sent[i].id), 1e-15);
    late += got[i].arrival_s - sent[i].arrival_s > 0.0035;
  }
  EXPECT_GT(late, 5);  // the 4 ms way in is drawn about a third of the time
  // Without ways in, nothing moves.
  const std::vector<SimRequest> same = WithInboundDelays(sent, OutsideLatency::Constant(0.002));
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(same[i].arrival_s, sent[i].arrival_s);
}

}  // namespace
}  // namespace pd::planner
