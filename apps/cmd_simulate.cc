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
#include "planner/setup.h"

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
  std::string trace;  // a DistServe trace name (or workloads/ file) to replay
};

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

int Replay(const SimulateOptions& o, planner::PlannerSetup& setup) {
  const std::string name = planner::TraceNameOf(o.trace);
  const std::string dir = o.setup.distserve_dir + "/real-a100-opt13b-sharegpt/";
  bool assumed = false;
  auto spec = planner::DeploymentFromTraceName(name, &assumed);
  if (!spec.ok()) {
    std::fprintf(stderr, "pdserve simulate: %s\n", spec.status().ToString().c_str());
    return 1;
  }
  auto trace = planner::LoadTraceJson(dir + "workloads/" + name + ".json");
  auto measured = planner::LoadMeasuredJson(dir + "measured/" + name + ".json");
  if (!trace.ok() || !measured.ok()) {
    std::fprintf(stderr, "pdserve simulate: %s\n",
                 (!trace.ok() ? trace.status() : measured.status()).ToString().c_str());
    return 1;
  }
  auto insts = planner::BuildInstances(setup.inputs, *spec);
  if (!insts.ok()) {
    std::fprintf(stderr, "pdserve simulate: %s\n", insts.status().ToString().c_str());
    return 1;
  }
  planner::ClusterLinks links;
  links.intra_node_bw = setup.inputs.hw.intra_node_bw;
  links.inter_node_bw = setup.inputs.cluster.inter_node_bw;
  links.kv_bytes_per_token = setup.inputs.shape.KvBytesPerToken();
  planner::SimOptions sim;
  sim.make_scheduler = setup.inputs.make_scheduler;
  auto r = planner::Simulate(*insts, links, *trace, sim);
  if (!r.ok()) {
    std::fprintf(stderr, "pdserve simulate: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::vector<planner::RequestResult> real;
  for (const auto& m : *measured) {
    planner::RequestResult q;
    q.output_len = m.output_len;
    q.first_token_s = m.ttft_s;
    q.finish_s = m.ttft_s + m.tpot_s * std::max(0, m.output_len - 1);
    real.push_back(q);
  }
  std::printf("trace %s: %zu requests, deployment %s%s\nlatency model: %s\n", name.c_str(),
              trace->size(), spec->Describe().c_str(),
              assumed ? " (assumed: the file does not record it)" : "",
              (spec->disaggregated ? setup.inputs.model : setup.inputs.colocated_model)
                  ->Describe()
                  .c_str());
  std::printf("SLO TTFT %.3g s, TPOT %.3g s\n", setup.inputs.slo.ttft_s, setup.inputs.slo.tpot_s);
  PrintHeader("");
  PrintSummaryRow("simulated", planner::Summarize(r->requests, setup.inputs.slo));
  PrintSummaryRow("measured", planner::Summarize(real, setup.inputs.slo));
  return 0;
}

int RunSimulate(const SimulateOptions& o) {
  auto setup = planner::BuildPlannerSetup(o.setup);
  if (!setup.ok()) {
    std::fprintf(stderr, "pdserve simulate: %s\n", setup.status().ToString().c_str());
    return 1;
  }
  if (!o.trace.empty()) return Replay(o, **setup);
  const planner::PlannerInputs& in = (*setup)->inputs;
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
  std::printf("%s, %s; %d requests per rate; SLO TTFT %.3g s, TPOT %.3g s\n", in.shape.name.c_str(),
              spec->Describe().c_str(), in.arrivals.num_requests, in.slo.ttft_s, in.slo.tpot_s);
  PrintHeader("rate (req/s)");
  for (double rate : o.rates) {
    auto s = planner::AttainmentAt(*insts, links, unit, rate, g);
    if (!s.ok()) {
      std::fprintf(stderr, "pdserve simulate: %s\n", s.status().ToString().c_str());
      return 1;
    }
    PrintSummaryRow(std::to_string(rate).substr(0, 8).c_str(), *s);
  }
  auto goodput = planner::FindGoodput(*insts, links, unit, g);
  if (goodput.ok()) {
    std::printf("goodput at %.0f%% attainment: %.3f req/s\n", 100 * in.attainment, *goodput);
  }
  return 0;
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
      return [o] { return RunSimulate(*o); };
    });

}  // namespace pd::apps
