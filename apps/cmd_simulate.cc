// `pdserve simulate`: one deployment over a workload on the cluster simulator: SLO attainment and
// p50/p90 TTFT/TPOT per rate; or the replay of a recorded A100 trace beside what the real system
// measured on it.
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>

#include "apps/command.h"
#include "common/file_util.h"
#include "planner/deployment.h"
#include "planner/scenario.h"
#include "planner/setup.h"
#include "planner/simulate_json.h"
#include "planner/trace_replay.h"

namespace pd::apps {

void AddPlannerSetupOptions(CLI::App* app, planner::SetupOptions* o);  // cmd_plan.cc

namespace {

struct SimulateOptions {
  planner::SetupOptions setup;
  std::string plan;  // a pdserve-plan-v1 file
  std::string colocated = "1x1";
  std::string prefill, decode;  // "TPxPP": disaggregated when both are set
  int num_colocated = 1, num_prefill = 1, num_decode = 1;
  bool chunked = false;
  bool same_node = false;
  std::vector<double> rates = {1.0};
  std::string trace;     // a DistServe trace name (or workloads/ file) to replay
  std::string traces;    // "all" or a glob: every matching trace replayed, one table
  std::string scenario;  // "r1": the DeepSeek-R1 deployment comparison
  planner::R1ScenarioOptions r1;
  bool json = false;  // print a pdserve-simulate-v1 document instead of the tables
};

int RunScenario(const SimulateOptions& o) {
  if (o.scenario != "r1") {
    std::fprintf(stderr, "pdserve simulate: --scenario '%s': expected r1\n", o.scenario.c_str());
    return 2;
  }
  auto rows = planner::RunR1Scenario(o.r1);
  if (!rows.ok()) {
    std::fprintf(stderr, "pdserve simulate: %s\n", rows.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "%s on %s nodes (8 per node, NVLink inside, 8 x 400 Gb/s between); prompts uniform "
      "%d..%d tokens, outputs %d..%d; Poisson arrivals over %.0f s\n",
      o.r1.model.c_str(), o.r1.hardware.c_str(), o.r1.prompt_mean / 2, o.r1.prompt_mean * 3 / 2,
      o.r1.output_mean / 2, o.r1.output_mean * 3 / 2, o.r1.duration_s);
  std::fputs(planner::FormatR1Table(*rows, o.r1).c_str(), stdout);
  return 0;
}

Result<planner::DeploymentSpec> SpecFromFlags(const SimulateOptions& o) {
  if (!o.plan.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(o.plan));
    return planner::ParsePlanJson(text, o.plan);
  }
  planner::DeploymentSpec spec;
  if (!o.prefill.empty() || !o.decode.empty()) {
    if (o.prefill.empty() || o.decode.empty()) {
      return InvalidArgument("--prefill and --decode go together");
    }
    spec.disaggregated = true;
    ASSIGN_OR_RETURN(spec.prefill, planner::ParseParallel(o.prefill));
    ASSIGN_OR_RETURN(spec.decode, planner::ParseParallel(o.decode));
  } else {
    ASSIGN_OR_RETURN(spec.colocated, planner::ParseParallel(o.colocated));
  }
  spec.num_colocated = o.num_colocated;
  spec.num_prefill = o.num_prefill;
  spec.num_decode = o.num_decode;
  spec.chunked_prefill = o.chunked;
  spec.same_node = o.same_node;
  return spec;
}

void PrintSummaryRow(const char* label, const planner::Summary& s) {
  std::printf("%-14s %10.1f%% %9.3f %9.3f %9.4f %9.4f\n", label, 100 * s.attainment, s.ttft_p50_s,
              s.ttft_p90_s, s.tpot_p50_s, s.tpot_p90_s);
}

void PrintHeader(const char* first) {
  std::printf("%-14s %11s %9s %9s %9s %9s\n", first, "attainment", "TTFT p50", "TTFT p90",
              "TPOT p50", "TPOT p90");
}

// One trace: the deployment, the latency model and the two summaries.
int Replay(const SimulateOptions& o, const planner::PlannerSetup& setup) {
  auto r = planner::ReplayTrace(setup, o.setup.distserve_dir, o.trace);
  if (!r.ok()) {
    std::fprintf(stderr, "pdserve simulate: %s\n", r.status().ToString().c_str());
    return 1;
  }
  if (o.json) {
    std::fputs(planner::ReplaysToJson({*r}, setup.inputs).c_str(), stdout);
    return 0;
  }
  std::printf("trace %s: %zu requests, deployment %s%s\nlatency model: %s\n", r->name.c_str(),
              r->num_requests, r->spec.Describe().c_str(),
              r->assumed ? " (assumed: the file does not record it)" : "",
              (r->spec.disaggregated ? setup.inputs.model : setup.inputs.colocated_model)
                  ->Describe()
                  .c_str());
  std::printf("SLO TTFT %.3g s, TPOT %.3g s\n", setup.inputs.slo.ttft_s, setup.inputs.slo.tpot_s);
  PrintHeader("");
  PrintSummaryRow("simulated", r->simulated);
  PrintSummaryRow("measured", r->measured);
  return 0;
}

// Every trace matching --traces: one table.
int ReplayMany(const SimulateOptions& o, const planner::PlannerSetup& setup) {
  auto names = planner::MatchTraces(o.setup.distserve_dir, o.traces);
  if (!names.ok()) {
    std::fprintf(stderr, "pdserve simulate: %s\n", names.status().ToString().c_str());
    return 1;
  }
  std::vector<planner::TraceReplay> rows;
  for (const std::string& name : *names) {
    auto r = planner::ReplayTrace(setup, o.setup.distserve_dir, name);
    if (!r.ok()) {
      std::fprintf(stderr, "pdserve simulate: %s: %s\n", name.c_str(),
                   r.status().ToString().c_str());
      return 1;
    }
    rows.push_back(std::move(r).value());
  }
  if (o.json) {
    std::fputs(planner::ReplaysToJson(rows, setup.inputs).c_str(), stdout);
    return 0;
  }
  std::printf("SLO TTFT %.3g s, TPOT %.3g s; attainment diff = simulated - measured, in points\n",
              setup.inputs.slo.ttft_s, setup.inputs.slo.tpot_s);
  std::fputs(planner::FormatReplayTable(rows).c_str(), stdout);
  return 0;
}

// The deployment of the flags at each --rate, then its goodput: a table, or JSON with --json.
int RunRates(const SimulateOptions& o, const planner::PlannerSetup& setup) {
  const planner::PlannerInputs& in = setup.inputs;
  auto spec = SpecFromFlags(o);
  if (!spec.ok()) {
    std::fprintf(stderr, "pdserve simulate: %s\n", spec.status().ToString().c_str());
    return 1;
  }
  auto insts = planner::BuildInstances(in, *spec);
  if (!insts.ok()) {
    std::fprintf(stderr, "pdserve simulate: %s\n", insts.status().ToString().c_str());
    return 1;
  }
  const auto unit = planner::MakeUnitRateWorkload(in.lengths, in.arrivals);
  planner::GoodputOptions g;
  g.slo = in.slo;
  g.attainment = in.attainment;
  g.make_scheduler = in.make_scheduler;
  g.min_requests = in.arrivals.num_requests;
  g.min_duration_s = in.min_duration_s;
  const planner::ClusterLinks links{in.hw.intra_node_bw, in.cluster.inter_node_bw,
                                    in.shape.KvBytesPerToken()};
  planner::SimulatedRates out;
  out.deployment = spec->Describe();
  out.disaggregated = spec->disaggregated;
  out.latency_model = (spec->disaggregated ? in.model : in.colocated_model)->Describe();
  for (double rate : o.rates) {
    auto s = planner::AttainmentAt(*insts, links, unit, rate, g);
    if (!s.ok()) {
      std::fprintf(stderr, "pdserve simulate: %s\n", s.status().ToString().c_str());
      return 1;
    }
    out.rates.push_back({rate, *s});
  }
  if (auto goodput = planner::FindGoodput(*insts, links, unit, g); goodput.ok()) {
    out.goodput = *goodput;
  }
  if (o.json) {
    std::fputs(planner::SimulatedRatesToJson(out, in).c_str(), stdout);
    return 0;
  }
  std::printf("%s, %s; %d requests per rate; SLO TTFT %.3g s, TPOT %.3g s\n", in.shape.name.c_str(),
              out.deployment.c_str(), in.arrivals.num_requests, in.slo.ttft_s, in.slo.tpot_s);
  PrintHeader("rate (req/s)");
  for (const planner::SimulatedRate& r : out.rates) {
    PrintSummaryRow(std::to_string(r.rate).substr(0, 8).c_str(), r.summary);
  }
  if (out.goodput) {
    std::printf("goodput at %.0f%% attainment: %.3f req/s\n", 100 * in.attainment, *out.goodput);
  }
  return 0;
}

int RunSimulate(const SimulateOptions& o) {
  if (!o.scenario.empty() && o.json) {
    std::fprintf(stderr,
                 "pdserve simulate: --json goes with --rate, --trace or --traces, "
                 "not --scenario\n");
    return 2;
  }
  if (!o.scenario.empty()) return RunScenario(o);
  auto setup = planner::BuildPlannerSetup(o.setup);
  if (!setup.ok()) {
    std::fprintf(stderr, "pdserve simulate: %s\n", setup.status().ToString().c_str());
    return 1;
  }
  if (!o.trace.empty() && !o.traces.empty()) {
    std::fprintf(stderr, "pdserve simulate: --trace and --traces go alone, not together\n");
    return 2;
  }
  if (!o.trace.empty()) return Replay(o, **setup);
  if (!o.traces.empty()) return ReplayMany(o, **setup);
  return RunRates(o, **setup);
}

}  // namespace

PD_REGISTER_COMMAND(
    simulate, "Simulate a deployment over a workload, or replay an A100 trace", [](CLI::App* app) {
      auto o = std::make_shared<SimulateOptions>();
      AddPlannerSetupOptions(app, &o->setup);
      app->add_option("--plan", o->plan, "a plan JSON from `pdserve plan --out`");
      app->add_option("--colocated", o->colocated, "colocated TPxPP")->capture_default_str();
      app->add_option("--prefill", o->prefill, "prefill TPxPP (disaggregated)");
      app->add_option("--decode", o->decode, "decode TPxPP (disaggregated)");
      app->add_option("--num-colocated", o->num_colocated)->capture_default_str();
      app->add_option("--num-prefill", o->num_prefill)->capture_default_str();
      app->add_option("--num-decode", o->num_decode)->capture_default_str();
      app->add_flag("--chunked", o->chunked, "colocated with chunked prefill");
      app->add_flag("--same-node", o->same_node, "all instances on one node");
      app->add_option("--rate", o->rates, "request rates (req/s)")->capture_default_str();
      app->add_option("--trace", o->trace,
                      "replay a DistServe trace, e.g. vllm-300-3, and compare "
                      "with its measured file");
      app->add_option("--traces", o->traces,
                      "replay every DistServe trace matching 'all' or a glob (e.g. "
                      "'distserve-c21d12-*'): one table, a row per trace");
      app->add_option("--scenario", o->scenario,
                      "r1: DeepSeek-R1 on 8-GPU nodes, colocated TP8 vs 1P:3D vs DP8 decode "
                      "(docs/planner.md); takes the --scenario-* flags");
      app->add_flag("--json", o->json,
                    "print a pdserve-simulate-v1 JSON document (the rates or the traces) "
                    "instead of the tables");
      app->add_option("--scenario-model", o->r1.model)->capture_default_str();
      app->add_option("--scenario-hardware", o->r1.hardware, "h100-80gb | h200-141gb")
          ->capture_default_str();
      app->add_option("--prompt-mean", o->r1.prompt_mean,
                      "scenario prompts: uniform mean/2..3mean/2")
          ->capture_default_str();
      app->add_option("--output-mean", o->r1.output_mean,
                      "scenario outputs: uniform mean/2..3mean/2")
          ->capture_default_str();
      app->add_option("--rate-per-decode-node", o->r1.rate_per_decode_node, "scenario req/s")
          ->capture_default_str();
      app->add_option("--duration", o->r1.duration_s, "scenario arrival span, seconds")
          ->capture_default_str();
      return [o] { return RunSimulate(*o); };
    });

}  // namespace pd::apps
