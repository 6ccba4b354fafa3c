// Speculative decoding with DeepSeek-V3's multi-token-prediction layer (`--speculative-config
// '{"method": "mtp", "num_speculative_tokens": K}'`, vLLM's "deepseek_mtp"): the checkpoint's
// MTP layer model.layers.{num_hidden_layers} (CreateMtpRunner, model_runner.h) drafts from the
// target's hidden state and the embedding of the token after it.
//
// What the MTP layer computes. Its position t reads h_t, the target's hidden state at t after the
// target's final norm, and token_{t+1}; it writes its own latent KV at t and its logits predict
// token_{t+2}. So after a target step that computed positions [s, e) and kept them all (a prompt
// chunk, or a verification whose accepted drafts end at e - 1), the MTP layer runs positions
// [s, e) with tokens s+1 .. e, the last of which is the token the step sampled (CatchUp): it
// keeps up with chunked prefill, and its logits at e - 1 give draft 1 at once. Draft j > 1 reuses
// the one MTP layer on its own output (vLLM's chaining): position e + j - 2 reads draft j - 1 and
// the MTP layer's hidden state at e + j - 3 (before shared_head.norm) in place of the target's.
// Those chained positions' KV is scratch: the next CatchUp overwrites it with the target's hidden
// states of the tokens kept.
//
// Across the split. A prefill instance computes the prompt less its last token, P - 1 tokens:
// its MTP layer runs positions 0 .. P - 3 with them (a prefill-only sequence never samples), and
// the messenger sends that KV with the target's. Position P - 2 needs token P - 1, which only
// decode has: MarkComputed(P - 1) counts P - 2 positions, and the first decode step (the target at
// P - 1) runs position P - 2 from the prefilled hidden state (SetPrefilledHidden) and P - 1 from
// its own, so it drafts at once. Without the prefilled hidden state, or with no MTP KV from the
// prefill instance, a remote-KV sequence does not draft.
//
// KV pages. As a draft model's (spec_draft_model.h): the MTP layer's one-layer latent region has
// the target's page count, and page p of it belongs to whoever owns target page p. A page of the
// budget is a target page plus an MTP page. A sequence admitted with a cached prefix uses the MTP
// KV the cached pages hold: exact, except at the prefix's last position, which was computed with
// the token that followed it in the sequence that wrote it (drafts may then differ, outputs never
// do).
//
// The MTP layer runs on the target's tensor-parallel ranks (its own region per rank, as the
// target's, so a transfer moves it rank by rank); the target's hidden state, and so the MTP
// layer's input, is replicated after the final all-reduce.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/spec_drafter.h"

namespace pd::engine {

// Thread safety: not thread-safe; the engine loop calls every method.
class MtpDrafter final : public Drafter {
 public:
  // `runner` is an MTP runner (CreateMtpRunner) whose region has the target's number of pages.
  static Result<std::unique_ptr<MtpDrafter>> Create(std::unique_ptr<ModelRunner> runner);

  bool needs_target_hidden() const override { return true; }
  Status CatchUp(const ScheduledBatch& batch, std::span<const SeqUpdate> updates,
                 const ForwardOutput& target) override;
  Status Propose(std::span<const DraftRequest> requests,
                 std::vector<std::vector<int32_t>>* drafts) override;
  std::span<const double> DraftProbs(int64_t seq_id, int j) const override;
  void Forget(int64_t seq_id) override { seqs_.erase(seq_id); }
  void Reset(int64_t seq_id) override;
  // The prefill instance computed the MTP layer's KV at the first num_tokens - 1 positions (the
  // sequence's first num_tokens tokens are the prompt less its last token).
  void MarkComputed(int64_t seq_id, int num_tokens) override;
  void SetPrefilledHidden(int64_t seq_id, std::span<const float> hidden) override;
  // Prompt positions the MTP layer has computed so far, over all sequences.
  int64_t num_prompt_tokens() const override { return num_prompt_tokens_; }
  ModelRunner& runner() override { return *runner_; }

 private:
  struct SeqState {
    // Leading positions whose MTP KV was computed from the target's hidden state; -1: set at the
    // sequence's next scheduled step.
    int num_computed = -1;
    bool broken = false;             // a pass failed, or no MTP KV for its prompt: no drafts
    std::vector<float> next_logits;  // (vocab) at position num_computed - 1: draft 1; or empty
    std::vector<float> next_hidden;  // (hidden) the MTP layer's output there
    // (hidden) a remote-KV sequence's prefilled hidden state: h at position num_computed, which
    // its first catch-up runs before the target's positions.
    std::vector<float> prefilled_hidden;
    std::vector<std::vector<double>> q;       // (num drafts, vocab); empty rows: greedy
    std::unique_ptr<RequestSampler> sampler;  // sampled requests: the drafter's random stream
  };
  explicit MtpDrafter(std::unique_ptr<ModelRunner> runner) : runner_(std::move(runner)) {}
  // Adds the catch-up step of batch row `row` (ScheduledSeq s) to batch_, or returns false.
  bool AddCatchUp(const ScheduledSeq& s, const SeqUpdate* update,
                  const std::vector<float>& target_hidden, SeqState& st);

  std::unique_ptr<ModelRunner> runner_;
  std::unordered_map<int64_t, SeqState> seqs_;
  ForwardBatch batch_;  // reused per pass
  ForwardOutput out_;
  std::vector<std::vector<int32_t>> tokens_;  // per batch row: the tokens it runs
  std::vector<std::vector<float>> inputs_;    // per batch row: the prefilled then target rows
  int64_t num_prompt_tokens_ = 0;
};

// Engine::Create for method "mtp": checks the checkpoint has its MTP layer (naming
// num_nextn_predict_layers when not), splits the page budget and makes both runners.
Result<std::unique_ptr<Engine>> CreateMtpEngine(const model::ModelWeights& weights,
                                                const EngineOptions& options);

}  // namespace pd::engine
