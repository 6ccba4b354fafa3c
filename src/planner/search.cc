#include "planner/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

namespace pd::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int MaxContext(const PlannerInputs& in) {
  int m = 0;
  for (const auto& l : in.lengths) m = std::max(m, l.prompt_len + l.output_len);
  return m;
}

// An instance that takes no time: the other phase when one phase is measured alone.
InstanceConfig Ideal(Role role) {
  InstanceConfig c;
  c.role = role;
  c.policy.kv_capacity_tokens = int64_t{1} << 34;
  c.policy.max_num_seqs = 1 << 30;
  c.policy.max_num_batched_tokens = 1 << 30;
  return c;
}

std::vector<ParallelConfig> Candidates(const PlannerInputs& in, const LatencyModel& model) {
  std::vector<ParallelConfig> out;
  for (int tp : in.tp_choices) {
    if (tp > in.cluster.devices_per_node || in.shape.num_heads % tp != 0) continue;
    if (!model.Coeffs(tp).ok()) continue;
    for (int pp = 1; pp <= in.max_pp && tp * pp <= in.cluster.devices(); ++pp) {
      if (KvCapacity(in, {tp, pp}) >= MaxContext(in)) out.push_back({tp, pp});
    }
  }
  return out;
}

GoodputOptions PhaseOptions(const PlannerInputs& in, Slo slo) {
  GoodputOptions g;
  g.slo = slo;
  g.attainment = in.attainment;
  g.iterations = in.iterations;
  g.make_scheduler = in.make_scheduler;
  g.min_requests = in.arrivals.num_requests;
  g.min_duration_s = in.min_duration_s;
  return g;
}

std::vector<SimRequest> Workload(const PlannerInputs& in) {
  ArrivalOptions a = in.arrivals;
  a.num_requests = std::max(in.max_requests, in.arrivals.num_requests);
  return MakeUnitRateWorkload(in.lengths, a);
}

ClusterLinks Links(const PlannerInputs& in) {
  ClusterLinks l;
  l.intra_node_bw = in.hw.intra_node_bw;
  l.inter_node_bw = in.cluster.inter_node_bw;
  l.kv_bytes_per_token = in.shape.KvBytesPerToken();
  return l;
}

// Goodput of one instance of `role` with the other phase ideal. `same_node`: where the decode
// instance receives KV from (NVLink when true, the inter-node link otherwise).
Result<double> PhaseGoodput(const PlannerInputs& in, Role role, ParallelConfig par, bool same_node,
                            std::span<const SimRequest> unit) {
  ASSIGN_OR_RETURN(InstanceConfig inst, MakeInstance(in, role, par, 0));
  std::vector<InstanceConfig> insts;
  Slo slo = in.slo;
  if (role == Role::kPrefill) {
    insts = {inst, Ideal(Role::kDecode)};
    slo.tpot_s = kInf;
  } else if (role == Role::kDecode) {
    InstanceConfig prefill = Ideal(Role::kPrefill);
    prefill.node = same_node ? 0 : 1;
    insts = {prefill, inst};
    slo.ttft_s = kInf;
  } else {
    insts = {inst};
  }
  return FindGoodput(insts, Links(in), unit, PhaseOptions(in, slo));
}

// Runs fn(0) ... fn(n - 1) on up to `threads` threads (0: one per core); each index once.
void ParallelFor(int n, int threads, const std::function<void(int)>& fn) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, n);
  if (threads <= 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) fn(i);
    });
  }
  for (auto& th : pool) th.join();
}

struct TableSpec {
  Role role;
  bool same_node;
};

// Every candidate of every table, simulated in parallel; tables in the order of `specs`.
Result<std::vector<std::vector<PhaseChoice>>> PhaseTables(const PlannerInputs& in,
                                                          const std::vector<TableSpec>& specs,
                                                          std::span<const SimRequest> unit) {
  struct Job {
    size_t table;
    ParallelConfig par;
  };
  std::vector<Job> jobs;
  for (size_t t = 0; t < specs.size(); ++t) {
    const LatencyModel* model =
        specs[t].role == Role::kColocated && in.colocated_model ? in.colocated_model : in.model;
    for (ParallelConfig par : Candidates(in, *model)) jobs.push_back({t, par});
  }
  std::vector<Result<double>> results(jobs.size(), Result<double>(0.0));
  ParallelFor(static_cast<int>(jobs.size()), in.threads, [&](int i) {
    const Job& j = jobs[i];
    results[i] = PhaseGoodput(in, specs[j.table].role, j.par, specs[j.table].same_node, unit);
  });
  std::vector<std::vector<PhaseChoice>> out(specs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!results[i].ok()) return results[i].status();
    out[jobs[i].table].push_back({jobs[i].par, *results[i]});
  }
  return out;
}

const PhaseChoice* Best(const std::vector<PhaseChoice>& table) {
  const PhaseChoice* best = nullptr;
  for (const auto& c : table)
    if (c.goodput > 0 && (best == nullptr || c.per_device() > best->per_device())) best = &c;
  return best;
}

// Simulates the unit whole (both SLOs, KV transfers) and fills plan.goodput.
Status SimulateUnit(const PlannerInputs& in, Plan* plan, bool all_same_node) {
  std::vector<InstanceConfig> insts;
  int device = 0;
  auto add = [&](Role role, ParallelConfig par, int count) -> Status {
    for (int i = 0; i < count; ++i) {
      const int node = all_same_node ? 0 : device / in.cluster.devices_per_node;
      ASSIGN_OR_RETURN(InstanceConfig c, MakeInstance(in, role, par, node));
      insts.push_back(c);
      device += par.devices();
    }
    return OkStatus();
  };
  if (plan->mode == "colocated") {
    RETURN_IF_ERROR(add(Role::kColocated, plan->colocated.par, plan->num_colocated));
  } else {
    RETURN_IF_ERROR(add(Role::kPrefill, plan->prefill.par, plan->num_prefill));
    RETURN_IF_ERROR(add(Role::kDecode, plan->decode.par, plan->num_decode));
  }
  const auto unit = Workload(in);
  ASSIGN_OR_RETURN(plan->goodput, FindGoodput(insts, Links(in), unit, PhaseOptions(in, in.slo)));
  return OkStatus();
}

// Best (n_p, n_d) for per-phase choices within `budget` devices per unit (times `nodes_per_unit`
// for the device count). Returns false when nothing fits.
bool BestCounts(const PhaseChoice& p, const PhaseChoice& d, int budget, int nodes_per_unit,
                Plan* plan) {
  double best = 0.0;
  for (int np = 1; np * p.par.devices() <= budget; ++np) {
    for (int nd = 1; np * p.par.devices() + nd * d.par.devices() <= budget; ++nd) {
      const int devices = (np * p.par.devices() + nd * d.par.devices()) * nodes_per_unit;
      const double g = std::min(np * p.goodput, nd * d.goodput);
      if (g / devices > best * (1 + 1e-9)) {
        best = g / devices;
        plan->num_prefill = np;
        plan->num_decode = nd;
        plan->unit_devices = devices;
        plan->estimated_goodput = g;
      }
    }
  }
  return best > 0;
}

}  // namespace

std::string_view AffinityName(Affinity a) { return a == Affinity::kHigh ? "high" : "low"; }

int64_t KvCapacity(const PlannerInputs& in, ParallelConfig par) {
  if (in.kv_table != nullptr && in.hw.name == "a100-80gb") {
    const int64_t t = in.kv_table->Lookup(in.shape.name, par.tp, par.pp);
    if (t >= 0) return t;
  }
  return AnalyticalKvCapacityTokens(in.shape, in.hw, par.tp, par.pp, 0.95, in.moe_dp);
}

Result<InstanceConfig> MakeInstance(const PlannerInputs& in, Role role, ParallelConfig par,
                                    int node) {
  const LatencyModel* model =
      role == Role::kColocated && in.colocated_model ? in.colocated_model : in.model;
  if (model == nullptr) return InvalidArgument("planner inputs have no latency model");
  InstanceConfig c;
  c.role = role;
  c.tp = par.tp;
  c.pp = par.pp;
  c.node = node;
  ASSIGN_OR_RETURN(c.coeffs, model->Coeffs(par.tp));
  c.policy.kv_capacity_tokens = KvCapacity(in, par);
  if (c.policy.kv_capacity_tokens <= 0) {
    return FailedPrecondition(in.shape.name + " does not fit at TP " + std::to_string(par.tp) +
                              " PP " + std::to_string(par.pp));
  }
  c.policy.max_num_seqs = 256;
  c.policy.max_num_batched_tokens = role == Role::kDecode ? (1 << 30) : 2048;
  if (role == Role::kColocated && in.chunked_colocated) {
    c.policy.enable_chunked_prefill = true;
    c.policy.max_num_batched_tokens = 512;
  }
  return c;
}

namespace {

// Estimated goodput per device of one unit; 0 before a unit is chosen.
double EstimatedPerDevice(const Plan& p) {
  return p.unit_devices > 0 ? p.estimated_goodput / p.unit_devices : 0.0;
}

// `cand` replaces `*best` when it serves clearly more per device (ties keep the earlier one).
void KeepIfBetter(const Plan& cand, Plan* best) {
  if (EstimatedPerDevice(cand) > EstimatedPerDevice(*best) * (1 + 1e-9)) *best = cand;
}

// High affinity: every pair of phase configurations, replicated in the ratio of their goodputs
// within the cluster; DistServe takes the best of each phase, which is the same pair whenever the
// cluster has room for both. unit_devices stays 0 when no pair fits.
Plan SearchHighAffinity(const PlannerInputs& in, const std::vector<PhaseChoice>& prefill,
                        const std::vector<PhaseChoice>& decode) {
  Plan best;
  best.mode = "disaggregated";
  best.affinity = Affinity::kHigh;
  for (const auto& p : prefill) {
    for (const auto& d : decode) {
      if (p.goodput <= 0 || d.goodput <= 0) continue;
      Plan cand = best;
      cand.prefill = p;
      cand.decode = d;
      if (!BestCounts(p, d, in.cluster.devices(), 1, &cand)) continue;
      KeepIfBetter(cand, &best);
    }
  }
  return best;
}

// Low affinity: k nodes per unit, per node a prefill and a decode segment of the same layers, so
// the KV moves over the intra-node link (`decode_intra`: decode goodputs at that bandwidth).
Plan SearchLowAffinity(const PlannerInputs& in, const std::vector<PhaseChoice>& prefill,
                       const std::vector<PhaseChoice>& decode_intra) {
  Plan best;
  best.mode = "disaggregated";
  best.affinity = Affinity::kLow;
  for (int k = 1; k <= in.cluster.num_nodes; ++k) {
    for (const auto& p : prefill) {
      for (const auto& d : decode_intra) {
        if (p.par.pp % k != 0 || d.par.pp % k != 0 || p.goodput <= 0 || d.goodput <= 0) continue;
        Plan cand = best;
        cand.prefill = {{p.par.tp, p.par.pp}, p.goodput};
        cand.decode = {{d.par.tp, d.par.pp}, d.goodput};
        PhaseChoice ps{{p.par.tp, p.par.pp / k}, p.goodput},
            ds{{d.par.tp, d.par.pp / k}, d.goodput};
        if (!BestCounts(ps, ds, in.cluster.devices_per_node, k, &cand)) continue;
        KeepIfBetter(cand, &best);
      }
    }
  }
  return best;
}

// The colocated baseline: one instance of the best colocated configuration.
Plan ColocatedBaseline(const PhaseChoice& best) {
  Plan c;
  c.mode = "colocated";
  c.colocated = best;
  c.num_colocated = 1;
  c.unit_devices = best.par.devices();
  c.estimated_goodput = c.goodput = best.goodput;
  return c;
}

}  // namespace

Result<PlanReport> SearchPlacement(const PlannerInputs& in) {
  if (in.model == nullptr) return InvalidArgument("planner inputs have no latency model");
  if (in.lengths.empty()) return InvalidArgument("planner inputs have no request lengths");
  if (in.cluster.num_nodes < 1 || in.cluster.devices_per_node < 1) {
    return InvalidArgument("cluster needs at least one node with one device");
  }
  PlanReport r;
  const auto unit = Workload(in);
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(auto tables, PhaseTables(in,
                                            {{Role::kPrefill, false},
                                             {Role::kDecode, false},
                                             {Role::kDecode, true},
                                             {Role::kColocated, false}},
                                            unit));
  r.prefill_table = std::move(tables[0]);
  r.decode_table = std::move(tables[1]);
  const std::vector<PhaseChoice> decode_intra = std::move(tables[2]);
  r.colocated_table = std::move(tables[3]);
  const auto t1 = std::chrono::steady_clock::now();
  r.tables_wall_s = std::chrono::duration<double>(t1 - t0).count();
  const PhaseChoice* bc = Best(r.colocated_table);
  if (Best(r.prefill_table) == nullptr || Best(r.decode_table) == nullptr || bc == nullptr) {
    return FailedPrecondition("no configuration meets the SLOs at any rate (model " +
                              in.shape.name + ", " + std::to_string(in.cluster.devices()) +
                              " devices)");
  }
  r.high = SearchHighAffinity(in, r.prefill_table, r.decode_table);
  r.low = SearchLowAffinity(in, r.prefill_table, decode_intra);
  // Both units simulated whole, side by side.
  Status unit_status[2];
  ParallelFor(2, in.threads, [&](int i) {
    Plan* p = i == 0 ? &r.high : &r.low;
    if (p->unit_devices > 0) unit_status[i] = SimulateUnit(in, p, /*all_same_node=*/i == 1);
  });
  RETURN_IF_ERROR(unit_status[0]);
  RETURN_IF_ERROR(unit_status[1]);
  r.units_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  r.colocated = ColocatedBaseline(*bc);
  if (r.high.unit_devices == 0 && r.low.unit_devices == 0) {
    return FailedPrecondition("no prefill and decode pair fits in " +
                              std::to_string(in.cluster.devices()) + " devices");
  }
  r.best = r.high.per_device() >= r.low.per_device() ? r.high : r.low;
  for (Plan* p : {&r.best, &r.high, &r.low, &r.colocated}) {
    if (p->unit_devices > 0) p->replicas = std::max(1, in.cluster.devices() / p->unit_devices);
  }
  return r;
}

std::string PlanToJson(const PlanReport& report, const PlannerInputs& in) {
  using nlohmann::json;
  auto instance = [&in](const char* role, int count, ParallelConfig par) {
    json i = {{"role", role}, {"count", count}, {"tp", par.tp}, {"pp", par.pp}};
    if (in.threads_per_device > 0) i["threads"] = in.threads_per_device;
    return i;
  };
  auto plan_json = [&instance](const Plan& p) {
    json j;
    j["mode"] = p.mode;
    json insts = json::array();
    if (p.mode == "colocated") {
      insts.push_back(instance("colocated", p.num_colocated * p.replicas, p.colocated.par));
    } else {
      j["placement"] = std::string(AffinityName(p.affinity)) + "-affinity";
      insts.push_back(instance("prefill", p.num_prefill * p.replicas, p.prefill.par));
      insts.push_back(instance("decode", p.num_decode * p.replicas, p.decode.par));
    }
    j["instances"] = insts;
    j["unit_devices"] = p.unit_devices;
    j["replicas"] = p.replicas;
    j["devices"] = p.unit_devices * p.replicas;
    j["unit_goodput_rps"] = p.goodput;
    j["goodput_rps"] = p.goodput * p.replicas;
    j["goodput_per_device"] = p.per_device();
    return j;
  };
  json j;
  j["format"] = "pdserve-plan-v1";
  j["model"] = in.shape.name;
  j["hardware"] = in.hw.name;
  j["latency_model"] = in.model->Describe();
  j["cluster"] = {{"nodes", in.cluster.num_nodes},
                  {"devices_per_node", in.cluster.devices_per_node},
                  {"inter_node_gbps", in.cluster.inter_node_bw * 8 / 1e9}};
  j["slo"] = {{"ttft_s", in.slo.ttft_s}, {"tpot_s", in.slo.tpot_s}, {"attainment", in.attainment}};
  j["plan"] = plan_json(report.best);
  j["colocated_baseline"] = plan_json(report.colocated);
  j["goodput_per_device_ratio"] = report.colocated.per_device() > 0
                                      ? report.best.per_device() / report.colocated.per_device()
                                      : 0.0;
  return j.dump(2) + "\n";
}

}  // namespace pd::planner
