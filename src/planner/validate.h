// The simulator against the real system (`pdserve validate-sim`): the measured side read from a
// `pdserve bench` result, the fixed costs of the real system solved from idle probes, and the
// side-by-side table.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/metrics.h"

namespace pd::planner {

// Per-request results from a bench result JSON (vLLM's field names: "ttfts", "itls",
// "output_lens", "failed"): TTFT as measured, TPOT as the mean gap after the first token. Failed
// requests come back `failed`. InvalidArgument when the fields are missing or disagree in length.
Result<std::vector<RequestResult>> MeasuredFromBenchJson(const nlohmann::json& bench,
                                                         const std::string& source);

// Idle probes (one request at a time) through the real deployment, against what the latency
// model predicts for them.
struct IdleProbe {
  int prompt_len = 0;
  double measured_ttft_s = 0.0;
  double modelled_ttft_s = 0.0;     // prefill step + the decode step of the last prompt token
  double modelled_prefill_s = 0.0;  // the prefill step alone (part of modelled_ttft_s)
  // How long the prefill instance's compute thread was held by the prompt (schedstat); 0: not
  // measured. validate-sim gives its time on its core plus its time runnable but waiting for it:
  // the instance's own messenger and fabric threads, pinned with it, send each layer's KV while
  // the step computes, and the step takes that long (a trace showed steps 1.3x their compute).
  double measured_prefill_cpu_s = 0.0;
  double measured_prefill_run_s = 0.0;  // of which on its core (reported only)
};
// A decode probe: `batch` requests sent together (short prompts, long outputs, so they decode
// side by side), their mean TPOT against the modelled decode step at that batch.
struct DecodeProbe {
  int batch = 1;
  double measured_tpot_s = 0.0;
  double modelled_tpot_s = 0.0;
};

// What the real deployment adds to (or scales in) the latency model, fitted from the probes:
//   measured TPOT − modelled decode step        = decode_fixed_ms + batch · decode_seq_ms
//   measured TTFT − calibrated first decode step = fixed_s + prefill_scale · modelled prefill step
// (the first token's step is a batch-1 decode step, so its calibrated time is the modelled one
// plus decode_fixed_ms + decode_seq_ms)
// fixed_s: HTTP, router and hand-over messages; prefill_scale: how much slower (> 1) the prefill
// instance computes a step than `pdserve profile`'s isolated runner did (and the KV transfer,
// which also grows with the prompt); decode_fixed_ms / decode_seq_ms: per decode step and per
// sequence in a step beyond the forward pass (scheduling, sampling, detokenising, streaming).
// Least squares with non-negative terms (prefill_scale >= kMinPrefillScale): when the
// unconstrained fit makes one negative it is held at its bound and the other refitted. With
// probes of one prompt length only, prefill_scale stays 1 and fixed_s takes the residual; with
// decode probes of one batch size only, the residual is all per sequence.
// When every TTFT probe carries measured_prefill_cpu_s, the prefill instance's occupation is
// measured rather than inferred: prefill_scale = Σ cpu·m / Σ m² over the probes (m the modelled
// step; at least kMinPrefillScale), and what the TTFT holds beyond it (the KV transfer and the
// hand-over, which run after the step while the instance computes the next prompt) is fitted as
//   measured TTFT − calibrated first decode step − prefill_scale · m = fixed_s +
//   transfer_s_per_token · L
// (both >= 0; one prompt length: all fixed).
inline constexpr double kMinPrefillScale = 0.25;
struct RealOverheads {
  double fixed_s = 0.0;
  double prefill_scale = 1.0;
  double decode_fixed_ms = 0.0;
  double decode_seq_ms = 0.0;
  // Step-time factors while the other instance computes (InstanceConfig::corun_slowdown), from
  // co-run probes; SolveOverheads leaves them at 1.
  double corun_prefill = 1.0;
  double corun_decode = 1.0;
  // Latency per prompt token between the prefill step's end and the first token that does not
  // hold the prefill instance (the KV transfer): ClusterLinks' per-token transfer time.
  double transfer_s_per_token = 0.0;
  // How far into its prefill step a prompt's KV is whole at the decode instance
  // (InstanceConfig::kv_ready_fraction): from traces (planner::KvReadyFraction); SolveOverheads
  // leaves it at 1 (the hand-over when the step ends).
  double kv_ready_fraction = 1.0;
};
// InvalidArgument without TTFT probes, or without decode probes, or with a batch < 1.
Result<RealOverheads> SolveOverheads(const std::vector<IdleProbe>& probes,
                                     const std::vector<DecodeProbe>& decode_probes);

struct ComparisonRow {
  double rate = 0.0;
  Summary simulated, measured;
};
// Relative difference (sim − real) / real; 0 when both are 0.
double RelDiff(double simulated, double measured);
// The side-by-side table: per rate, attainment and p50/p90 TTFT/TPOT, simulated vs measured
// with the relative difference; and the attainment at the other SLO (Summary::other_attainment)
// when both sides have one, marked not compared. The JSON has other_attainment when set.
std::string FormatComparison(const std::vector<ComparisonRow>& rows);
nlohmann::json ComparisonToJson(const std::vector<ComparisonRow>& rows);

}  // namespace pd::planner
