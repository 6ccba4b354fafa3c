// The rows of `pdserve bench-engine --phase spec` (bench_engine_spec.h); no command of its own.
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "apps/bench_engine_spec.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/spec_draft_model.h"

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
  double acceptance_rate = 0;         // accepted / drafted tokens
};

// Greedy requests one at a time; TPOT = (last token - first token) / (tokens - 1), averaged.
Result<TpotRow> MeasureTpot(const model::ModelWeights& w, const SpecBenchOptions& o,
                            const engine::SpeculativeConfig& spec,
                            const model::ModelWeights* draft = nullptr) {
  engine::EngineOptions eo;
  eo.runner.num_threads = o.threads;
  eo.runner.kv_cache_bytes = 64ull << 20;
  eo.scheduler.max_model_len = 1024;
  eo.scheduler.enable_prefix_caching = false;  // every request computes its prompt
  eo.speculative = spec;
  eo.draft_weights = draft;
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
  if (c.num_draft_tokens > 0)
    row.acceptance_rate = double(c.num_accepted_tokens) / c.num_draft_tokens;
  return row;
}

// The draft_model row: a checkpoint, or a view of the target's first layers (spec_draft_model.h).
Result<TpotRow> MeasureDraftTpot(const model::ModelWeights& w, const SpecBenchOptions& o,
                                 std::string* label) {
  engine::SpeculativeConfig spec;
  spec.method = engine::SpecMethod::kDraftModel;
  spec.num_speculative_tokens = o.draft_k;
  if (o.draft_layers > 0) {
    ASSIGN_OR_RETURN(model::ModelWeights view, engine::FirstLayersOf(w, o.draft_layers));
    spec.model = "first " + std::to_string(o.draft_layers) + " layers";
    *label = "draft " + std::to_string(o.draft_layers) + "/" + std::to_string(w.config.num_layers) +
             " layers K=" + std::to_string(o.draft_k);
    return MeasureTpot(w, o, spec, &view);
  }
  spec.model = o.draft_model_dir;
  *label = "draft_model K=" + std::to_string(o.draft_k);
  return MeasureTpot(w, o, spec);
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
  const bool with_draft = o.draft_layers > 0 || !o.draft_model_dir.empty();
  TpotRow draft;
  std::string draft_label;
  if (with_draft) {
    ASSIGN_OR_RETURN(draft, MeasureDraftTpot(w, o, &draft_label));
  }
  // The mtp row: a deepseek_v3 checkpoint's own MTP layer drafting (spec_mtp.h).
  const bool with_mtp = !w.mtp.empty();
  const std::string mtp_label = "mtp K=" + std::to_string(o.draft_k);
  TpotRow mtp;
  if (with_mtp) {
    engine::SpeculativeConfig mtp_spec;
    mtp_spec.method = engine::SpecMethod::kMtp;
    mtp_spec.num_speculative_tokens = o.draft_k;
    ASSIGN_OR_RETURN(mtp, MeasureTpot(w, o, mtp_spec));
  }
  if (o.json) {
    std::printf("{\"model\": \"%s\", \"context\": %d, \"verify_ms\": [", name.c_str(), o.context);
    for (size_t k = 0; k < step_s.size(); ++k)
      std::printf("%s%.4f", k == 0 ? "" : ", ", step_s[k] * 1e3);
    std::printf(
        "], \"tpot_ms\": %.4f, \"tpot_ngram_ms\": %.4f, \"ngram_mean_acceptance_length\": "
        "%.3f, \"ngram_acceptance_rate\": %.3f",
        plain.tpot_s * 1e3, spec.tpot_s * 1e3, spec.mean_acceptance_length, spec.acceptance_rate);
    if (with_draft) {
      std::printf(
          ", \"draft\": \"%s\", \"tpot_draft_ms\": %.4f, \"draft_mean_acceptance_length\": "
          "%.3f, \"draft_acceptance_rate\": %.3f",
          draft_label.c_str(), draft.tpot_s * 1e3, draft.mean_acceptance_length,
          draft.acceptance_rate);
    }
    if (with_mtp) {
      std::printf(
          ", \"mtp\": \"%s\", \"tpot_mtp_ms\": %.4f, \"mtp_mean_acceptance_length\": %.3f, "
          "\"mtp_acceptance_rate\": %.3f",
          mtp_label.c_str(), mtp.tpot_s * 1e3, mtp.mean_acceptance_length, mtp.acceptance_rate);
    }
    std::printf("}\n");
    return OkStatus();
  }
  std::printf("%-14s %7s %3s %12s %14s\n", "model", "context", "K", "ms/step", "vs decode");
  for (size_t k = 0; k < step_s.size(); ++k) {
    std::printf("%-14s %7d %3zu %12.3f %14.3f\n", name.c_str(), o.context, k, step_s[k] * 1e3,
                step_s[k] / step_s[0]);
  }
  std::printf("\n%-14s %-26s %10s %16s %12s\n", "model", "speculation", "TPOT ms",
              "mean accept len", "accept rate");
  std::printf("%-14s %-26s %10.3f %16s %12s\n", name.c_str(), "none", plain.tpot_s * 1e3, "-", "-");
  std::printf("%-14s %-26s %10.3f %16.2f %12.2f\n", name.c_str(), "ngram K=3 (n 2..4)",
              spec.tpot_s * 1e3, spec.mean_acceptance_length, spec.acceptance_rate);
  if (with_draft) {
    std::printf("%-14s %-26s %10.3f %16.2f %12.2f\n", name.c_str(), draft_label.c_str(),
                draft.tpot_s * 1e3, draft.mean_acceptance_length, draft.acceptance_rate);
  }
  if (with_mtp) {
    std::printf("%-14s %-26s %10.3f %16.2f %12.2f\n", name.c_str(), mtp_label.c_str(),
                mtp.tpot_s * 1e3, mtp.mean_acceptance_length, mtp.acceptance_rate);
  }
  return OkStatus();
}

}  // namespace pd::apps
