// What the engine asks of a speculative proposer that runs a model of its own: the draft model
// (spec_draft_model.h) and DeepSeek's MTP layer (spec_mtp.h). Both keep their KV in a region with
// the target's page count, addressed through the target's page tables, so the scheduler's pages
// cover them; both draft greedily or from their own distribution q (recorded for VerifyDraft).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"

namespace pd::engine {

// One sequence that drafts in Propose.
struct DraftRequest {
  const Sequence* seq = nullptr;  // running, its next step a decode
  int num_drafts = 0;             // its page table covers seq->num_tokens() + num_drafts - 1
  const SamplingParams* sampling = nullptr;
  uint64_t seed = 0;  // the draft's own random stream (sampled requests)
};

// Thread safety: not thread-safe; the engine loop calls every method.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Whether CatchUp reads the target's hidden state at every computed token: the engine then
  // sets ForwardBatch::all_hidden on its steps.
  virtual bool needs_target_hidden() const { return false; }
  // After the target's step over `batch` (its output `target`), before Scheduler::Update: brings
  // the drafter's KV up to what the target computed and kept. An error (a bug: bad pages) stops
  // drafting for the sequences of the batch; their outputs are unaffected.
  virtual Status CatchUp(const ScheduledBatch& batch, std::span<const SeqUpdate> updates,
                         const ForwardOutput& target) = 0;
  // Proposes request i's drafts into (*drafts)[i] (fewer when the drafter fails for it).
  virtual Status Propose(std::span<const DraftRequest> requests,
                         std::vector<std::vector<int32_t>>* drafts) = 0;
  // q of draft j of the sequence's pending drafts; empty when it was drafted greedily.
  virtual std::span<const double> DraftProbs(int64_t seq_id, int j) const = 0;
  // The sequence finished or was aborted: its state goes.
  virtual void Forget(int64_t seq_id) = 0;
  // The sequence was preempted: its pages, and so the drafter's KV, are gone.
  virtual void Reset(int64_t seq_id) = 0;
  // A remote-KV sequence: the prefill instance computed the drafter's KV over its first
  // num_tokens tokens (the prompt less its last token) and sent it with the target's.
  virtual void MarkComputed(int64_t seq_id, int num_tokens) = 0;
  // A remote-KV sequence's prefilled hidden state (DisaggHooks::SetPrefilledHidden: the target's
  // at its last prefilled position, after the final norm), for a drafter that reads it.
  virtual void SetPrefilledHidden(int64_t seq_id, std::span<const float> hidden) {
    (void)seq_id;
    (void)hidden;
  }
  // Prompt tokens (positions) the drafter has computed so far, over all sequences.
  virtual int64_t num_prompt_tokens() const = 0;
  // The drafter's runner, whose region has the target's number of pages.
  virtual ModelRunner& runner() = 0;
};

// How a drafter picks a draft from its logits: a greedy or constrained request takes the argmax
// (q a point mass: an empty row appended to *q, verified by equality); a sampled one draws from
// q, the distribution under the request's temperature/top-k/top-p, appended to *q, with *sampler
// (made on first use from r.seed: a random stream independent of the target's).
int32_t ChooseDraft(const DraftRequest& r, std::span<const float> logits,
                    std::unique_ptr<RequestSampler>* sampler, std::vector<std::vector<double>>* q);

}  // namespace pd::engine
