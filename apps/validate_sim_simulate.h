// `pdserve validate-sim`'s simulated side: the two instances as `pdserve up` runs them with the
// calibration applied, the bench's requests regenerated from its seed, and the simulator run on
// them.
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "apps/validate_sim_calibration.h"
#include "apps/validate_sim_flags.h"
#include "bench/datasets.h"
#include "common/status.h"
#ifdef PD_PLANNER_HAS_ENGINE_SCHEDULER
#include "planner/engine_scheduler.h"
#endif
#include "planner/simulator.h"
#include "planner/ttft_parts.h"
#include "planner/validate_stats.h"

namespace pd::apps::validate_sim {

// The two instances as `pdserve up` runs them: engine policy, KV capacity of the default region,
// with the calibration applied to the step times.
inline std::vector<planner::InstanceConfig> Instances(const ValidateFlags& f, planner::StepCoeffs c,
                                                      const planner::RealOverheads& o,
                                                      int64_t kv_tokens) {
  planner::InstanceConfig p;
  p.role = planner::Role::kPrefill;
  p.coeffs = c;
  for (double& k : p.coeffs.prefill) k *= o.prefill_scale;
  p.policy.max_num_seqs = f.max_num_seqs;
  p.policy.max_num_batched_tokens = f.max_num_batched_tokens;
  p.policy.enable_chunked_prefill = true;
  p.policy.kv_capacity_tokens = kv_tokens;
  p.corun_slowdown = o.corun_prefill;
  p.kv_ready_fraction = o.kv_ready_fraction;
  planner::InstanceConfig d = p;
  d.role = planner::Role::kDecode;
  d.coeffs = c;
  d.corun_slowdown = o.corun_decode;
  // Scheduling once per step; sampling, detokenising and streaming once per sequence in a step.
  for (auto* form : {&d.coeffs.decode_small, &d.coeffs.decode_large}) {
    (*form)[0] += o.decode_fixed_ms;
    (*form)[2] += o.decode_seq_ms;
  }
  return {p, d};
}

// The bench's requests for a rate, regenerated with its own generators.
inline Result<std::vector<planner::SimRequest>> BenchRequests(const bench::DatasetSpec& spec, int n,
                                                              double rate, uint64_t seed) {
  ASSIGN_OR_RETURN(std::vector<bench::LengthPair> lengths, bench::SampleLengths(spec, n, seed));
  const std::vector<double> arrivals = bench::ArrivalTimes(n, rate, 1.0, seed);
  std::vector<planner::SimRequest> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({i, arrivals[i], lengths[i].prompt_len, lengths[i].output_len});
  }
  return out;
}

// The simulator on the bench's requests; each request's latency outside the engines (`outside`:
// the idle probes' constant or a draw from the load run's) added to its first token and end (on
// the way in and the first token's way out). A request of more than one token also gets the
// drawn last token's way out less its first's at its end (OutsideLatency::TailFor: 0 without
// measured tails; the end never before the first token). With `inbound_hop` (the rule used), each
// request also reaches the instances its drawn delay on the way in later
// (OutsideLatency::InboundFor, drawn with its outside latency; 0 for the idle constant): its TTFT
// counts from there, the outside latency holding the whole way in, and requests sent close together
// may reach the prefill instance in the other order, or together, as the traced rounds showed
// (issue #7's stop-19 note: the 20%-load TTFT p90, simulated 4-14% low, came 0.3-4 points nearer in
// 10 of 12 runs, and 162 cells were within 10% against 159 over those runs' same rounds).
inline Result<planner::Summary> SimulateRate(
    std::span<const planner::InstanceConfig> insts, const planner::ClusterLinks& links,
    const std::vector<planner::SimRequest>& sent, const ValidateSlo& slo,
    const planner::OutsideLatency& outside, std::vector<planner::SimStep>* steps = nullptr,
    std::vector<planner::RequestResult>* requests = nullptr, bool inbound_hop = true) {
  const std::vector<planner::SimRequest> reqs =
      inbound_hop ? planner::WithInboundDelays(sent, outside) : sent;
  planner::SimOptions so;
  so.slo = slo;
  so.first_token_on_decode = true;
  so.record_steps = steps != nullptr;
#ifdef PD_PLANNER_HAS_ENGINE_SCHEDULER
  so.make_scheduler = planner::EngineSchedulerFactory();
#endif
  ASSIGN_OR_RETURN(planner::SimResult sim, planner::Simulate(insts, links, reqs, so));
  if (steps != nullptr) *steps = std::move(sim.steps);
  for (auto& r : sim.requests) {
    const double outside_s = outside.For(r.id);
    if (r.first_token_s >= 0) r.first_token_s += outside_s;
    if (r.finish_s >= 0) {
      r.finish_s += outside_s;
      if (r.output_len > 1)
        r.finish_s = std::max(r.first_token_s, r.finish_s + outside.TailFor(r.id));
    }
  }
  if (requests != nullptr) *requests = sim.requests;
  return planner::Summarize(sim.requests, slo, slo.other);
}

// The step times of each instance scaled by `factor`; the decode instance's per-sequence terms
// (context and batch) by `decode_seq` instead.
inline std::vector<planner::InstanceConfig> Slowed(std::vector<planner::InstanceConfig> insts,
                                                   const Stretches& factor, double decode_seq) {
  for (auto& inst : insts) {
    const bool prefill = inst.role == planner::Role::kPrefill;
    const double k = prefill ? factor.prefill : factor.decode;
    for (double& v : inst.coeffs.prefill) v *= k;
    for (auto* form : {&inst.coeffs.decode_small, &inst.coeffs.decode_large}) {
      (*form)[0] *= k;
      (*form)[1] *= prefill ? k : decode_seq;
      (*form)[2] *= prefill ? k : decode_seq;
    }
  }
  return insts;
}

// The calibrated deployment at `rate`: the probes' calibration, each instance's steps stretched
// by the share of its core that other work takes at that rate: the bench client and router
// (unpinned: from both cores alike) and, for the decode instance, its own HTTP, fabric and
// messenger threads (pinned with it) per request (receiving the request and the KV: work that
// comes with other requests, while it decodes), their CPU measured by the probes. Their work per
// token (streaming it) runs between that instance's steps, so the decode probes' per-sequence
// cost holds it already. The prefill instance's own threads are in its calibrated step: they
// send a prompt's KV during that prompt's step, and the probes measure how long the step held
// the compute thread, waiting for them included. (A 1/(1 - u) stretch by their share, right for
// work that comes independently of the steps, gave 1.08x at 37 req/s where a trace showed the
// steps 1.3x their compute thread's CPU time, at idle and under load alike.) The decode
// instance's stretch is the load run's traced one instead when measured (cal.decode_load:
// apps/validate_sim_decode_load.h): the schedstat share gave x1.17 at 37 req/s where its traced
// steps were about x1.02.
inline Result<std::vector<planner::InstanceConfig>> CalibratedAt(const ValidateFlags& f,
                                                                 const planner::StepCoeffs& c,
                                                                 const Calibration& cal,
                                                                 int64_t kv_tokens, double rate) {
  Stretches k;
  double decode_seq = 0;
  const planner::ClientCpuCost decode_own{cal.decode_own_cpu.per_request_s, 0.0};
  if (cal.prefill_load) {  // measured under load by a rate's calibration runs' traces
    ASSIGN_OR_RETURN(
        k.prefill, planner::StretchAtRate(cal.prefill_load->stretch, cal.prefill_load->rate, rate));
  } else {
    ASSIGN_OR_RETURN(k.prefill, planner::BackgroundCpuStretch(cal.StretchCpu(), rate, f.output_len,
                                                              MachineCores()));
  }
  if (cal.decode_load) {  // measured under load by the load run's traces
    ASSIGN_OR_RETURN(k.decode,
                     planner::StretchAtRate(cal.decode_load->stretch, cal.decode_load->rate, rate));
    ASSIGN_OR_RETURN(decode_seq, planner::StretchAtRate(cal.decode_load->seq_stretch,
                                                        cal.decode_load->rate, rate));
  } else {
    ASSIGN_OR_RETURN(k.decode, planner::BackgroundCpuStretch(cal.StretchCpu(), rate, f.output_len,
                                                             MachineCores(), decode_own));
    decode_seq = k.decode;
  }
  std::vector<planner::InstanceConfig> insts =
      Slowed(Instances(f, c, cal.overheads, kv_tokens), k, decode_seq);
  // The decode instance replays its traced slowness (Calibration::decode_step_factors); the
  // prefill instance's factors are printed beside, not used (apps/validate_sim_rate_cal.h).
  // The prefill instance's loop between its steps, measured under load at this rate, and the
  // work of a request that comes during a step (0 but under WithArrivalWork); the decode
  // instance's loop is in its calibrated step (the probes' TPOT and the traced stretch hold it).
  for (auto& inst : insts) {
    if (inst.role == planner::Role::kDecode) inst.step_factors = cal.decode_step_factors;
    if (inst.role == planner::Role::kPrefill) {
      inst.loop_gap_s = cal.prefill_loop_gap_s;
      inst.arrival_work_s = cal.prefill_arrival_work_s;
    }
  }
  return insts;
}

// `insts` with the decode instance's steps reshaped by batch size (`factors`:
// InstanceConfig::decode_batch_factors), for the variants printed beside the rule used.
inline std::vector<planner::InstanceConfig> WithDecodeBatchFactors(
    std::vector<planner::InstanceConfig> insts, const std::vector<double>& factors) {
  for (auto& inst : insts) {
    if (inst.role == planner::Role::kDecode) inst.decode_batch_factors = factors;
  }
  return insts;
}

// `insts` with the prefill instance's steps reshaped by the prompts they compute (`factors`:
// InstanceConfig::prefill_chunk_factors), for the variant printed beside the rule used.
inline std::vector<planner::InstanceConfig> WithPrefillChunkFactors(
    std::vector<planner::InstanceConfig> insts, const std::vector<double>& factors) {
  for (auto& inst : insts) {
    if (inst.role == planner::Role::kPrefill) inst.prefill_chunk_factors = factors;
  }
  return insts;
}

// `insts` with no instance's step factors (InstanceConfig::step_factors: the traced slowness
// replayed in order), for the simulations printed beside the rule used.
inline std::vector<planner::InstanceConfig> WithoutStepFactors(
    std::vector<planner::InstanceConfig> insts) {
  for (auto& inst : insts) inst.step_factors.reset();
  return insts;
}

// The calibrated KV transfer: its time per prompt token, as the link's bandwidth.
inline planner::ClusterLinks CalibratedLinks(const planner::ClusterLinks& links,
                                             const Calibration& cal) {
  planner::ClusterLinks out = links;
  if (cal.overheads.transfer_s_per_token > 0) {
    out.intra_node_bw = links.kv_bytes_per_token / cal.overheads.transfer_s_per_token;
  }
  return out;
}

}  // namespace pd::apps::validate_sim
