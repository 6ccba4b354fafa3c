#include "planner/deployment.h"

#include <nlohmann/json.hpp>
#include <regex>

namespace pd::planner {

std::string DeploymentSpec::Describe() const {
  auto par = [](ParallelConfig p) {
    return "TP" + std::to_string(p.tp) + " PP" + std::to_string(p.pp);
  };
  if (!disaggregated) {
    return std::to_string(num_colocated) + " x colocated " + par(colocated) +
           (chunked_prefill ? " (chunked prefill)" : "");
  }
  return std::to_string(num_prefill) + " x prefill " + par(prefill) + " + " +
         std::to_string(num_decode) + " x decode " + par(decode) + (same_node ? " (one node)" : "");
}

Result<ParallelConfig> ParseParallel(const std::string& text) {
  ParallelConfig p;
  char extra = 0;
  const int n = std::sscanf(text.c_str(), "%dx%d%c", &p.tp, &p.pp, &extra);
  if (n == 1) p.pp = 1;
  if ((n != 1 && n != 2) || p.tp < 1 || p.pp < 1) {
    return InvalidArgument("parallelism '" + text + "': expected TPxPP, e.g. 2x1");
  }
  return p;
}

Result<DeploymentSpec> ParsePlanJson(const std::string& json_text, const std::string& source) {
  using nlohmann::json;
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(source + ": not a JSON object");
  if (j.value("format", "") != "pdserve-plan-v1") {
    return InvalidArgument(source + ": field 'format' must be \"pdserve-plan-v1\"");
  }
  auto plan = j.find("plan");
  if (plan == j.end() || !plan->contains("instances") || !(*plan)["instances"].is_array()) {
    return InvalidArgument(source + ": missing plan.instances");
  }
  DeploymentSpec spec;
  spec.disaggregated = plan->value("mode", "") == "disaggregated";
  spec.same_node = plan->value("placement", "") == "low-affinity";
  for (const auto& inst : (*plan)["instances"]) {
    if (!inst.is_object() || !inst.contains("role") || !inst["role"].is_string()) {
      return InvalidArgument(source + ": every instance needs a string 'role'");
    }
    const std::string role = inst["role"];
    ParallelConfig par{inst.value("tp", 1), inst.value("pp", 1)};
    const int count = inst.value("count", 1);
    if (par.tp < 1 || par.pp < 1 || count < 1) {
      return InvalidArgument(source + ": instance '" + role + "' needs tp, pp, count >= 1");
    }
    if (role == "prefill") {
      spec.prefill = par;
      spec.num_prefill = count;
    } else if (role == "decode") {
      spec.decode = par;
      spec.num_decode = count;
    } else if (role == "colocated") {
      spec.colocated = par;
      spec.num_colocated = count;
    } else {
      return InvalidArgument(source + ": unknown role '" + role + "'");
    }
  }
  return spec;
}

Result<DeploymentSpec> DeploymentFromTraceName(const std::string& name, bool* assumed) {
  *assumed = false;
  DeploymentSpec spec;
  std::smatch m;
  if (std::regex_match(name, std::regex(R"(vllm-\d+-[\d.]+(\.json)?)"))) return spec;
  if (std::regex_match(name, m,
                       std::regex(R"(distserve-c(\d)(\d)d(\d)(\d)-\d+-[\d.]+(\.json)?)"))) {
    spec.disaggregated = true;
    spec.same_node = true;
    spec.prefill = {std::stoi(m[1]), std::stoi(m[2])};
    spec.decode = {std::stoi(m[3]), std::stoi(m[4])};
    return spec;
  }
  if (std::regex_match(name, std::regex(R"(distserve-\d+-[\d.]+(\.json)?)"))) {
    *assumed = true;
    spec.disaggregated = true;
    spec.same_node = true;
    spec.prefill = {2, 1};
    spec.decode = {1, 1};
    return spec;
  }
  return InvalidArgument("trace name '" + name +
                         "' is not vllm-N-RATE, distserve-N-RATE or distserve-cTPPPdTPPP-N-RATE");
}

std::string TraceNameOf(const std::string& name_or_path) {
  std::string name = name_or_path.substr(name_or_path.find_last_of('/') + 1);
  const std::string ext = ".json";
  if (name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0) {
    name.resize(name.size() - ext.size());
  }
  return name;
}

namespace {

// The "threads" of every instance in the plan, which must agree (0 when none gives it).
Result<int> PlanThreads(const std::string& json_text, const std::string& source) {
  using nlohmann::json;
  json j = json::parse(json_text, nullptr, false);
  int threads = 0;
  for (const auto& inst : j["plan"]["instances"]) {
    if (!inst.contains("threads")) continue;
    if (!inst["threads"].is_number_integer() || inst["threads"].get<int>() < 1) {
      return InvalidArgument(source + ": 'threads' must be a positive integer");
    }
    const int t = inst["threads"].get<int>();
    if (threads != 0 && t != threads) {
      return InvalidArgument(source + ": instances give different 'threads' (" +
                             std::to_string(threads) + " and " + std::to_string(t) +
                             "); pdserve up runs every instance with the same thread count");
    }
    threads = t;
  }
  return threads;
}

}  // namespace

Result<LocalPlan> LocalPlanFromJson(const std::string& json_text, const std::string& source,
                                    const LocalLimits& limits) {
  ASSIGN_OR_RETURN(DeploymentSpec spec, ParsePlanJson(json_text, source));
  if (!spec.disaggregated) {
    return InvalidArgument(source +
                           ": the plan is colocated; pdserve up starts prefill + decode "
                           "instances (run `pdserve serve` per colocated instance instead)");
  }
  if (spec.prefill.pp > 1 || spec.decode.pp > 1) {
    return InvalidArgument(source + ": the plan uses pipeline parallelism (prefill PP " +
                           std::to_string(spec.prefill.pp) + ", decode PP " +
                           std::to_string(spec.decode.pp) +
                           "), which pdserve's engine does not implement; re-plan with "
                           "--max-pp 1");
  }
  if (!limits.engine_tp && (spec.prefill.tp > 1 || spec.decode.tp > 1)) {
    return InvalidArgument(source + ": the plan uses tensor parallelism (prefill TP " +
                           std::to_string(spec.prefill.tp) + ", decode TP " +
                           std::to_string(spec.decode.tp) +
                           "), which this build's serve does not offer "
                           "(no --tensor-parallel-size); re-plan with TP 1");
  }
  LocalPlan p;
  p.num_prefill = spec.num_prefill;
  p.num_decode = spec.num_decode;
  p.prefill_tp = spec.prefill.tp;
  p.decode_tp = spec.decode.tp;
  ASSIGN_OR_RETURN(p.threads, PlanThreads(json_text, source));
  const int instances = p.num_prefill + p.num_decode;
  if (limits.pin_cores && limits.cores > 0 && instances > limits.cores) {
    return InvalidArgument(source + ": " + std::to_string(instances) +
                           " instances cannot each be pinned to their own core on a machine "
                           "with " +
                           std::to_string(limits.cores) + " cores (drop --pin-cores or re-plan)");
  }
  return p;
}

Result<std::vector<InstanceConfig>> BuildInstances(const PlannerInputs& in,
                                                   const DeploymentSpec& spec) {
  std::vector<InstanceConfig> out;
  int device = 0;
  auto add = [&](Role role, ParallelConfig par, int count) -> Status {
    for (int i = 0; i < count; ++i) {
      const int node = spec.same_node ? 0 : device / std::max(1, in.cluster.devices_per_node);
      ASSIGN_OR_RETURN(InstanceConfig c, MakeInstance(in, role, par, node));
      if (role == Role::kColocated && spec.chunked_prefill) {
        c.policy.enable_chunked_prefill = true;
        c.policy.max_num_batched_tokens = 512;
      }
      out.push_back(c);
      device += par.devices();
    }
    return OkStatus();
  };
  if (spec.disaggregated) {
    RETURN_IF_ERROR(add(Role::kPrefill, spec.prefill, spec.num_prefill));
    RETURN_IF_ERROR(add(Role::kDecode, spec.decode, spec.num_decode));
  } else {
    RETURN_IF_ERROR(add(Role::kColocated, spec.colocated, spec.num_colocated));
  }
  return out;
}

}  // namespace pd::planner
