#include "planner/trace_replay.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "planner/simulator.h"
#include "planner/workload.h"

namespace pd::planner {
namespace {

std::string Dir(const std::string& distserve_dir) {
  return distserve_dir + "/real-a100-opt13b-sharegpt/";
}

// "vllm" (colocated), "distserve" (configuration not recorded), else "cTPPPdTPPP" as the name
// writes the deployment, e.g. "c21d12".
std::string SystemOf(const DeploymentSpec& spec, bool assumed) {
  if (!spec.disaggregated) return "vllm";
  if (assumed) return "distserve";
  return "c" + std::to_string(spec.prefill.tp) + std::to_string(spec.prefill.pp) + "d" +
         std::to_string(spec.decode.tp) + std::to_string(spec.decode.pp);
}

// The rate: the name's last dash-separated field.
double RateOf(const std::string& name) {
  return std::strtod(name.substr(name.find_last_of('-') + 1).c_str(), nullptr);
}

std::string Row(const TraceReplay& r) {
  const Summary& s = r.simulated;
  const Summary& m = r.measured;
  char line[256];
  std::snprintf(line, sizeof(line),
                "%-27s %-9s %5.1f %6.1f%% %6.1f%% %+6.1f  %6.3f %6.3f  %6.3f %6.3f  %6.4f %6.4f  "
                "%6.4f %6.4f\n",
                r.name.c_str(), r.system.c_str(), r.rate, 100 * s.attainment, 100 * m.attainment,
                100 * (s.attainment - m.attainment), s.ttft_p50_s, m.ttft_p50_s, s.ttft_p90_s,
                m.ttft_p90_s, s.tpot_p50_s, m.tpot_p50_s, s.tpot_p90_s, m.tpot_p90_s);
  return line;
}

// The systems as DistServe's benchmark started them (evaluation/2-benchmark-serving): vLLM with
// --max-num-batched-tokens 16384 --max-num-seqs 1024 and its v0 scheduler; DistServe's decoding
// engine loop with --decoding-max-batch-size 1024.
void ConfigureAsRecorded(InstanceConfig* c) {
  if (c->role == Role::kColocated) {
    c->policy.rule = BatchRule::kVllmV0;
    c->policy.max_num_batched_tokens = 16384;
    c->policy.max_num_seqs = 1024;
  } else if (c->role == Role::kDecode) {
    c->distserve_decode_loop = true;
    c->policy.max_num_seqs = 1024;
  }
}

}  // namespace

Result<std::vector<std::string>> MatchTraces(const std::string& distserve_dir,
                                             const std::string& pattern) {
  const std::string workloads = Dir(distserve_dir) + "workloads";
  std::error_code ec;
  std::filesystem::directory_iterator it(workloads, ec);
  if (ec) return NotFound(workloads + ": " + ec.message());
  const std::string glob = pattern == "all" ? "*" : TraceNameOf(pattern);
  std::vector<std::string> names;
  for (const auto& entry : it) {
    const std::string name = TraceNameOf(entry.path().string());
    if (fnmatch(glob.c_str(), name.c_str(), 0) == 0) names.push_back(name);
  }
  if (names.empty()) return NotFound("no trace in " + workloads + " matches '" + pattern + "'");
  std::sort(names.begin(), names.end());
  return names;
}

Result<TraceReplay> ReplayTrace(const PlannerSetup& setup, const std::string& distserve_dir,
                                const std::string& name_or_path) {
  TraceReplay r;
  r.name = TraceNameOf(name_or_path);
  r.rate = RateOf(r.name);
  ASSIGN_OR_RETURN(r.spec, DeploymentFromTraceName(r.name, &r.assumed));
  r.system = SystemOf(r.spec, r.assumed);
  const std::string dir = Dir(distserve_dir);
  ASSIGN_OR_RETURN(const std::vector<SimRequest> trace,
                   LoadTraceJson(dir + "workloads/" + r.name + ".json"));
  ASSIGN_OR_RETURN(const std::vector<MeasuredRequest> measured,
                   LoadMeasuredJson(dir + "measured/" + r.name + ".json"));
  r.num_requests = trace.size();
  const PlannerInputs& in = setup.inputs;
  ASSIGN_OR_RETURN(std::vector<InstanceConfig> insts, BuildInstances(in, r.spec));
  for (InstanceConfig& c : insts) ConfigureAsRecorded(&c);
  const ClusterLinks links{in.hw.intra_node_bw, in.cluster.inter_node_bw,
                           in.shape.KvBytesPerToken()};
  SimOptions sim;
  // The vLLM runs replay vLLM's scheduler whichever scheduler the planner was given.
  sim.make_scheduler = r.spec.disaggregated ? in.make_scheduler : NativeSchedulerFactory();
  ASSIGN_OR_RETURN(const SimResult result, Simulate(insts, links, trace, sim));
  r.simulated = Summarize(result.requests, in.slo);
  r.measured = Summarize(MeasuredResults(measured), in.slo);
  return r;
}

std::string FormatReplayTable(const std::vector<TraceReplay>& rows) {
  std::string out =
      "trace                       system     rate   attainment sim/real  diff   TTFT p50 (s)   "
      "TTFT p90 (s)   TPOT p50 (s)    TPOT p90 (s)\n";
  std::map<std::string, std::vector<double>> diffs;  // system -> |simulated - measured| points
  for (const TraceReplay& r : rows) {
    out += Row(r);
    diffs[r.system].push_back(100 * std::abs(r.simulated.attainment - r.measured.attainment));
  }
  for (auto& [system, d] : diffs) {
    std::sort(d.begin(), d.end());
    const size_t n = d.size();
    const double median = n % 2 == 1 ? d[n / 2] : (d[n / 2 - 1] + d[n / 2]) / 2;
    char line[160];
    std::snprintf(line, sizeof(line),
                  "%-9s %2zu traces: attainment difference median %.1f points, worst %.1f\n",
                  system.c_str(), n, median, d.back());
    out += line;
  }
  return out;
}

}  // namespace pd::planner
