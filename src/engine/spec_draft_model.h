// Speculative decoding with a draft model (`--speculative-config '{"method": "draft_model",
// "model": DIR, "num_speculative_tokens": K}'`): a second, smaller model with the target's
// tokenizer proposes K tokens autoregressively; the target verifies them in one step.
//
// KV pages. The draft model has its own KV region with exactly as many pages as the target's,
// and a sequence's draft KV lives in the pages of the target's page table: page p of the
// target region and page p of the draft region belong to the same sequence. So one PagePool and
// one page table cover both; allocation, preemption, abort, finish and the prefix cache need
// nothing new, and a page of the budget is a target page plus a draft page: with the budget in
// bytes, num_pages = kv_cache_bytes / (target bytes per page + draft bytes per page)
// (KvPageBytesAllRanks). A draft half the target's depth costs a third of the pages.
//
// What the draft has computed. Each sequence keeps how many of its leading tokens have draft KV.
// After every target step, before the scheduler appends the step's tokens, the draft runs the
// tokens the target computed that it lacks (CatchUp): the prompt chunk by chunk alongside the
// target's chunked prefill, and after a verification the last accepted draft when all were kept.
// Every page the target registers in the prefix cache thus holds the draft's KV too, and a
// sequence admitted with a cached prefix needs no draft prefill for it. A remote-KV sequence
// (its prompt's KV came from a prefill instance) has no draft KV: the draft computes its whole
// prompt at its first decode step. Then Propose runs the token just sampled and K - 1 drafts
// (each a batched one-token step over the drafting sequences) into pages the scheduler reserved
// for them; after verification only the accepted ones stay counted (the rest is overwritten).
//
// Draft tokens. A greedy or constrained request drafts the draft's argmax and is verified by
// equality (spec_decode.h: the target's own token is kept). A sampled request draws draft j from
// q_j, the draft's distribution under the request's temperature/top-k/top-p, with a random
// stream of its own, and VerifyDraft accepts it with RejectionSample against the target's p_j:
// the output follows the target's distribution exactly, with acceptance sum_x min(p, q).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/spec_drafter.h"

namespace pd::engine {

// Bytes one KV page of `config` run with `options` takes over every layer and every TP rank.
Result<size_t> KvPageBytesAllRanks(const model::ModelConfig& config,
                                   const ModelRunnerOptions& options);

// The draft must share the target's tokenizer: the same vocab_size, bos and eos ids.
// InvalidArgument names the field and both values.
Status CheckDraftVocab(const model::ModelConfig& target, const model::ModelConfig& draft);

// A view of `weights` with only its first num_layers decoder layers (and no MTP layers): a draft
// model made from the target itself, sharing its tokenizer and its tensors' memory (`weights`
// must outlive the view). InvalidArgument unless 1 <= num_layers <= the model's layers.
Result<model::ModelWeights> FirstLayersOf(const model::ModelWeights& weights, int num_layers);

// Thread safety: not thread-safe; the engine loop calls every method.
class DraftModel final : public Drafter {
 public:
  // `runner`'s region must have the target's number of pages. `weights` (may be null) is kept
  // alive for the runner when the draft was loaded by the engine.
  static Result<std::unique_ptr<DraftModel>> Create(std::unique_ptr<ModelRunner> runner,
                                                    std::unique_ptr<model::ModelWeights> weights);

  // After the target's step over `batch`, before Scheduler::Update: runs the tokens the target
  // computed (the accepted drafts included) that the draft has not. An error (a bug: bad pages)
  // stops drafting for the sequences of the batch; their outputs are unaffected.
  Status CatchUp(const ScheduledBatch& batch, std::span<const SeqUpdate> updates);
  Status CatchUp(const ScheduledBatch& batch, std::span<const SeqUpdate> updates,
                 const ForwardOutput& target) override {
    (void)target;  // the draft model runs the tokens themselves
    return CatchUp(batch, updates);
  }
  // Proposes request i's drafts into (*drafts)[i] (fewer when the draft's pass fails for it).
  Status Propose(std::span<const DraftRequest> requests,
                 std::vector<std::vector<int32_t>>* drafts) override;
  // q of draft j of the sequence's pending drafts; empty when it was drafted greedily.
  std::span<const double> DraftProbs(int64_t seq_id, int j) const override;
  // The sequence finished or was aborted: its state goes.
  void Forget(int64_t seq_id) override { seqs_.erase(seq_id); }
  // The sequence was preempted: its pages, and so its draft KV, are gone.
  void Reset(int64_t seq_id) override;
  // The draft KV of the sequence's first num_tokens tokens is in its pages already (a prefill
  // instance computed and sent it).
  void MarkComputed(int64_t seq_id, int num_tokens) override {
    seqs_[seq_id].num_computed = num_tokens;
  }
  // Prompt tokens the draft has computed so far, over all sequences (SpecDecodeCounters).
  int64_t num_prompt_tokens() const override { return num_prompt_tokens_; }
  ModelRunner& runner() override { return *runner_; }

 private:
  struct SeqState {
    int num_computed = -1;  // leading tokens with draft KV; -1: set at its next scheduled chunk
    bool broken = false;    // a draft pass failed: no more drafts for it
    std::vector<std::vector<double>> q;       // (num drafts, vocab); empty rows: greedy
    std::unique_ptr<RequestSampler> sampler;  // sampled requests: the draft's random stream
  };
  DraftModel(std::unique_ptr<ModelRunner> runner, std::unique_ptr<model::ModelWeights> weights)
      : weights_(std::move(weights)), runner_(std::move(runner)) {}
  std::unique_ptr<model::ModelWeights> weights_;  // before runner_: outlives it
  std::unique_ptr<ModelRunner> runner_;
  std::unordered_map<int64_t, SeqState> seqs_;
  ForwardBatch batch_;  // reused per pass
  ForwardOutput out_;
  std::vector<std::vector<int32_t>> tokens_;  // per batch row: the tokens it runs
  int64_t num_prompt_tokens_ = 0;
};

// Engine::Create for method "draft_model": loads speculative.model (unless draft_weights is
// given), checks the tokenizer and positions, splits the page budget and makes both runners.
Result<std::unique_ptr<Engine>> CreateDraftModelEngine(const model::ModelWeights& weights,
                                                       const EngineOptions& options);

// Position j of a verification with a full draft distribution q (draft_model, sampled): p is the
// target's under the request's sampling parameters, and RejectionSample (two draws of the
// request's stream) keeps `draft` or resamples. Logprobs are the target's.
SampleResult VerifyDraft(RequestSampler& sampler, std::span<const float> logits,
                         std::span<const double> q, int32_t draft, bool* accepted);

}  // namespace pd::engine
