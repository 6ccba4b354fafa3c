// Builds the planner's inputs from command-line style options: which model shape, hardware,
// latency model (a profile file, DistServe's A100 profile, or the analytical model), workload and
// cluster. Shared by `pdserve plan` and `pdserve simulate`.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "planner/search.h"

namespace pd::planner {

// DistServe's reference data (profiles, traces): data/distserve in the source tree.
inline std::string DefaultDistServeDir() { return PD_DISTSERVE_DIR; }

struct SetupOptions {
  std::string model = "opt-13b";  // built-in shape name, or a Hugging Face model directory
  std::string hardware = "a100-80gb";
  // Latency model: "auto" (DistServe's A100 profile when it has the model on A100, else
  // analytical), "analytical", or a profile file (pdserve's or DistServe's format).
  std::string profile = "auto";
  std::string colocated_profile = "";  // "" : same as profile
  std::string distserve_dir = DefaultDistServeDir();
  std::string lengths = "";  // "" : DistServe's ShareGPT sample
  int nodes = 4;
  int devices_per_node = 8;
  double inter_node_gbps = 25.0;
  double ttft_s = 0.25;
  double tpot_s = 0.1;
  double attainment = 0.9;
  int num_requests = 300;
  double cv = 1.0;
  uint64_t seed = 1;
  int max_pp = 4;
  bool chunked_colocated = false;
  // "native" (planner's copy of the engine policy; pipelines keep PP batches in flight) or
  // "engine" (engine::Scheduler itself; one batch in flight per instance).
  std::string scheduler = "native";
  int threads = 0;  // simulation threads of the search (0: one per core)
  // CPU compute threads per device (per TP rank) that the plan's instances run with, written as
  // their "threads". 0: a pdserve profile's "threads" (the threads it was measured with); else,
  // on the "cpu" hardware, this machine's cores split evenly over --devices-per-node; else none.
  int device_threads = 0;
};

// Owns what PlannerInputs points to.
struct PlannerSetup {
  PlannerInputs inputs;
  std::unique_ptr<LatencyModel> model;
  std::unique_ptr<LatencyModel> colocated_model;
  std::unique_ptr<KvCapacityTable> kv_table;
};

Result<std::unique_ptr<PlannerSetup>> BuildPlannerSetup(const SetupOptions& options);

}  // namespace pd::planner
