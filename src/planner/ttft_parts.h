// The real TTFT of a request split into its parts, from the instances' Chrome traces (`pdserve
// up --trace FILE`), and the latency outside the engines that the simulator adds to each request
// (issue #7). The engines' part of a TTFT is traced: the prefill instance got the prefill request,
// waited, ran the step that computed it, the KV reached the decode instance ("kv ready"), and the
// decode instance's next step sampled the first token. The rest of what the bench client measured
// (HTTP in and out, the router, tokenising, the prefill request's hop, the stream back) holds no
// engine; at idle the probes put it at 1.4-1.6 ms, under load a traced run showed ~4 ms (p90 5).
// `pdserve validate-sim` measures it per request in its uncompared load run: the bench client's
// TTFT less the traced engines' part of the same request, joined by arrival time and prompt
// length, and the calibrated simulation draws each request's outside latency from that sample.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/workload.h"

namespace pd::planner {

// A request as the two instances traced it, steady-clock seconds (the traces' clock).
struct TracedRequest {
  std::string id;         // the messenger's request id
  int prompt_tokens = 0;  // the prompt (the trace's "tokens": the prompt without its last token)
  double sent_s = 0;      // the decode instance sent the prefill request (its first attempt)
  double got_s = 0;       // the prefill instance got it ("transfer" begin or "prefill request")
  double step_begin_s = 0, step_end_s = 0;  // the prefill step that computed it
  double kv_ready_s = 0;                    // the decode instance had all of its KV
  double first_step_end_s = 0;  // the end of the decode instance's first step begun after that
  // The decode instance's HTTP server wrote the first and the last token to the client's stream
  // ("first token written" / "last token written", joined through the engine request id that
  // "prefill request sent" names); -1 when not traced (a non-streamed request, an older trace).
  double first_written_s = -1, last_written_s = -1;

  // When the prefill instance had the request: it traces "prefill request" after handing it to
  // its engine, and with the instance pinned to one core its compute thread may start the step
  // first (a run at 8 req/s: "prefill request" 2 ms after the step's start at p50), so no later
  // than that.
  double arrived_s() const { return std::min(got_s, step_begin_s); }
  double front_s() const { return arrived_s() - sent_s; }  // the prefill request's hop
  double wait_s() const { return step_begin_s - arrived_s(); }
  double step_s() const { return step_end_s - step_begin_s; }
  double handover_s() const { return kv_ready_s - step_end_s; }
  double decode_s() const { return first_step_end_s - kv_ready_s; }
  // Prefill wait + step + hand-over (KV wait) + first decode step.
  double engines_s() const { return first_step_end_s - arrived_s(); }
  bool has_written() const { return first_written_s >= 0 && last_written_s >= first_written_s; }
  // From the first token's write to the last's (has_written()).
  double written_span_s() const { return last_written_s - first_written_s; }
};

// The requests both traces hold whole ("prefill request sent" and "kv ready" on the decode side,
// "prefill request" and a "post writes" naming its step on the prefill side, that step's "step"
// event, and a decode "step" begun after its KV was ready), in the order they were sent. A
// request whose parts are missing (the trace's event cap, a failed transfer) is left out.
// InvalidArgument when a text is not a trace-event file.
Result<std::vector<TracedRequest>> TracedRequestsFromTraces(const std::string& prefill_json,
                                                            const std::string& decode_json);

// How far into its prefill step a request's KV was whole at the decode instance: the median over
// `traced` of (kv_ready_s - step_begin_s) / step_s(), each capped at 1 (the simulator's
// InstanceConfig::kv_ready_fraction; a hand-over after the step's end is the transfer's). The
// decode instance starts on the last layer's KV while the prefill step still runs that layer's
// attention and MLP, the final norm and the metadata write (a 128-token prompt of the small
// model: ~1.4 ms of a ~14 ms step). Requests whose step has no length are left out;
// FailedPrecondition under `min_requests` left (or when one left has a ready point that is not
// finite or before its step began).
Result<double> KvReadyFraction(std::span<const TracedRequest> traced, size_t min_requests);

// The bench client's side of a request: its arrival (seconds from the run's start: when the
// client sent it), prompt length, measured TTFT and the time from its first token to its last
// (the sum of its gaps; -1 when unknown).
struct ClientRequest {
  double arrival_s = 0;
  int prompt_tokens = 0;
  double ttft_s = 0;
  double span_s = -1;
};

// Measured TTFT less the traced engines' part, per request found on both sides.
struct OutsideSample {
  size_t client = 0;  // index into the client's requests
  size_t traced = 0;  // index into the traced ones
  double outside_s = 0;
  // The request's way in: from the client's send to the prefill instance having it
  // (TracedRequest::arrived_s), less the join's typical offset t0 (below), so about 0 for a
  // request that met no delay and positive for one held up on its way (a busy core).
  double inbound_s = 0;
  // The request's last token's way out less its first's: the client's span (first token to
  // last) less the traced one (the two writes: TracedRequest::written_span_s). The simulation
  // adds the outside latency, which holds the first token's way out, to the request's end as
  // well; this corrects that end to the last token's way out (a run at 17 req/s: the first token
  // reached the client 0.40 ms after its write on average, the last 0.29 ms). NaN when either
  // side lacks the span.
  double tail_s = 0;
};
// Joins the client's requests with the traced ones. The client's clock starts at an unknown
// steady-clock time t0 and each request reaches the decode instance a little after it was sent,
// so the offset sent_s - arrival_s is about the same for every true pair: t0 is the densest
// `bin_s`-wide window of the offsets over all pairs of equal prompt length (the true pairs pile
// up there; wrong ones spread over the run). Then, in arrival order, each client request takes
// the unjoined traced one of its prompt length whose offset is nearest t0, within `max_skew_s`;
// requests with none are left out (e.g. the traced request fell past the trace's cap). The
// outside latency may come out negative (clocks read at different points); callers decide.
// InvalidArgument when nothing could be joined or bin_s/max_skew_s is not positive.
struct JoinOptions {
  double bin_s = 0.002;
  double max_skew_s = 0.010;
};
Result<std::vector<OutsideSample>> JoinOutsideLatency(std::span<const ClientRequest> client,
                                                      std::span<const TracedRequest> traced,
                                                      const JoinOptions& options = {});

// The latency outside the engines the calibrated simulation adds to a request's first token (and
// to its end): a constant (the idle probes' figure), or one of a load run's per-request samples
// drawn per request (deterministically from the request id and a seed). Drawn rather than a
// percentile: the outside part adds to the engines' part request by request, so its spread widens
// the TTFT's; a constant shifts every percentile alike (the traced p90 of the outside part was
// ~1 ms over its p50, and the simulated TTFT p90 was the lowest cell). Negative samples count 0.
class OutsideLatency {
 public:
  OutsideLatency() = default;
  static OutsideLatency Constant(double seconds);
  // InvalidArgument when `samples_s` is empty or holds a value that is not finite.
  static Result<OutsideLatency> Sampled(std::vector<double> samples_s, uint64_t seed = 0);
  // Sampled, each sample paired with its request's way in (OutsideSample::inbound_s, the same
  // request's), drawn together: InboundFor gives the drawn request's way in less the samples'
  // 5th percentile (0 or more), the delay by which it reaches the prefill instance later than
  // the quickest; `inbound_s` empty: none (as Sampled). InvalidArgument also when the two differ
  // in size or a way in is not finite.
  // `tail_s`: each sample's request's OutsideSample::tail_s, drawn with it (TailFor); empty: none.
  // InvalidArgument also when it differs in size or holds a value that is not finite.
  static Result<OutsideLatency> SampledWithInbound(std::vector<double> samples_s,
                                                   std::vector<double> inbound_s, uint64_t seed = 0,
                                                   std::vector<double> tail_s = {});

  double For(int64_t request_id) const;
  // The drawn request's delay on its way in (SampledWithInbound); 0 without inbound samples.
  double InboundFor(int64_t request_id) const;
  // The drawn request's last token's way out less its first's (OutsideSample::tail_s), which
  // the simulation adds to a request's end beside For(); 0 without tail samples.
  double TailFor(int64_t request_id) const;
  bool has_inbound() const { return !inbound_s_.empty(); }
  bool has_tail() const { return !tail_s_.empty(); }
  double TailMean() const;  // 0 without tail samples
  // The same draws without the tails (TailFor gives 0).
  OutsideLatency WithoutTail() const {
    OutsideLatency o = *this;
    o.tail_s_.clear();
    return o;
  }
  bool sampled() const { return !samples_s_.empty(); }
  size_t num_samples() const { return samples_s_.size(); }
  // The q-quantile (q in [0, 1]) of what For gives over many requests: the constant, or the
  // samples' (negative ones as 0).
  double Quantile(double q) const;
  double Mean() const;

 private:
  size_t Draw(int64_t request_id) const;
  double constant_s_ = 0;
  std::vector<double> samples_s_;  // sorted, >= 0
  std::vector<double> inbound_s_;  // empty, or samples_s_[i]'s request's delay on its way in
  std::vector<double> tail_s_;     // empty, or samples_s_[i]'s request's tail
  uint64_t seed_ = 0;
};

// The requests as they reach the instances: each `sent` request its drawn delay on the way in
// (OutsideLatency::InboundFor) later, id and lengths unchanged, in the same order (not resorted:
// the simulator takes arrivals in any order). Requests sent closer together than the spread of
// that delay may then reach the prefill instance in the other order, or together, as a traced
// run showed (7 pairs sent under 2 ms apart at 16 req/s, 1-3 of them swapped per round).
std::vector<SimRequest> WithInboundDelays(std::span<const SimRequest> sent,
                                          const OutsideLatency& outside);

}  // namespace pd::planner
