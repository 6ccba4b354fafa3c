// `pdserve plan`: the placement that maximises goodput per device (DistServe's search on the
// simulator), beside the colocated baseline.
#include <cstdio>
#include <memory>

#include "apps/command.h"
#include "common/file_util.h"
#include "planner/setup.h"

namespace pd::apps {
namespace {

struct PlanOptions {
  planner::SetupOptions setup;
  bool json = false;
  std::string out;
};

void AddSetupOptions(CLI::App* app, planner::SetupOptions* o) {
  app->add_option("--model", o->model,
                  "opt-13b | opt-66b | opt-175b | deepseek-r1 | qwen3-coder-480b-a35b | a HF model "
                  "directory")
      ->capture_default_str();
  app->add_option("--hardware", o->hardware, "a100-80gb | h100-80gb | h200-141gb | cpu")
      ->capture_default_str();
  app->add_option("--profile,--latency-model", o->profile,
                  "auto | analytical | a profile JSON (pdserve profile or DistServe's)")
      ->capture_default_str();
  app->add_option("--colocated-profile", o->colocated_profile,
                  "latency model of the colocated baseline (default: auto pairs with vLLM's "
                  "A100 profile, else --profile)");
  app->add_option("--distserve-dir", o->distserve_dir, "DistServe reference data")
      ->capture_default_str();
  app->add_option("--lengths", o->lengths, "prompt_len,output_len CSV (default: ShareGPT sample)");
  app->add_option("--nodes", o->nodes)->capture_default_str();
  app->add_option("--devices-per-node", o->devices_per_node)->capture_default_str();
  app->add_option("--inter-node-gbps", o->inter_node_gbps)->capture_default_str();
  app->add_option("--ttft", o->ttft_s, "TTFT SLO, seconds")->capture_default_str();
  app->add_option("--tpot", o->tpot_s, "TPOT SLO, seconds")->capture_default_str();
  app->add_option("--attainment", o->attainment, "SLO attainment target")->capture_default_str();
  app->add_option("--requests", o->num_requests, "requests per simulated instance")
      ->capture_default_str();
  app->add_option("--cv", o->cv, "burstiness: inter-arrival CV (1 = Poisson)")
      ->capture_default_str();
  app->add_option("--seed", o->seed)->capture_default_str();
  app->add_option("--max-pp", o->max_pp)->capture_default_str();
  app->add_option("--scheduler", o->scheduler,
                  "native | engine (engine::Scheduler itself, one batch in flight)")
      ->capture_default_str();
  app->add_option("--threads", o->threads, "simulation threads (0: one per core)")
      ->capture_default_str();
  app->add_option("--device-threads", o->device_threads,
                  "CPU threads per device (rank) written into the plan as each instance's "
                  "\"threads\" (default: the pdserve profile's threads; on --hardware cpu the "
                  "cores split over --devices-per-node)")
      ->capture_default_str();
  app->add_flag("--chunked-colocated", o->chunked_colocated,
                "colocated baseline uses chunked prefill");
}

std::string Par(const planner::PhaseChoice& c) {
  return "TP" + std::to_string(c.par.tp) + " PP" + std::to_string(c.par.pp);
}

void PrintHuman(const planner::PlanReport& r, const planner::PlannerInputs& in) {
  std::printf(
      "model %s on %d x %d %s (%.0f Gbps between nodes); SLO TTFT %.3g s, TPOT %.3g s "
      "at %.0f%%\nlatency model: %s\n\n",
      in.shape.name.c_str(), in.cluster.num_nodes, in.cluster.devices_per_node, in.hw.name.c_str(),
      in.cluster.inter_node_bw * 8 / 1e9, in.slo.ttft_s, in.slo.tpot_s, in.attainment * 100,
      in.model->Describe().c_str());
  if (in.threads_per_device > 0) {
    std::printf(
        "a device is %d CPU compute thread(s): the plan's \"threads\" per instance rank\n\n",
        in.threads_per_device);
  }
  std::printf("%-26s %-30s %8s %10s %12s\n", "deployment", "unit", "devices", "goodput",
              "per device");
  auto row = [](const char* name, const planner::Plan& p) {
    std::string unit;
    if (p.mode == "colocated") {
      unit = std::to_string(p.num_colocated) + " x colocated " + Par(p.colocated);
    } else {
      unit = std::to_string(p.num_prefill) + "P " + Par(p.prefill) + " + " +
             std::to_string(p.num_decode) + "D " + Par(p.decode);
    }
    std::printf("%-26s %-30s %8d %8.3f/s %10.4f/s\n", name, unit.c_str(), p.unit_devices, p.goodput,
                p.per_device());
  };
  row("best (disaggregated)", r.best);
  row("  high node affinity", r.high);
  if (r.low.unit_devices > 0) row("  low node affinity", r.low);
  row("colocated baseline", r.colocated);
  std::printf("\nper-instance goodput per device (req/s/device) by TPxPP:\n");
  auto table = [](const char* name, const std::vector<planner::PhaseChoice>& t) {
    std::printf("  %-10s", name);
    for (const auto& c : t) {
      std::printf(" %dx%d:%.3f", c.par.tp, c.par.pp, c.per_device());
    }
    std::printf("\n");
  };
  table("prefill", r.prefill_table);
  table("decode", r.decode_table);
  table("colocated", r.colocated_table);
  if (r.colocated.per_device() > 0) {
    std::printf(
        "\ngoodput per device: %.2fx the colocated baseline; the cluster holds %d units "
        "of the best plan\n",
        r.best.per_device() / r.colocated.per_device(), r.best.replicas);
  }
}

int RunPlan(const PlanOptions& o) {
  auto setup = planner::BuildPlannerSetup(o.setup);
  if (!setup.ok()) {
    std::fprintf(stderr, "pdserve plan: %s\n", setup.status().ToString().c_str());
    return 1;
  }
  const planner::PlannerInputs& in = (*setup)->inputs;
  auto report = planner::SearchPlacement(in);
  if (!report.ok()) {
    std::fprintf(stderr, "pdserve plan: %s\n", report.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "pdserve plan: searched in %.2f s (phase tables %.2f s, units %.2f s)\n",
               report->tables_wall_s + report->units_wall_s, report->tables_wall_s,
               report->units_wall_s);
  const std::string json = planner::PlanToJson(*report, in);
  if (!o.out.empty()) {
    if (Status s = WriteStringToFile(o.out, json); !s.ok()) {
      std::fprintf(stderr, "pdserve plan: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (o.json) {
    std::fputs(json.c_str(), stdout);
  } else {
    PrintHuman(*report, in);
  }
  return 0;
}

}  // namespace

void AddPlannerSetupOptions(CLI::App* app, planner::SetupOptions* o) { AddSetupOptions(app, o); }

PD_REGISTER_COMMAND(plan, "Search the deployment that maximises goodput per device",
                    [](CLI::App* app) {
                      auto opts = std::make_shared<PlanOptions>();
                      AddSetupOptions(app, &opts->setup);
                      app->add_flag("--json", opts->json, "print the plan as JSON");
                      app->add_option("--out", opts->out, "also write the plan JSON here");
                      return [opts] { return RunPlan(*opts); };
                    });

}  // namespace pd::apps
