// A discrete-event simulator of a serving cluster on a simulated clock.
//
// Instances are colocated (prefill and decode in one batch scheduler; chunked prefill when the
// policy enables it) or disaggregated (prefill instances hand each prompt's KV to a decode
// instance after a transfer of prompt_len × kv_bytes_per_token bytes over the link between the
// two instances' nodes). Every instance runs a StepScheduler — pdserve's own engine scheduler or
// the native one with the same policy — and each step takes the latency model's time.
//
// Latency accounting follows DistServe: the first token is produced by the prefill step (TTFT
// ends there); the KV transfer and the decode queueing count toward TPOT.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "planner/latency_model.h"
#include "planner/metrics.h"
#include "planner/step_scheduler.h"
#include "planner/workload.h"

namespace pd::planner {

enum class Role { kColocated, kPrefill, kDecode };
std::string_view RoleName(Role role);  // "colocated" | "prefill" | "decode"

// A simulated instance's steps as a measured one ran them. The k-th step (from 0) takes
// step_factors[k % size] times the model's time, after the co-run factor: a host's slowness
// replayed step by step in the order it was traced, so a slow spell stays a run of slow steps
// that every sequence in it shares. Each step starts no sooner than loop_gap_s after the one
// before it ended (the engine loop between steps: delivering outputs, scheduling).
struct StepCalibration {
  std::vector<double> step_factors;  // each positive and finite; empty: none
  double loop_gap_s = 0.0;           // finite and >= 0
};

struct InstanceConfig {
  Role role = Role::kColocated;
  int tp = 1;
  int pp = 1;
  int node = 0;  // node of its first device: KV between instances on one node uses NVLink
  StepCoeffs coeffs;
  SchedPolicy policy;
  // Step-time factor when another instance on the same node is mid-step as this one starts a step
  // (instances sharing a machine's cores, caches and memory bandwidth: on one CPU host they slow
  // each other down). 1: independent devices.
  double corun_slowdown = 1.0;
  // A prefill instance's hand-over with SimOptions::first_token_on_decode: the share of a prefill
  // step after which its prompts' KV transfer (KvTransferSeconds) starts. pdserve streams each
  // layer's KV as the layer computes it and the decode instance starts on the last layer's, while
  // the prefill step still runs that layer's attention and MLP, the final norm and the metadata
  // write (a traced local deployment: 0.90 of the step). 1: when the step ends (DistServe's
  // accounting). In (0, 1].
  double kv_ready_fraction = 1.0;
  // A decode instance that runs DistServe's decoding engine loop (distserve_decode.h): fixed
  // micro-batches launched one per turn, KV migrations awaited inside the loop. false: the
  // scheduler's batches, started whenever the first pipeline stage is free.
  bool distserve_decode_loop = false;
  // How this instance's steps differ from the latency model's on a real host (validate-sim
  // measures it from traces); null: every step takes the model's time.
  std::shared_ptr<const StepCalibration> calibration;
};

struct ClusterLinks {
  double intra_node_bw = 240e9;    // bytes/s per device (every shard moves its slice in parallel)
  double inter_node_bw = 3.125e9;  // bytes/s between two nodes (25 Gbps)
  double kv_bytes_per_token = 0;   // whole model, all layers
  double transfer_latency_s = 0;   // fixed cost of every hand-over (control messages, set-up)
};

using SchedulerFactory =
    std::function<std::unique_ptr<StepScheduler>(const SchedPolicy& policy, Role role)>;
// The native scheduler, for every role.
SchedulerFactory NativeSchedulerFactory();

struct SimOptions {
  SchedulerFactory make_scheduler;  // empty: NativeSchedulerFactory()
  // Stop as soon as more than max_misses requests missed the SLO (-1: never). A goodput search
  // uses it to give up on a rate early.
  int max_misses = -1;
  // Stop as soon as this many requests finished within both SLOs (-1: never): the rest cannot
  // turn a probe that already reached its attainment target into a miss.
  int stop_after_meets = -1;
  Slo slo;
  // pdserve's own hand-over (DESIGN.md, request flow step 5): the prefill instance samples
  // nothing; the decode instance runs the last prompt token as its first decode step and samples
  // the first token, so TTFT includes the KV transfer and that step. false: DistServe's
  // accounting (the first token comes from the prefill step).
  bool first_token_on_decode = false;
  // Record every step in SimResult::steps (for comparing the simulated steps with a real trace).
  bool record_steps = false;
};

// One simulated step, as recorded with SimOptions::record_steps.
struct SimStep {
  int instance = 0;
  double start_s = 0.0;
  double duration_s = 0.0;  // the whole step, co-run factor included
  int decode_seqs = 0;
  int64_t decode_context = 0;
  int64_t prefill_tokens = 0;
  bool corun = false;      // another instance on its node was mid-step as it started
  int prefill_chunks = 0;  // prompts (or their chunks) it prefilled
};

struct SimResult {
  std::vector<RequestResult> requests;  // in the workload's order
  bool stopped_early = false;           // max_misses exceeded: the rest was not simulated
  bool reached_meets = false;           // stop_after_meets reached: the rest was not simulated
  int64_t num_steps = 0;
  int64_t num_preemptions = 0;
  double end_time_s = 0.0;
  std::vector<SimStep> steps;  // with SimOptions::record_steps, in start order
};

// Seconds to move `tokens` tokens of KV between a prefill and a decode instance.
double KvTransferSeconds(const InstanceConfig& from, const InstanceConfig& to,
                         const ClusterLinks& links, int tokens);

// InvalidArgument for an empty or inconsistent deployment (colocated mixed with disaggregated
// roles, prefill without decode, non-positive TP/PP).
Result<SimResult> Simulate(std::span<const InstanceConfig> instances, const ClusterLinks& links,
                           std::span<const SimRequest> requests, const SimOptions& options);

}  // namespace pd::planner
