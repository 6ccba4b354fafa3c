// Test helpers: a fake ModelRunner whose logits depend on the whole context as stored in its paged
// KV region, so any mistake in page tables, chunk positions or recomputation changes the tokens.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/check.h"
#include "engine/engine.h"
#include "engine/model_runner.h"

namespace pd::engine::testing {

// Each KV entry stores its token id; logits are a hash of every (position, token) of the context,
// read back through the page table.
class FakeRunner final : public ModelRunner {
 public:
  struct Options {
    int vocab_size = 64;
    int eos_token_id = -1;
    int page_size = 4;
    int num_pages = 64;
    int fail_on_step = -1;  // Forward returns an error at this step (0-based)
    // > 0: the token copy_period positions back gets +100 (greedy then repeats the context with
    // this period: n-gram drafts are accepted).
    int copy_period = 0;
    int hidden_size = 0;  // the config's (what a prefilled hidden state must hold)
  };

  static std::unique_ptr<FakeRunner> Make(const Options& o) {
    KvCacheSpec spec;
    spec.num_layers = 1;
    spec.num_kv_heads = 1;
    spec.head_dim = 1;
    spec.page_size = o.page_size;
    spec.dtype = KvDType::kF32;
    auto region = KvRegion::Create(spec, o.num_pages);
    PD_CHECK(region.ok()) << region.status().ToString();
    auto runner = std::unique_ptr<FakeRunner>(new FakeRunner());
    runner->options_ = o;
    runner->region_ = std::move(region).value();
    runner->config_.vocab_size = o.vocab_size;
    runner->config_.eos_token_id = o.eos_token_id;
    runner->config_.max_position_embeddings = 1 << 20;
    runner->config_.num_layers = 1;
    runner->config_.hidden_size = o.hidden_size;
    return runner;
  }

  // The hash the logits come from, over a whole context.
  static uint64_t ContextHash(const std::vector<int32_t>& tokens) {
    uint64_t h = 1469598103934665603ull;
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
      h = (h ^ (static_cast<uint64_t>(tokens[pos]) * 1000003u + pos)) * 1099511628211ull;
    }
    return h;
  }
  static void LogitsFor(uint64_t h, int vocab, std::vector<float>* logits) {
    logits->resize(vocab);
    for (int v = 0; v < vocab; ++v) {
      uint64_t x = (h + static_cast<uint64_t>(v) * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
      (*logits)[v] = static_cast<float>((x >> 40) % 10000) / 1000.0f;
    }
  }
  // The logits after a whole context.
  static void ContextLogits(const std::vector<int32_t>& context, int vocab, int copy_period,
                            std::vector<float>* logits) {
    LogitsFor(ContextHash(context), vocab, logits);
    const int n = static_cast<int>(context.size());
    if (copy_period > 0 && n >= copy_period) (*logits)[context[n - copy_period]] += 100.0f;
  }
  // Greedy tokens of one request run alone, without any cache: the oracle.
  static std::vector<int32_t> GreedyOracle(std::vector<int32_t> tokens, int vocab, int max_tokens,
                                           int eos = -1, int copy_period = 0) {
    std::vector<int32_t> out;
    std::vector<float> logits;
    for (int i = 0; i < max_tokens; ++i) {
      ContextLogits(tokens, vocab, copy_period, &logits);
      int32_t tok =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(tok);
      tokens.push_back(tok);
      if (tok == eos) break;
    }
    return out;
  }

  Status Forward(const ForwardBatch& batch, ForwardOutput* out) override {
    if (static_cast<int>(steps_done_) == options_.fail_on_step) {
      ++steps_done_;
      return Internal("injected forward failure");
    }
    out->logits.assign(batch.seqs.size(), {});
    out->last_hidden.assign(batch.seqs.size(), {});
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const SeqStep& s = batch.seqs[i];
      const int end = s.start_pos + static_cast<int>(s.token_ids.size());
      PD_CHECK(static_cast<int>(s.page_table.size()) * options_.page_size >= end);
      for (size_t k = 0; k < s.token_ids.size(); ++k) {
        *Slot(s.page_table, s.start_pos + static_cast<int>(k)) = static_cast<float>(s.token_ids[k]);
      }
      max_batch_tokens_ = std::max<int>(max_batch_tokens_, static_cast<int>(s.token_ids.size()));
      if (!s.compute_logits) continue;
      PD_CHECK(s.num_logits >= 1 && s.num_logits <= static_cast<int>(s.token_ids.size()));
      std::vector<int32_t> context(end);
      for (int pos = 0; pos < end; ++pos) {
        context[pos] = static_cast<int32_t>(*Slot(s.page_table, pos));
      }
      // One row per requested position: the logits after each of the last num_logits tokens.
      std::vector<float> row;
      for (int r = s.num_logits - 1; r >= 0; --r) {
        ContextLogits(std::vector<int32_t>(context.begin(), context.end() - r), options_.vocab_size,
                      options_.copy_period, &row);
        out->logits[i].insert(out->logits[i].end(), row.begin(), row.end());
      }
    }
    ++steps_done_;
    return OkStatus();
  }
  const model::ModelConfig& config() const override { return config_; }
  KvRegion& region() override { return *region_; }
  const LayerProgress& progress() const override { return progress_; }
  uint64_t steps_done() const override { return steps_done_; }
  int max_seq_tokens_in_a_step() const { return max_batch_tokens_; }

 private:
  FakeRunner() = default;
  float* Slot(std::span<const int32_t> page_table, int pos) {
    int page = page_table[pos / options_.page_size];
    PD_CHECK(page >= 0 && page < region_->num_pages());
    return reinterpret_cast<float*>(region_->Block(0, page)) +
           region_->spec().ElemOffset(pos % options_.page_size, 0, 0);
  }

  Options options_;
  std::unique_ptr<KvRegion> region_;
  model::ModelConfig config_;
  LayerProgress progress_;
  uint64_t steps_done_ = 0;
  int max_batch_tokens_ = 0;
};

inline EngineOptions FakeEngineOptions(int budget = 64, int max_seqs = 4) {
  EngineOptions o;
  o.scheduler.max_num_batched_tokens = budget;
  o.scheduler.max_num_seqs = max_seqs;
  o.scheduler.max_model_len = 256;
  return o;
}

// A greedy request (temperature 0) for `max_tokens` new tokens after `prompt`.
inline Request Greedy(int64_t id, std::vector<int32_t> prompt, int max_tokens) {
  Request r;
  r.id = id;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  return r;
}

}  // namespace pd::engine::testing
