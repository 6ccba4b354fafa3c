#include "planner/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>
#include <queue>
#include <span>
#include <string>

#include "planner/distserve_decode.h"
#include "planner/vllm_scheduler.h"

namespace pd::planner {
namespace {

// The smallest of an instance's `name` factors and 1 (the floor they put under its steps);
// InvalidArgument naming them when one is not positive and finite.
Result<double> MinFactor(std::span<const double> factors, const char* name) {
  double least = 1.0;
  for (double k : factors) {
    if (!(std::isfinite(k) && k > 0)) {
      return InvalidArgument(std::string("instance ") + name +
                             " must be positive and finite, got " + std::to_string(k));
    }
    least = std::min(least, k);
  }
  return least;
}

enum class EventKind {
  kArrival,
  kStageFree,
  kStepDone,
  kKvReady,
  kKvArrived,
  kTtftDeadline,
  kLoopWake,
};

struct Event {
  double time = 0.0;
  int64_t seq = 0;  // insertion order: ties resolve FIFO, so runs are deterministic
  EventKind kind = EventKind::kArrival;
  int instance = -1;
  int64_t request = -1;
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
};

struct Instance {
  InstanceConfig cfg;
  std::unique_ptr<StepScheduler> sched;
  double stage_free_at = 0.0;
  double last_done = 0.0;
  int in_flight = 0;
  int incoming = 0;  // KV transfers on their way here
  int64_t steps_started = 0;
  bool dirty = false;  // may be able to start a step at the current instant
  std::deque<SimBatch> batches;
  std::unique_ptr<DistServeDecodeLoop> loop;  // with InstanceConfig::distserve_decode_loop
  int load() const { return loop ? loop->load() : sched->num_unfinished() + incoming; }
  // A lower bound on the time of any step that yields a token here (0: none known).
  double min_token_step_s = 0.0;
};

// The shortest step a decode instance can take: one sequence with one token of context. Only a
// bound when every term grows with the batch (non-negative coefficients); else 0.
double MinDecodeStepSeconds(const InstanceConfig& c) {
  if (c.role != Role::kDecode) return 0.0;
  const StepCoeffs& k = c.coeffs;
  for (double v : {k.decode_small[1], k.decode_small[2], k.decode_large[1], k.decode_large[2],
                   k.overhead_ms, k.overhead_per_token_ms}) {
    if (v < 0) return 0.0;
  }
  const double small = k.decode_small[0] + k.decode_small[1] + k.decode_small[2];
  const double large = k.decode_large[0] + k.decode_large[1] + k.decode_large[2];
  const double ms = std::min(small, large) + k.overhead_ms + k.overhead_per_token_ms;
  return std::max(0.0, ms) * 1e-3;
}

class Cluster final : public DecodeLoopHost {
 public:
  Cluster(const ClusterLinks& links, std::span<const SimRequest> requests, const SimOptions& opts)
      : links_(links), requests_(requests), opts_(opts) {}

  Status Init(std::span<const InstanceConfig> configs);
  SimResult Run();

  // DecodeLoopHost
  void WakeLoopAt(int instance, double time) override {
    Push(time, EventKind::kLoopWake, instance, -1);
  }
  double MigrationSeconds(int instance, int64_t req) override {
    return KvTransferSeconds(instances_[prefill_of_[req]].cfg, instances_[instance].cfg, links_,
                             requests_[req].prompt_len);
  }
  void OnMigrated(int instance, double now, int64_t req) override;
  bool OnLoopToken(int instance, double now, int64_t req) override {
    return OnToken(now, instances_[instance], req);
  }
  LoopStep OnLaunch(int instance, double start, const StepShape& shape) override;

 private:
  void Push(double time, EventKind kind, int instance, int64_t request) {
    events_.push({time, next_seq_++, kind, instance, request});
  }
  int PickLeastLoaded(Role role) const;
  void OnArrival(double now, int64_t req);
  void OnStepDone(double now, int inst);
  // `req`'s KV is whole on the prefill instance `inst`: picks a decode instance and starts the
  // transfer to it.
  void HandOver(double now, int inst, int64_t req);
  void OnKvArrived(double now, int inst, int64_t req);
  void OnTtftDeadline(double now, int64_t req);
  // Counts a miss as soon as the request's TPOT must exceed the SLO whatever comes next: its
  // remaining tokens each need a step of at least min_step_s after `now`.
  void CheckTpotBound(double now, int64_t req, double min_step_s);
  void TryStart(double now, int inst);
  // The times of a step of `shape` that instance i starts at `now` (co-run factor and
  // calibration applied), recorded with SimOptions::record_steps.
  StageTimes StartStep(double now, int i, const StepShape& shape);
  bool OtherBusyOnNode(int inst) const;  // another instance on its node is mid-step
  // A prefill instance that hands its prompts over before its step ends
  // (InstanceConfig::kv_ready_fraction).
  bool EarlyHandOver(const InstanceConfig& c) const {
    return c.role == Role::kPrefill && opts_.first_token_on_decode && c.kv_ready_fraction < 1;
  }
  void MarkDirty(int inst) {
    if (!instances_[inst].dirty) {
      instances_[inst].dirty = true;
      dirty_.push_back(inst);
    }
  }
  StepShape ShapeOf(const Instance& inst, const SimBatch& batch) const;
  // Handles one sampled token of `req` on `inst`; returns true when the sequence leaves `inst`.
  bool OnToken(double now, Instance& inst, int64_t req);
  void Fail(int64_t req);
  void CountMiss(int64_t req);

  const ClusterLinks links_;
  std::span<const SimRequest> requests_;
  const SimOptions& opts_;
  std::vector<Instance> instances_;
  std::vector<int> dirty_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  int64_t next_seq_ = 0;
  std::vector<int> generated_;
  std::vector<int> prefill_of_;  // the prefill instance that handed each request over
  std::vector<char> missed_;
  SimResult result_;
  int misses_ = 0;
  int meets_ = 0;  // finished within both SLOs
  bool colocated_ = false;
};

Status Cluster::Init(std::span<const InstanceConfig> configs) {
  if (configs.empty()) return InvalidArgument("deployment has no instances");
  int colocated = 0, prefill = 0, decode = 0;
  SchedulerFactory factory = opts_.make_scheduler ? opts_.make_scheduler : NativeSchedulerFactory();
  for (const auto& c : configs) {
    if (c.tp < 1 || c.pp < 1) return InvalidArgument("instance TP and PP must be >= 1");
    if (!(c.kv_ready_fraction > 0 && c.kv_ready_fraction <= 1)) {
      return InvalidArgument("instance kv_ready_fraction must be in (0, 1], got " +
                             std::to_string(c.kv_ready_fraction));
    }
    const StepCalibration none;
    const StepCalibration& cal = c.calibration ? *c.calibration : none;
    if (!(std::isfinite(cal.loop_gap_s) && cal.loop_gap_s >= 0)) {
      return InvalidArgument("instance calibration loop_gap_s must be finite and >= 0, got " +
                             std::to_string(cal.loop_gap_s));
    }
    ASSIGN_OR_RETURN(const double min_factor, MinFactor(cal.step_factors, "step_factors"));
    colocated += c.role == Role::kColocated;
    prefill += c.role == Role::kPrefill;
    decode += c.role == Role::kDecode;
    Instance inst;
    inst.cfg = c;
    // A factor below 1 makes some steps shorter than the model's shortest.
    inst.min_token_step_s = MinDecodeStepSeconds(c) * min_factor;
    inst.sched = factory(c.policy, c.role);
    if (!inst.sched) return InvalidArgument("scheduler factory returned no scheduler");
    if (c.distserve_decode_loop) {
      if (c.role != Role::kDecode) {
        return InvalidArgument("only a decode instance runs DistServe's decoding loop");
      }
      inst.loop = std::make_unique<DistServeDecodeLoop>(
          DecodeLoopOptions{static_cast<int>(instances_.size()), c.pp, c.policy.max_num_seqs,
                            c.policy.kv_capacity_tokens, c.policy.page_size},
          this);
    }
    instances_.push_back(std::move(inst));
  }
  if (colocated > 0 && (prefill > 0 || decode > 0)) {
    return InvalidArgument("a deployment is either colocated or disaggregated, not both");
  }
  if (colocated == 0 && (prefill == 0 || decode == 0)) {
    return InvalidArgument("a disaggregated deployment needs prefill and decode instances");
  }
  colocated_ = colocated > 0;
  result_.requests.resize(requests_.size());
  generated_.assign(requests_.size(), 0);
  prefill_of_.assign(requests_.size(), -1);
  missed_.assign(requests_.size(), 0);
  for (size_t i = 0; i < requests_.size(); ++i) {
    const SimRequest& r = requests_[i];
    if (r.prompt_len < 1 || r.output_len < 1) {
      return InvalidArgument("request " + std::to_string(r.id) + ": lengths must be >= 1");
    }
    auto& out = result_.requests[i];
    out.id = r.id;
    out.prompt_len = r.prompt_len;
    out.output_len = r.output_len;
    out.arrival_s = r.arrival_s;
    Push(r.arrival_s, EventKind::kArrival, -1, static_cast<int64_t>(i));
    // With a miss budget, a TTFT miss counts at its deadline rather than at its late token.
    if (opts_.max_misses >= 0 && std::isfinite(opts_.slo.ttft_s)) {
      Push(r.arrival_s + opts_.slo.ttft_s, EventKind::kTtftDeadline, -1, static_cast<int64_t>(i));
    }
  }
  return OkStatus();
}

SimResult Cluster::Run() {
  double now = 0.0;
  while (!events_.empty()) {
    if (opts_.max_misses >= 0 && misses_ > opts_.max_misses) {
      result_.stopped_early = true;
      break;
    }
    if (opts_.stop_after_meets >= 0 && meets_ >= opts_.stop_after_meets) {
      result_.reached_meets = true;
      break;
    }
    Event e = events_.top();
    events_.pop();
    now = e.time;
    switch (e.kind) {
      case EventKind::kArrival:
        OnArrival(now, e.request);
        break;
      case EventKind::kStageFree:
        MarkDirty(e.instance);
        break;
      case EventKind::kStepDone:
        OnStepDone(now, e.instance);
        break;
      case EventKind::kKvReady:
        HandOver(now, e.instance, e.request);
        break;
      case EventKind::kKvArrived:
        OnKvArrived(now, e.instance, e.request);
        break;
      case EventKind::kTtftDeadline:
        OnTtftDeadline(now, e.request);
        break;
      case EventKind::kLoopWake:
        instances_[e.instance].loop->Wake(now);
        break;
    }
    // Steps start once every event of this instant is in, so simultaneous arrivals batch.
    if (events_.empty() || events_.top().time > now) {
      for (int i : dirty_) {
        instances_[i].dirty = false;
        TryStart(now, i);
      }
      dirty_.clear();
    }
  }
  // Anything left unfinished (a scheduler that could not place it) is a failure.
  if (!result_.stopped_early && !result_.reached_meets) {
    for (size_t i = 0; i < result_.requests.size(); ++i)
      if (!result_.requests[i].done() && !result_.requests[i].failed) Fail(i);
  }
  for (const auto& inst : instances_) result_.num_preemptions += inst.sched->num_preemptions();
  result_.end_time_s = now;
  return std::move(result_);
}

int Cluster::PickLeastLoaded(Role role) const {
  int best = -1;
  for (size_t i = 0; i < instances_.size(); ++i) {
    if (instances_[i].cfg.role != role) continue;
    if (best < 0 || instances_[i].load() < instances_[best].load()) best = static_cast<int>(i);
  }
  return best;
}

void Cluster::Fail(int64_t req) {
  result_.requests[req].failed = true;
  CountMiss(req);
}

void Cluster::CountMiss(int64_t req) {
  if (!missed_[req]) {
    missed_[req] = 1;
    ++misses_;
  }
}

void Cluster::OnArrival(double now, int64_t req) {
  const int inst = PickLeastLoaded(colocated_ ? Role::kColocated : Role::kPrefill);
  if (!instances_[inst].sched->Add(req, requests_[req].prompt_len, 0, now).ok()) {
    Fail(req);
    return;
  }
  MarkDirty(inst);
}

void Cluster::OnTtftDeadline(double now, int64_t req) {
  const RequestResult& out = result_.requests[req];
  if (out.first_token_s >= 0 || missed_[req]) return;
  if (now - out.arrival_s > opts_.slo.ttft_s) {
    CountMiss(req);
  } else {  // rounding: arrival + slo - arrival <= slo; look again just after
    Push(std::nextafter(now, INFINITY), EventKind::kTtftDeadline, -1, req);
  }
}

void Cluster::CheckTpotBound(double now, int64_t req, double min_step_s) {
  const RequestResult& out = result_.requests[req];
  if (opts_.max_misses < 0 || missed_[req] || out.first_token_s < 0 || out.output_len <= 1) return;
  const int remaining = out.output_len - generated_[req];
  const double bound = (now - out.first_token_s + remaining * min_step_s) / (out.output_len - 1);
  if (bound > opts_.slo.tpot_s * (1 + 1e-9) + 1e-12) CountMiss(req);
}

void Cluster::HandOver(double now, int inst, int64_t req) {
  const int dest = PickLeastLoaded(Role::kDecode);
  prefill_of_[req] = inst;
  if (instances_[dest].loop) {  // the loop migrates the KV itself
    instances_[dest].loop->HandOver(now, req, requests_[req].prompt_len);
    return;
  }
  ++instances_[dest].incoming;
  const double xfer = KvTransferSeconds(instances_[inst].cfg, instances_[dest].cfg, links_,
                                        requests_[req].prompt_len);
  Push(now + xfer, EventKind::kKvArrived, dest, req);
}

void Cluster::OnKvArrived(double now, int inst, int64_t req) {
  result_.requests[req].kv_arrived_s = now;
  Instance& in = instances_[inst];
  --in.incoming;
  CheckTpotBound(now, req, in.min_token_step_s);
  const int prompt = requests_[req].prompt_len;
  if (!in.sched->Add(req, prompt + 1, prompt, now).ok()) {
    Fail(req);
    return;
  }
  MarkDirty(inst);
}

void Cluster::OnMigrated(int instance, double now, int64_t req) {
  result_.requests[req].kv_arrived_s = now;
  CheckTpotBound(now, req, instances_[instance].min_token_step_s);
}

StepShape Cluster::ShapeOf(const Instance& inst, const SimBatch& batch) const {
  StepShape shape;
  for (const BatchItem& item : batch.items) {
    // A decode instance's first step of a migrated sequence computes only its last token: the
    // rest of the prompt's KV arrived by transfer (an engine scheduler shows it as one chunk).
    if (item.decode || inst.cfg.role == Role::kDecode) {
      ++shape.decode_seqs;
      shape.decode_context += item.start + item.num_tokens;
    } else {
      shape.prefill_tokens += item.num_tokens;
      ++shape.prefill_chunks;
      shape.prefill_sq += static_cast<double>(item.num_tokens) * (item.start + item.num_tokens);
    }
  }
  return shape;
}

bool Cluster::OtherBusyOnNode(int i) const {
  for (size_t j = 0; j < instances_.size(); ++j) {
    if (static_cast<int>(j) != i && instances_[j].cfg.node == instances_[i].cfg.node &&
        instances_[j].in_flight > 0) {
      return true;
    }
  }
  return false;
}

void Cluster::TryStart(double now, int i) {
  Instance& inst = instances_[i];
  const int max_in_flight = std::min(inst.cfg.pp, inst.sched->max_in_flight());
  if (now < inst.stage_free_at || inst.in_flight >= max_in_flight) return;
  SimBatch batch = inst.sched->Schedule(now);
  if (batch.empty()) return;
  const StageTimes t = StartStep(now, i, ShapeOf(inst, batch));
  inst.stage_free_at = now + t.stage_s;
  // Batches leave the pipeline in the order they entered it.
  inst.last_done = std::max(now + t.step_s, inst.last_done);
  ++inst.in_flight;
  inst.batches.push_back(std::move(batch));
  Push(inst.last_done, EventKind::kStepDone, i, -1);
  if (EarlyHandOver(inst.cfg)) {
    // The rest of the step after the last layer's KV, before the batch leaves the pipeline (with
    // PP it may leave after the batch ahead of it, later than its own start + step).
    const double ready = inst.last_done - (1 - inst.cfg.kv_ready_fraction) * t.step_s;
    for (const BatchItem& item : inst.batches.back().items)
      if (item.samples) Push(ready, EventKind::kKvReady, i, item.seq_id);
  }
  if (inst.cfg.pp > 1) Push(inst.stage_free_at, EventKind::kStageFree, i, -1);
}

StageTimes Cluster::StartStep(double now, int i, const StepShape& shape) {
  Instance& inst = instances_[i];
  StageTimes t = PipelineTimes(inst.cfg.coeffs, shape, inst.cfg.pp);
  const bool corun = OtherBusyOnNode(i);
  if (inst.cfg.corun_slowdown != 1.0 && corun) {
    t.stage_s *= inst.cfg.corun_slowdown;
    t.step_s *= inst.cfg.corun_slowdown;
  }
  if (inst.cfg.calibration && !inst.cfg.calibration->step_factors.empty()) {
    const std::vector<double>& f = inst.cfg.calibration->step_factors;
    const double k = f[inst.steps_started % f.size()];
    t.stage_s *= k;
    t.step_s *= k;
  }
  ++inst.steps_started;
  ++result_.num_steps;
  if (opts_.record_steps) {
    result_.steps.push_back({i, now, t.step_s, shape.decode_seqs, shape.decode_context,
                             shape.prefill_tokens, corun, shape.prefill_chunks});
  }
  return t;
}

LoopStep Cluster::OnLaunch(int instance, double start, const StepShape& shape) {
  const StepCoeffs& k = instances_[instance].cfg.coeffs;
  const double launch_ms =
      k.overhead_ms + k.overhead_per_token_ms * static_cast<double>(shape.decode_context);
  return {StartStep(start, instance, shape), launch_ms * 1e-3};
}

bool Cluster::OnToken(double now, Instance& inst, int64_t req) {
  RequestResult& out = result_.requests[req];
  if (inst.cfg.role == Role::kPrefill && opts_.first_token_on_decode) {
    out.prefill_done_s = now;
    if (!EarlyHandOver(inst.cfg)) HandOver(now, static_cast<int>(&inst - instances_.data()), req);
    return true;
  }
  const int n = ++generated_[req];
  if (n == 1) {
    out.first_token_s = now;
    if (out.ttft_s() > opts_.slo.ttft_s) CountMiss(req);
  }
  const bool last = n >= out.output_len;
  if (!last) CheckTpotBound(now, req, inst.min_token_step_s);
  if (last) {
    out.finish_s = now;
    if (out.tpot_s() > opts_.slo.tpot_s) CountMiss(req);
    if (!missed_[req]) ++meets_;
  }
  if (inst.cfg.role != Role::kPrefill) return last;
  if (!last) HandOver(now, static_cast<int>(&inst - instances_.data()), req);
  return true;  // a prefill instance is done with the sequence after its first token
}

void Cluster::OnStepDone(double now, int i) {
  Instance& inst = instances_[i];
  SimBatch batch = std::move(inst.batches.front());
  inst.batches.pop_front();
  --inst.in_flight;
  std::vector<int64_t> finished;
  for (const BatchItem& item : batch.items) {
    if (item.samples && OnToken(now, inst, item.seq_id)) finished.push_back(item.seq_id);
  }
  inst.sched->Update(batch, finished);
  const double gap_s = inst.cfg.calibration ? inst.cfg.calibration->loop_gap_s : 0.0;
  if (gap_s > 0 && now + gap_s > inst.stage_free_at) {
    inst.stage_free_at = now + gap_s;
    Push(inst.stage_free_at, EventKind::kStageFree, i, -1);
    return;
  }
  MarkDirty(i);
}

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kColocated:
      return "colocated";
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
  }
  return "?";
}

SchedulerFactory NativeSchedulerFactory() {
  return [](const SchedPolicy& policy, Role) -> std::unique_ptr<StepScheduler> {
    if (policy.rule == BatchRule::kVllmV0) return std::make_unique<VllmStepScheduler>(policy);
    return std::make_unique<NativeStepScheduler>(policy);
  };
}

double KvTransferSeconds(const InstanceConfig& from, const InstanceConfig& to,
                         const ClusterLinks& links, int tokens) {
  const double bytes = links.kv_bytes_per_token * tokens;
  if (bytes <= 0) return links.transfer_latency_s;
  if (from.node == to.node) {
    const int shards = std::min(from.tp * from.pp, to.tp * to.pp);
    return links.transfer_latency_s + bytes / (links.intra_node_bw * shards);
  }
  return links.transfer_latency_s + bytes / links.inter_node_bw;
}

Result<SimResult> Simulate(std::span<const InstanceConfig> instances, const ClusterLinks& links,
                           std::span<const SimRequest> requests, const SimOptions& options) {
  Cluster cluster(links, requests, options);
  RETURN_IF_ERROR(cluster.Init(instances));
  return cluster.Run();
}

}  // namespace pd::planner
