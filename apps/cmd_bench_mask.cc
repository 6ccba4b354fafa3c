// pdserve bench-mask: the cost of structured outputs per token beside the decode step.
//
//   pdserve bench-mask --tokenizer DIR --schema FILE [--model DIR] [--max-tokens 256]
//                      [--requests 4] [--temperature 0] [--threads 0]
//
// Prints the schema's compile time, the constrained sampler's microseconds per token on the first
// request (token masks computed as states are first reached) and on later ones (masks cached),
// the unconstrained sampler's on the same logits, and with --model the mean decode step time of
// that model at batch 1. Exit codes: 0 done, 1 bad input.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "apps/command.h"
#include "constrain/mask_bench.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace pd::apps {
namespace {

struct BenchMaskFlags {
  std::string tokenizer;
  std::string schema_file;
  std::string model;
  int max_tokens = 256;
  int requests = 4;
  float temperature = 0.0f;
  int threads = 0;
};

int RunBenchMask(const BenchMaskFlags& f) {
  std::ifstream in(f.schema_file);
  if (!in) {
    std::fprintf(stderr, "bench-mask: --schema: cannot read %s\n", f.schema_file.c_str());
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  auto tokenizer = model::Tokenizer::Load(f.tokenizer);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "bench-mask: --tokenizer: %s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  constrain::MaskBenchOptions o;
  o.schema = text.str();
  o.max_tokens = f.max_tokens;
  o.num_requests = f.requests;
  o.temperature = f.temperature;
  auto r = constrain::BenchMask(**tokenizer, o);
  if (!r.ok()) {
    std::fprintf(stderr, "bench-mask: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("vocab %d, schema %s: compile %.2f ms, %d tokens, %d DFA states\n",
              (*tokenizer)->vocab_size(), f.schema_file.c_str(), r->compile_ms, r->tokens,
              r->dfa_states);
  std::printf(
      "sample us/token: constrained first request %.1f, later requests %.1f, "
      "unconstrained %.1f\n",
      r->cold_us_per_token, r->warm_us_per_token, r->plain_us_per_token);
  if (!f.model.empty()) {
    auto weights = model::LoadModelWeights(f.model);
    if (!weights.ok()) {
      std::fprintf(stderr, "bench-mask: --model: %s\n", weights.status().ToString().c_str());
      return 1;
    }
    const int threads =
        f.threads > 0 ? f.threads : static_cast<int>(std::thread::hardware_concurrency());
    auto step_ms = constrain::DecodeStepMs(*weights, 32, threads);
    if (!step_ms.ok()) {
      std::fprintf(stderr, "bench-mask: %s\n", step_ms.status().ToString().c_str());
      return 1;
    }
    std::printf(
        "decode step (batch 1, %d threads): %.2f ms; mask overhead (later requests) "
        "%.2f%% of a step\n",
        threads, *step_ms,
        100.0 * (r->warm_us_per_token - r->plain_us_per_token) / (*step_ms * 1000.0));
  }
  return 0;
}

// The name has a dash, so register directly rather than through PD_REGISTER_COMMAND.
const bool kRegistered = RegisterCommand(
    {"bench-mask", "Structured outputs: mask cost per token beside a decode step",
     [](CLI::App* app) {
       auto f = std::make_shared<BenchMaskFlags>();
       app->add_option("--tokenizer", f->tokenizer, "dir with tokenizer.json")->required();
       app->add_option("--schema", f->schema_file, "JSON schema file")->required();
       app->add_option("--model", f->model, "model dir for the decode step");
       app->add_option("--max-tokens", f->max_tokens)->check(CLI::Range(1, 1 << 16));
       app->add_option("--requests", f->requests)->check(CLI::Range(2, 1000));
       app->add_option("--temperature", f->temperature)->check(CLI::Range(0.0, 2.0));
       app->add_option("--threads", f->threads)->check(CLI::Range(0, 1024));
       return [f] { return RunBenchMask(*f); };
     }});

}  // namespace
}  // namespace pd::apps
