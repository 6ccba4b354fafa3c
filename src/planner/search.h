// Placement search (DistServe, OSDI '24, Algorithms 1 and 2): the prefill and decode parallelism
// and instance counts that maximise goodput per device, and the colocated baseline.
//
// High node affinity: prefill and decode instances are placed independently. For each (TP, PP)
// the per-instance goodput of each phase is found by bisection on the simulator (prefill alone
// against the TTFT SLO, decode alone against the TPOT SLO); the best per device of each phase is
// replicated in the ratio of their goodputs. KV crosses nodes (inter-node bandwidth).
// Low node affinity: an instance's pipeline stages span k nodes, and on every node a prefill
// segment and a decode segment holding the same layers sit side by side, so KV moves over NVLink.
// Both phases then share k, and per node n_p·tp_p·s_p + n_d·tp_d·s_d <= devices per node.
// The best unit is then simulated whole (both SLOs, KV transfers) to report its goodput.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "planner/goodput.h"
#include "planner/hardware.h"

namespace pd::planner {

enum class Affinity { kHigh, kLow };
std::string_view AffinityName(Affinity a);  // "high" | "low"

struct ClusterSpec {
  int num_nodes = 4;
  int devices_per_node = 8;
  double inter_node_bw = 3.125e9;  // bytes/s (25 Gbps)
  int devices() const { return num_nodes * devices_per_node; }
};

struct PlannerInputs {
  ModelShape shape;
  HardwareSpec hw;
  const LatencyModel* model = nullptr;            // disaggregated instances
  const LatencyModel* colocated_model = nullptr;  // colocated baseline (nullptr: model)
  const KvCapacityTable* kv_table = nullptr;      // optional, preferred over the analytical sizing
  ClusterSpec cluster;
  Slo slo;
  double attainment = 0.9;
  std::vector<LengthPair> lengths;  // request lengths to draw from
  ArrivalOptions arrivals;          // num_requests: the fewest requests a probe simulates
  int max_requests = 2000;          // the most a probe simulates
  double min_duration_s = 30.0;     // a probe spans at least this much arrival time
  std::vector<int> tp_choices = {1, 2, 4, 8};
  int max_pp = 4;
  int iterations = 10;             // bisection steps per goodput
  bool chunked_colocated = false;  // baseline uses chunked prefill
  SchedulerFactory make_scheduler;
  int threads = 0;  // simulations run in parallel on this many threads (0: one per core)
  // CPU compute threads one device stands for (a pdserve profile's thread count); PlanToJson
  // writes it as every instance's "threads" (per rank), which `pdserve up --plan` starts each
  // rank with. 0: not written (accelerators).
  int threads_per_device = 0;
  // Data-parallel attention ranks that share each MoE layer's experts (MoeParallelism::dp): every
  // instance is one such rank and holds 1/moe_dp of the routed experts. 1: none.
  int moe_dp = 1;
};

struct ParallelConfig {
  int tp = 1;
  int pp = 1;
  int devices() const { return tp * pp; }
};

struct PhaseChoice {
  ParallelConfig par;
  double goodput = 0.0;  // req/s of one instance
  double per_device() const { return goodput / par.devices(); }
};

struct Plan {
  std::string mode;  // "disaggregated" | "colocated"
  Affinity affinity = Affinity::kHigh;
  PhaseChoice prefill, decode, colocated;
  int num_prefill = 0, num_decode = 0, num_colocated = 0;  // per unit
  int unit_devices = 0;
  int replicas = 1;                // units that fit in the cluster
  double estimated_goodput = 0.0;  // of one unit, from the per-phase goodputs
  double goodput = 0.0;            // of one unit, simulated whole
  double per_device() const { return unit_devices > 0 ? goodput / unit_devices : 0.0; }
};

struct PlanReport {
  Plan best;       // the higher per-device goodput of the two affinities
  Plan high, low;  // each search's best (low.unit_devices == 0 when none fits)
  Plan colocated;  // best colocated (TP, PP)
  std::vector<PhaseChoice> prefill_table, decode_table, colocated_table;  // every config tried
  double tables_wall_s = 0.0;  // wall time of the per-phase goodput tables
  double units_wall_s = 0.0;   // and of the whole-unit simulations
};

// KV capacity in tokens of an instance (the table when it has the model, else analytical).
int64_t KvCapacity(const PlannerInputs& in, ParallelConfig par);
// The instance configuration the search simulates for a role.
Result<InstanceConfig> MakeInstance(const PlannerInputs& in, Role role, ParallelConfig par,
                                    int node);

Result<PlanReport> SearchPlacement(const PlannerInputs& in);
// The deployment plan JSON (format pdserve-plan-v1).
std::string PlanToJson(const PlanReport& report, const PlannerInputs& in);

}  // namespace pd::planner
