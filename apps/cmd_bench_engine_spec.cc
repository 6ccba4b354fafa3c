// The rows of `pdserve bench-engine --phase spec` (bench_engine_spec.h); no command of its own.
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "apps/bench_engine_spec.h"
#include "engine/engine.h"
#include "engine/model_runner.h"

namespace pd::apps {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per step of one sequence verifying k drafts after `context` cached tokens.
Result<double> VerifyStepSeconds(engine::ModelRunner& runner, int context, int k, double seconds) {
  const model::ModelConfig& c = runner.config();
  const int page_size = runner.region().spec().page_size;
  std::vector<int32_t> table;
  for (int p = 0; p * page_size < context + k + 1; ++p) table.push_back(p);
  std::vector<int32_t> tokens(k + 1);
  for (int i = 0; i <= k; ++i) tokens[i] = (i * 131 + 7) % c.vocab_size;
  engine::ForwardBatch fb;
  engine::SeqStep step{0, context - 1, tokens, table, true};
  step.num_logits = k + 1;
  fb.seqs.push_back(step);
  engine::ForwardOutput out;
  RETURN_IF_ERROR(runner.Forward(fb, &out));  // warm-up
  int steps = 0;
  const double t0 = Now();
  double elapsed = 0;
  while (steps < 3 || elapsed < seconds) {
    RETURN_IF_ERROR(runner.Forward(fb, &out));
    ++steps;
    elapsed = Now() - t0;
  }
  return elapsed / steps;
}

struct TpotRow {
  double tpot_s = 0;
  int tokens = 0;
  double mean_acceptance_length = 0;  // 0: no drafts
};

// Greedy requests one at a time; TPOT = (last token - first token) / (tokens - 1), averaged.
Result<TpotRow> MeasureTpot(const model::ModelWeights& w, const SpecBenchOptions& o,
                            const engine::SpeculativeConfig& spec) {
  engine::EngineOptions eo;
  eo.runner.num_threads = o.threads;
  eo.runner.kv_cache_bytes = 64ull << 20;
  eo.scheduler.max_model_len = 1024;
  eo.scheduler.enable_prefix_caching = false;  // every request computes its prompt
  eo.speculative = spec;
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, engine::Engine::Create(w, eo));
  std::mt19937 rng(1);
  TpotRow row;
  double sum = 0;
  for (int r = 0; r < o.num_requests; ++r) {
    engine::Request req;
    req.id = r;
    std::vector<int32_t> unit(24);
    for (int32_t& t : unit) t = static_cast<int32_t>(rng() % w.config.vocab_size);
    for (int rep = 0; rep < 3; ++rep)
      req.prompt_ids.insert(req.prompt_ids.end(), unit.begin(), unit.end());
    req.sampling.temperature = 0.0f;
    req.sampling.max_tokens = o.max_tokens;
    req.sampling.ignore_eos = true;
    RETURN_IF_ERROR(engine->AddRequest(req));
    double first = -1, last = -1;
    int n = 0;
    while (engine->HasWork()) {
      ASSIGN_OR_RETURN(std::vector<engine::RequestOutput> outs, engine->Step());
      for (const engine::RequestOutput& out : outs) {
        if (out.new_token_ids.empty()) continue;
        if (first < 0) first = Now();
        last = Now();
        n += static_cast<int>(out.new_token_ids.size());
      }
    }
    if (n > 1) sum += (last - first) / (n - 1);
    row.tokens += n;
  }
  row.tpot_s = sum / o.num_requests;
  const engine::SpecDecodeCounters& c = engine->stats().spec_decode;
  if (c.num_drafts > 0)
    row.mean_acceptance_length = 1.0 + double(c.num_accepted_tokens) / c.num_drafts;
  return row;
}

}  // namespace

Status RunSpecBench(const std::string& name, const model::ModelWeights& w,
                    const SpecBenchOptions& o) {
  engine::ModelRunnerOptions ro;
  ro.num_threads = o.threads;
  ro.kv_cache_bytes = 64ull << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<engine::ModelRunner> runner, engine::ModelRunner::Create(w, ro));
  std::vector<double> step_s;
  for (int k = 0; k <= o.max_k; ++k) {
    ASSIGN_OR_RETURN(double s, VerifyStepSeconds(*runner, o.context, k, o.seconds));
    step_s.push_back(s);
  }
  runner.reset();
  engine::SpeculativeConfig ngram;
  ngram.method = engine::SpecMethod::kNgram;
  ngram.num_speculative_tokens = 3;
  ngram.prompt_lookup_min = 2;
  ngram.prompt_lookup_max = 4;
  ASSIGN_OR_RETURN(TpotRow plain, MeasureTpot(w, o, engine::SpeculativeConfig{}));
  ASSIGN_OR_RETURN(TpotRow spec, MeasureTpot(w, o, ngram));
  if (o.json) {
    std::printf("{\"model\": \"%s\", \"context\": %d, \"verify_ms\": [", name.c_str(), o.context);
    for (size_t k = 0; k < step_s.size(); ++k)
      std::printf("%s%.4f", k == 0 ? "" : ", ", step_s[k] * 1e3);
    std::printf(
        "], \"tpot_ms\": %.4f, \"tpot_ngram_ms\": %.4f, \"ngram_mean_acceptance_length\": "
        "%.3f}\n",
        plain.tpot_s * 1e3, spec.tpot_s * 1e3, spec.mean_acceptance_length);
    return OkStatus();
  }
  std::printf("%-14s %7s %3s %12s %14s\n", "model", "context", "K", "ms/step", "vs decode");
  for (size_t k = 0; k < step_s.size(); ++k) {
    std::printf("%-14s %7d %3zu %12.3f %14.3f\n", name.c_str(), o.context, k, step_s[k] * 1e3,
                step_s[k] / step_s[0]);
  }
  std::printf("\n%-14s %-22s %10s %18s\n", "model", "speculation", "TPOT ms", "mean accept len");
  std::printf("%-14s %-22s %10.3f %18s\n", name.c_str(), "none", plain.tpot_s * 1e3, "-");
  std::printf("%-14s %-22s %10.3f %18.2f\n", name.c_str(), "ngram K=3 (n 2..4)", spec.tpot_s * 1e3,
              spec.mean_acceptance_length);
  return OkStatus();
}

}  // namespace pd::apps
