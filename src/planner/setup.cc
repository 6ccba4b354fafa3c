#include "planner/setup.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/file_util.h"

#include "model/config.h"
#ifdef PD_PLANNER_HAS_ENGINE_SCHEDULER
#include "planner/engine_scheduler.h"
#endif

namespace pd::planner {
namespace {

Result<ModelShape> ResolveShape(const std::string& model) {
  auto builtin = BuiltinModelShape(model);
  if (builtin.ok()) return builtin;
  if (std::filesystem::exists(model + "/config.json")) {
    ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(model));
    return ShapeFromConfig(config, std::filesystem::path(model).filename().string());
  }
  return NotFound("--model '" + model +
                  "': neither a built-in shape (opt-13b, opt-66b, opt-175b, deepseek-r1, "
                  "qwen3-coder-480b-a35b) nor a directory "
                  "with config.json");
}

Result<std::unique_ptr<LatencyModel>> ResolveModel(const std::string& spec, const SetupOptions& o,
                                                   const ModelShape& shape, const HardwareSpec& hw,
                                                   const char* engine) {
  if (spec == "analytical")
    return std::unique_ptr<LatencyModel>(new AnalyticalLatencyModel(shape, hw));
  if (spec == "auto") {
    const std::string path =
        o.distserve_dir + "/a100-profile/profiler-a100-80g." + engine + ".json";
    if (hw.name == "a100-80gb" && std::filesystem::exists(path)) {
      auto m = LoadDistServeProfile(path, shape.name);
      if (m.ok()) return std::unique_ptr<LatencyModel>(std::move(*m));
      if (m.status().code() != StatusCode::kNotFound) return m.status();
    }
    return std::unique_ptr<LatencyModel>(new AnalyticalLatencyModel(shape, hw));
  }
  ASSIGN_OR_RETURN(auto m, LoadProfile(spec, shape.name));
  return std::unique_ptr<LatencyModel>(std::move(m));
}

// The "threads" a pdserve profile was measured with (0: not a pdserve profile, or none given).
Result<int> ProfileThreads(const std::string& path) {
  if (path == "auto" || path == "analytical") return 0;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || j.value("format", "") != "pdserve-profile-v1" || !j.contains("threads")) {
    return 0;
  }
  if (!j["threads"].is_number_integer() || j["threads"].get<int>() < 1) {
    return InvalidArgument(path + ": 'threads' must be a positive integer");
  }
  return j["threads"].get<int>();
}

Result<int> DeviceThreads(const SetupOptions& o) {
  if (o.device_threads < 0) return InvalidArgument("--device-threads must be >= 0");
  if (o.device_threads > 0) return o.device_threads;
  ASSIGN_OR_RETURN(int profiled, ProfileThreads(o.profile));
  if (profiled > 0) return profiled;
  if (o.hardware == "cpu") {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    return std::max(1, cores / std::max(1, o.devices_per_node));
  }
  return 0;
}

}  // namespace

Result<std::unique_ptr<PlannerSetup>> BuildPlannerSetup(const SetupOptions& o) {
  auto s = std::make_unique<PlannerSetup>();
  PlannerInputs& in = s->inputs;
  ASSIGN_OR_RETURN(in.shape, ResolveShape(o.model));
  ASSIGN_OR_RETURN(in.hw, BuiltinHardware(o.hardware));
  ASSIGN_OR_RETURN(s->model, ResolveModel(o.profile, o, in.shape, in.hw, "distserve"));
  const std::string colocated = o.colocated_profile.empty() ? o.profile : o.colocated_profile;
  // DistServe compared against vLLM with vLLM's own profile; "auto" keeps that pairing.
  ASSIGN_OR_RETURN(s->colocated_model, ResolveModel(colocated, o, in.shape, in.hw,
                                                    colocated == "auto" ? "vllm" : "distserve"));
  in.model = s->model.get();
  in.colocated_model = s->colocated_model.get();
  const std::string kv_csv = o.distserve_dir + "/a100-profile/max_num_tokens.csv";
  if (std::filesystem::exists(kv_csv)) {
    ASSIGN_OR_RETURN(KvCapacityTable table, LoadKvCapacityCsv(kv_csv));
    s->kv_table = std::make_unique<KvCapacityTable>(std::move(table));
    in.kv_table = s->kv_table.get();
  }
  const std::string lengths =
      o.lengths.empty() ? o.distserve_dir + "/sharegpt-opt13b-lengths.csv" : o.lengths;
  ASSIGN_OR_RETURN(in.lengths, LoadLengthsCsv(lengths));
  if (o.nodes < 1 || o.devices_per_node < 1 || !(o.inter_node_gbps > 0)) {
    return InvalidArgument(
        "cluster needs --nodes >= 1, --devices-per-node >= 1 and a positive "
        "--inter-node-gbps");
  }
  if (!(o.ttft_s > 0) || !(o.tpot_s > 0)) return InvalidArgument("SLOs must be positive");
  if (!(o.attainment > 0 && o.attainment <= 1)) {
    return InvalidArgument("--attainment must be in (0, 1]");
  }
  if (o.num_requests < 10 || o.max_pp < 1)
    return InvalidArgument("--requests must be >= 10 and --max-pp >= 1");
  in.cluster = {o.nodes, o.devices_per_node, o.inter_node_gbps * 1e9 / 8};
  in.slo = {o.ttft_s, o.tpot_s};
  in.attainment = o.attainment;
  in.arrivals.num_requests = o.num_requests;
  in.arrivals.cv = o.cv;
  in.arrivals.seed = o.seed;
  in.max_pp = o.max_pp;
  in.chunked_colocated = o.chunked_colocated;
  if (o.threads < 0) return InvalidArgument("--threads must be >= 0");
  in.threads = o.threads;
  ASSIGN_OR_RETURN(in.threads_per_device, DeviceThreads(o));
  in.tp_choices = {1, 2, 3, 4, 6, 8};
  if (o.scheduler == "engine") {
#ifdef PD_PLANNER_HAS_ENGINE_SCHEDULER
    in.make_scheduler = EngineSchedulerFactory();
#else
    return Unimplemented("--scheduler engine: this build has no engine library");
#endif
  } else if (o.scheduler != "native") {
    return InvalidArgument("--scheduler '" + o.scheduler + "': expected native or engine");
  }
  return s;
}

}  // namespace pd::planner
