// Goodput: the highest request rate at which SLO attainment stays at or above the target, found
// by bisection of the rate on the simulator.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "common/status.h"
#include "planner/simulator.h"

namespace pd::planner {

struct GoodputOptions {
  Slo slo;
  double attainment = 0.9;
  int iterations = 12;    // bisection steps after the bracket
  double max_rate = 0.0;  // upper end of the bracket (req/s); 0: from UpperBoundRate
  SchedulerFactory make_scheduler;
  // How many requests of the unit-rate workload a probe at `rate` uses: at least min_requests and
  // enough to span min_duration_s, capped by the workload's size (0, 0: all of it). A fixed count
  // would turn high rates into one burst that a large batch absorbs, overstating goodput.
  int min_requests = 0;
  double min_duration_s = 0.0;
};

// The number of requests a probe at `rate` takes from a workload of `available` requests.
int RequestsForRate(const GoodputOptions& options, double rate, size_t available);

// A rate at which `instances` surely cannot keep up, from the latency model alone (no SLO): four
// times the throughput bound of the slower phase. The same bound for every SLO keeps the
// bisection monotonic in the SLO.
double UpperBoundRate(std::span<const InstanceConfig> instances,
                      std::span<const SimRequest> unit_rate);

// Attainment of `instances` over `unit_rate` scaled to `rate` (runs the whole workload).
Result<Summary> AttainmentAt(std::span<const InstanceConfig> instances, const ClusterLinks& links,
                             std::span<const SimRequest> unit_rate, double rate,
                             const GoodputOptions& options);

// Goodput in req/s (0 when even the lowest probed rate misses the target).
Result<double> FindGoodput(std::span<const InstanceConfig> instances, const ClusterLinks& links,
                           std::span<const SimRequest> unit_rate, const GoodputOptions& options);

}  // namespace pd::planner
