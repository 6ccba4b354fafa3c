// What `pdserve validate-sim` reads from the instances' Chrome traces (`pdserve up --trace`,
// read by pd::ReadTraceEvents): each request's parts on the two instances, each engine step, and
// the latency outside the engines per request (the bench client's TTFT less the traced engines'
// part), which the calibrated simulation draws per request.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/trace.h"
#include "common/trace_reader.h"
#include "planner/simulator.h"
#include "planner/workload.h"

namespace pd::planner {

// A request as the two instances traced it, steady-clock seconds (the traces' clock).
struct TracedRequest {
  int prompt_tokens = 0;  // the trace's "tokens" + 1 (the prompt without its last token)
  double sent_s = 0;      // the decode instance sent the prefill request
  double got_s = 0;       // the prefill instance got it ("transfer" begin or "prefill request")
  double step_begin_s = 0, step_end_s = 0;  // the prefill step(s) that computed it
  double kv_ready_s = 0;                    // the decode instance had all of its KV
  double first_step_end_s = 0;  // the end of the decode instance's first step begun after that
  // The decode instance wrote the first / last token to the client's stream; -1: not traced.
  double first_written_s = -1, last_written_s = -1;

  // The prefill instance had it no later than its step began (pinned to one core, its compute
  // thread may start the step before the messenger traces "prefill request").
  double arrived_s() const { return std::min(got_s, step_begin_s); }
  double engines_s() const { return first_step_end_s - arrived_s(); }  // wait, step, KV, decode
};

// The requests both traces hold whole, in the order they were sent; a request with a part missing
// (the trace's event cap, a failed transfer) is left out.
std::vector<TracedRequest> TracedRequests(const std::vector<TraceEvent>& prefill,
                                          const std::vector<TraceEvent>& decode);

// How far into its prefill step a request's KV was whole at the decode instance: the median of
// (kv_ready_s - step_begin_s) / step time, each capped at 1 (InstanceConfig::kv_ready_fraction).
// FailedPrecondition under `min_requests` requests with a step and a ready point after its start.
Result<double> KvReadyFraction(std::span<const TracedRequest> traced, size_t min_requests);

// The bench client's side of a request: sent at arrival_s (from the run's start), its prompt, the
// measured TTFT, and its first token to its last (-1: unknown).
struct ClientRequest {
  double arrival_s = 0;
  int prompt_tokens = 0;
  double ttft_s = 0;
  double span_s = -1;
};

// Per request found on both sides: outside_s, the measured TTFT less the traced engines' part;
// inbound_s, its way in (client send to the prefill instance having it) less the typical one;
// tail_s, its last token's way out less its first's (the client's span less the traced one).
struct OutsideSamples {
  std::vector<double> outside_s, inbound_s, tail_s;  // tail_s empty unless every request has one
};
// The client's clock starts at an unknown steady-clock time t0: t0 is the densest 2 ms window of
// (sent_s - arrival_s) over all pairs of equal prompt length; then each client request, in
// order, takes the unjoined traced one of its length whose offset is nearest t0, within 10 ms.
// InvalidArgument when none joined.
Result<OutsideSamples> JoinOutsideLatency(std::span<const ClientRequest> client,
                                          std::span<const TracedRequest> traced);

// The latency outside the engines added to each simulated request: a constant (the idle
// probes'), or one of a traced run's per-request samples drawn by request id and seed (the same
// request draws the same sample in every simulation), with its way in and its tail.
class OutsideLatency {
 public:
  OutsideLatency() = default;
  static OutsideLatency Constant(double seconds);
  // InvalidArgument when empty, or a way in or tail list is neither empty nor in step with it,
  // or a value is not finite. Negative samples count 0; ways in count from their 5th percentile.
  static Result<OutsideLatency> Sampled(const OutsideSamples& samples, uint64_t seed);
  double For(int64_t request_id) const;
  double InboundFor(int64_t request_id) const;  // 0 without ways in
  double TailFor(int64_t request_id) const;     // 0 without tails

 private:
  size_t Draw(int64_t request_id) const;
  std::vector<double> outside_s_ = {0.0}, inbound_s_, tail_s_;
  uint64_t seed_ = 0;
};

// An engine step, traced ("step" events of category "engine") or simulated.
struct StepRecord {
  double start_s = 0.0;
  double duration_s = 0.0;
  int decode_seqs = 0;
  int64_t prefill_tokens = 0;
  bool corun = false;  // the other instance was mid-step as this one started
};
// The traced steps, in start order. InvalidArgument when a step lacks its arguments.
Result<std::vector<StepRecord>> EngineSteps(const std::vector<TraceEvent>& trace);
// Sets each step's `corun`: whether a step of `other` (start order) was running as it started.
void MarkCorun(std::span<StepRecord> steps, std::span<const StepRecord> other);
// The steps instance `instance` took in a simulation with SimOptions::record_steps.
std::vector<StepRecord> StepsOfInstance(const SimResult& sim, int instance);
// The items of `all` whose `time` (a request's sent_s, a step's start_s) is in [begin_s, end_s].
template <typename T>
std::vector<T> InWindow(const std::vector<T>& all, double T::*time, double begin_s, double end_s) {
  std::vector<T> out;
  for (const T& x : all) {
    if (x.*time >= begin_s && x.*time <= end_s) out.push_back(x);
  }
  return out;
}

}  // namespace pd::planner
