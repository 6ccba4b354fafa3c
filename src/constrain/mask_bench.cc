#include "constrain/mask_bench.h"

#include <chrono>
#include <random>

#include "constrain/structured_output.h"
#include "constrain/token_texts.h"
#include "engine/engine.h"
#include "engine/sampler.h"

namespace pd::constrain {
namespace {

using Clock = std::chrono::steady_clock;

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

}  // namespace

Result<MaskBenchResult> BenchMask(const model::Tokenizer& tokenizer, const MaskBenchOptions& o) {
  MaskBenchResult r;
  StructuredOutputCompiler compiler(TokenTextsOf(tokenizer));
  const auto t0 = Clock::now();
  auto constraint = compiler.Compile({StructuredOutput::Kind::kJsonSchema, o.schema, "--schema"});
  if (!constraint.ok()) return constraint.status();
  r.compile_ms = Us(t0, Clock::now()) / 1000.0;
  const int32_t eos = tokenizer.eos_token_id().value_or(-1);
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(tokenizer.vocab_size());
  double cold_us = 0, warm_us = 0, plain_us = 0;
  int cold_tokens = 0, warm_tokens = 0;
  for (int req = 0; req < o.num_requests; ++req) {
    engine::SamplingParams p;
    p.temperature = o.temperature;
    p.max_tokens = o.max_tokens;
    p.seed = o.seed + req;
    engine::RequestSampler plain(p, 0, eos);
    p.constraint = *constraint;
    engine::RequestSampler constrained(p, 0, eos);
    for (int i = 0; i < o.max_tokens; ++i) {
      for (float& l : logits) l = normal(rng);
      const auto a = Clock::now();
      const int32_t id = constrained.Sample(logits).token_id;
      const auto b = Clock::now();
      (void)plain.Sample(logits);
      const auto c = Clock::now();
      plain_us += Us(b, c);
      (req == 0 ? cold_us : warm_us) += Us(a, b);
      ++(req == 0 ? cold_tokens : warm_tokens);
      if (id == eos) break;
    }
    if (constrained.constraint_released())
      return Internal("bench-mask: the constraint was released (no token fitted)");
  }
  r.tokens = cold_tokens + warm_tokens;
  r.cold_us_per_token = cold_us / std::max(cold_tokens, 1);
  r.warm_us_per_token = warm_us / std::max(warm_tokens, 1);
  r.plain_us_per_token = plain_us / std::max(r.tokens, 1);
  r.dfa_states = static_cast<const TokenAutomaton&>(**constraint).num_states();
  return r;
}

Result<double> DecodeStepMs(const model::ModelWeights& weights, int tokens, int num_threads) {
  engine::EngineOptions o;
  o.runner.num_threads = num_threads;
  o.runner.num_pages = 64;
  o.scheduler.max_num_seqs = 1;
  o.scheduler.max_model_len = tokens + 16;
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, engine::Engine::Create(weights, o));
  engine::Request r;
  r.id = 1;
  r.prompt_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = tokens;
  r.sampling.ignore_eos = true;
  RETURN_IF_ERROR(engine->AddRequest(r));
  ASSIGN_OR_RETURN(auto first, engine->Step());  // prefill of the prompt less its last token
  (void)first;
  double us = 0;
  int steps = 0;
  while (engine->HasWork()) {
    const auto a = Clock::now();
    ASSIGN_OR_RETURN(auto outputs, engine->Step());
    us += Us(a, Clock::now());
    for (const auto& out : outputs) steps += static_cast<int>(out.new_token_ids.size());
  }
  if (steps == 0) return Internal("bench-mask: no decode step ran");
  return us / steps / 1000.0;
}

}  // namespace pd::constrain
