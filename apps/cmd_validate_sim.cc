// `pdserve validate-sim`: the cluster simulator against the real system on this machine
// (planner/validate_sim.h says what it runs and compares).
//
//   pdserve validate-sim --model models/qwen3-small --profile FILE [--rate 2 --rate 4]
//       [--rounds 5] [--max-prompts 300] [--out FILE]
#include <cstdio>
#include <memory>

#include "apps/command.h"
#include "apps/matmul_flag.h"
#include "planner/validate_sim.h"

namespace pd::apps {
namespace {

CommandRunner SetUpValidate(CLI::App* app) {
  auto o = std::make_shared<planner::ValidateSimOptions>();
  app->add_option("--model", o->model, "model directory")->required();
  app->add_option("--profile,--latency-model", o->profile,
                  "latency model from `pdserve profile` (same model, threads and --matmul)")
      ->required();
  app->add_option("--threads", o->threads, "compute threads per instance")->capture_default_str();
  app->add_option("--rate", o->rates, "request rates (default: 20/40/60% of capacity)");
  app->add_option("--port", o->port, "router port (instances: P+1, P+2)")->capture_default_str();
  app->add_option("--seed", o->seed)->capture_default_str();
  app->add_option("--input-len", o->input_len, "dataset: prompt tokens")->capture_default_str();
  app->add_option("--output-len", o->output_len, "dataset: output tokens")->capture_default_str();
  app->add_option("--range-ratio", o->range_ratio, "dataset: length spread")->capture_default_str();
  app->add_option("--max-prompts", o->max_prompts, "requests a round at most")
      ->capture_default_str();
  app->add_option("--rounds", o->rounds, "bench rounds per rate")->capture_default_str();
  app->add_option("--ttft", o->ttft_slo_s, "TTFT SLO, s (default: 3x the idle TTFT)");
  app->add_option("--tpot", o->tpot_slo_s, "TPOT SLO, s (default: the batch-8 probe's TPOT)");
  app->add_option("--max-num-seqs", o->max_num_seqs)->capture_default_str();
  app->add_option("--max-num-batched-tokens", o->max_num_batched_tokens)->capture_default_str();
  AddMatmulFlag(app, &o->matmul, "f32 | bf16: the instances' --matmul");
  app->add_flag("!--no-pin", o->pin_cores, "do not pin the instances to cores");
  app->add_flag("!--no-corun", o->corun, "do not measure or simulate co-run slowdowns");
  app->add_option("--trace", o->trace, "pdserve up --trace FILE")->capture_default_str();
  app->add_option("--up-log", o->up_log, "where pdserve up's output goes")->capture_default_str();
  app->add_option("--out", o->out, "also write the comparison as JSON");
  return [o] {
    const Status s = planner::RunValidateSim(*o);
    if (s.ok()) return 0;
    std::fprintf(stderr, "pdserve validate-sim: %s\n", s.ToString().c_str());
    return 1;
  };
}

// The name has a dash, so register directly rather than through PD_REGISTER_COMMAND.
const bool kRegistered = RegisterCommand(
    {"validate-sim", "Simulator against the real system: pdserve bench vs the simulator",
     SetUpValidate});

}  // namespace
}  // namespace pd::apps
