#include "engine/spec_mtp.h"

#include <algorithm>
#include <string>
#include <utility>

#include "engine/engine_stepped.h"
#include "engine/spec_draft_model.h"

namespace pd::engine {

Result<std::unique_ptr<MtpDrafter>> MtpDrafter::Create(std::unique_ptr<ModelRunner> runner) {
  if (runner == nullptr) return InvalidArgument("MtpDrafter needs the MTP layer's runner");
  return std::unique_ptr<MtpDrafter>(new MtpDrafter(std::move(runner)));
}

void MtpDrafter::Reset(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  it->second.num_computed = -1;
  it->second.next_logits.clear();
  it->second.prefilled_hidden.clear();
  it->second.q.clear();
}

std::span<const double> MtpDrafter::DraftProbs(int64_t seq_id, int j) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || j < 0 || static_cast<size_t>(j) >= it->second.q.size()) return {};
  return it->second.q[j];
}

void MtpDrafter::MarkComputed(int64_t seq_id, int num_tokens) {
  SeqState& st = seqs_[seq_id];
  st.num_computed = std::max(0, num_tokens - 1);
}

void MtpDrafter::SetPrefilledHidden(int64_t seq_id, std::span<const float> hidden) {
  seqs_[seq_id].prefilled_hidden.assign(hidden.begin(), hidden.end());
}

bool MtpDrafter::AddCatchUp(const ScheduledSeq& s, const SeqUpdate* update,
                            const std::vector<float>& target_hidden, SeqState& st) {
  const Sequence& seq = *s.seq;
  const size_t hd = static_cast<size_t>(runner_->config().hidden_size);
  // A remote-KV sequence whose MTP KV stops one position short of its first step (MarkComputed)
  // runs that position from its prefilled hidden state; without either it cannot draft.
  const bool prefilled = seq.remote_kv && st.num_computed >= 0 &&
                         st.num_computed == s.start_pos - 1 && st.prefilled_hidden.size() == hd;
  if (seq.remote_kv && s.start_pos > 0 && !prefilled && st.num_computed != s.start_pos) {
    st.broken = true;  // its prompt's MTP KV was never computed here
    return false;
  }
  // The target computed [start_pos, start_pos + valid) and kept it: position t needs h_t (row
  // t - start_pos of target_hidden) and token t + 1: the sequence's, then the kept drafts, then
  // the token this step sampled (a prefill-only sequence's stop at its own last token).
  const int accepted =
      update != nullptr ? std::clamp(update->num_accepted_drafts, 0, s.num_draft_tokens) : 0;
  const int valid = s.num_tokens - s.num_draft_tokens + accepted;
  if (target_hidden.size() < static_cast<size_t>(valid) * hd) return false;
  const int first = prefilled ? s.start_pos - 1 : s.start_pos;
  std::vector<int32_t>& t = tokens_[batch_.seqs.size()];
  t.clear();
  const int num_tokens = seq.num_tokens();
  for (int k = first + 1; k <= s.start_pos + valid; ++k) {
    if (k < num_tokens) {
      t.push_back(seq.token_ids[k]);
    } else if (k - num_tokens < accepted) {
      t.push_back(seq.draft_token_ids[k - num_tokens]);
    } else if (k - num_tokens == accepted && update != nullptr && s.samples) {
      t.push_back(update->new_token_id);
    } else {
      break;  // not known yet
    }
  }
  st.num_computed = first;
  if (t.empty()) return false;
  std::vector<float>& in = inputs_[batch_.seqs.size()];
  in.clear();
  if (prefilled) in = st.prefilled_hidden;
  in.insert(in.end(), target_hidden.begin(),
            target_hidden.begin() + (t.size() - (prefilled ? 1 : 0)) * hd);
  st.prefilled_hidden.clear();
  SeqStep step;
  step.seq_id = s.seq_id;
  step.start_pos = first;
  step.token_ids = t;
  step.page_table = seq.page_table;
  step.input_hidden = in;
  // The last position's logits are draft 1 of the sequence's next step.
  step.compute_logits =
      update != nullptr && s.samples && first + static_cast<int>(t.size()) == num_tokens + accepted;
  const int end = first + static_cast<int>(t.size());
  num_prompt_tokens_ += std::max(0, std::min(end, seq.num_prompt_tokens) - first);
  batch_.seqs.push_back(step);
  return true;
}

Status MtpDrafter::CatchUp(const ScheduledBatch& batch, std::span<const SeqUpdate> updates,
                           const ForwardOutput& target) {
  batch_.seqs.clear();
  batch_.all_hidden = true;
  tokens_.resize(std::max(tokens_.size(), batch.seqs.size()));
  inputs_.resize(std::max(inputs_.size(), batch.seqs.size()));
  if (target.hidden.size() != batch.seqs.size())
    return Internal("the target returned hidden states of " + std::to_string(target.hidden.size()) +
                    " sequences for " + std::to_string(batch.seqs.size()));
  std::vector<SeqState*> ran;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    const SeqUpdate* update = nullptr;
    for (const SeqUpdate& u : updates) {
      if (u.seq_id == s.seq_id) update = &u;
    }
    SeqState& st = seqs_[s.seq_id];
    st.next_logits.clear();
    st.q.clear();
    if (st.broken) continue;
    if (s.seq->prefill_only) {  // the prompt's MTP KV for the decode instance; never drafts
      if (AddCatchUp(s, nullptr, target.hidden[i], st)) ran.push_back(&st);
      continue;
    }
    if (update != nullptr && update->finished) continue;
    if (AddCatchUp(s, update, target.hidden[i], st)) ran.push_back(&st);
  }
  if (batch_.seqs.empty()) return OkStatus();
  Status status = runner_->Forward(batch_, &out_);
  if (status.ok() && (out_.logits.size() != ran.size() || out_.hidden.size() != ran.size()))
    status = Internal("the MTP layer returned rows of " + std::to_string(out_.logits.size()) +
                      " sequences for " + std::to_string(ran.size()));
  const size_t hd = static_cast<size_t>(runner_->config().hidden_size);
  for (size_t a = 0; a < ran.size(); ++a) {
    SeqState& st = *ran[a];
    if (!status.ok()) {
      st.broken = true;
      continue;
    }
    const SeqStep& step = batch_.seqs[a];
    st.num_computed = step.start_pos + static_cast<int>(step.token_ids.size());
    if (!step.compute_logits) continue;
    st.next_logits = out_.logits[a];
    st.next_hidden.assign(out_.hidden[a].end() - hd, out_.hidden[a].end());
  }
  if (!status.ok()) return status.WithContext("MTP catch-up");
  return OkStatus();
}

Status MtpDrafter::Propose(std::span<const DraftRequest> requests,
                           std::vector<std::vector<int32_t>>* drafts) {
  drafts->assign(requests.size(), {});
  // Draft 1 from CatchUp's logits; each later pass runs the previous draft on the MTP layer's own
  // hidden state (chain[i]).
  std::vector<std::pair<size_t, SeqState*>> active;
  std::vector<std::vector<float>> chain(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    auto it = seqs_.find(r.seq->id);
    if (it == seqs_.end()) continue;
    SeqState& st = it->second;
    st.q.clear();
    if (st.broken || st.next_logits.empty() || st.num_computed != r.seq->num_tokens() - 1 ||
        r.num_drafts <= 0)
      continue;
    (*drafts)[i].push_back(ChooseDraft(r, st.next_logits, &st.sampler, &st.q));
    st.next_logits.clear();
    chain[i] = std::move(st.next_hidden);
    st.next_hidden.clear();
    if (r.num_drafts > 1) active.push_back({i, &st});
  }
  tokens_.resize(std::max(tokens_.size(), active.size()));
  batch_.all_hidden = true;
  for (int j = 1; !active.empty(); ++j) {
    batch_.seqs.clear();
    for (size_t a = 0; a < active.size(); ++a) {
      const auto [i, st] = active[a];
      tokens_[a].assign(1, (*drafts)[i].back());
      SeqStep step;
      step.seq_id = requests[i].seq->id;
      step.start_pos = st->num_computed + j - 1;
      step.token_ids = tokens_[a];
      step.page_table = requests[i].seq->page_table;
      step.compute_logits = true;
      step.input_hidden = chain[i];
      batch_.seqs.push_back(step);
    }
    Status status = runner_->Forward(batch_, &out_);
    if (status.ok() && (out_.logits.size() != active.size() || out_.hidden.size() != active.size()))
      status = Internal("the MTP layer returned rows of " + std::to_string(out_.logits.size()) +
                        " sequences for " + std::to_string(active.size()));
    if (!status.ok()) {
      for (auto& [i, st] : active) {
        st->broken = true;
        (*drafts)[i].clear();
        st->q.clear();
      }
      return status.WithContext("MTP proposal");
    }
    std::vector<std::pair<size_t, SeqState*>> next;
    for (size_t a = 0; a < active.size(); ++a) {
      const auto [i, st] = active[a];
      (*drafts)[i].push_back(ChooseDraft(requests[i], out_.logits[a], &st->sampler, &st->q));
      chain[i] = out_.hidden[a];
      if (static_cast<int>((*drafts)[i].size()) < requests[i].num_drafts) next.push_back({i, st});
    }
    active = std::move(next);
  }
  return OkStatus();
}

Result<std::unique_ptr<Engine>> CreateMtpEngine(const model::ModelWeights& weights,
                                                const EngineOptions& options) {
  if (weights.mtp.empty()) {
    return InvalidArgument(
        "--speculative-config: method \"mtp\" needs a deepseek_v3 checkpoint with its MTP layers: "
        "this one has num_nextn_predict_layers " +
        std::to_string(weights.config.num_nextn_predict_layers) + " and none in its files");
  }
  ModelRunnerOptions target_options = options.runner;
  if (target_options.num_pages == 0) {  // one page of the budget: a target and an MTP page
    ASSIGN_OR_RETURN(size_t target_bytes, KvPageBytesAllRanks(weights.config, options.runner));
    model::ModelConfig mtp_config = weights.config;  // one layer, on the target's ranks
    mtp_config.num_layers = 1;
    ASSIGN_OR_RETURN(size_t mtp_bytes, KvPageBytesAllRanks(mtp_config, options.runner));
    const size_t num_pages = options.runner.kv_cache_bytes / (target_bytes + mtp_bytes);
    if (num_pages < 1) {
      return InvalidArgument("kv_cache_bytes " + std::to_string(options.runner.kv_cache_bytes) +
                             " holds no page: one takes " + std::to_string(target_bytes) +
                             " bytes for the target and " + std::to_string(mtp_bytes) +
                             " for the MTP layer");
    }
    target_options.num_pages = static_cast<int>(std::min<size_t>(num_pages, 1 << 30));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                   ModelRunner::Create(weights, target_options));
  Result<std::unique_ptr<ModelRunner>> mtp_runner = CreateMtpRunner(weights, 0, target_options);
  if (!mtp_runner.ok()) return mtp_runner.status().WithContext("MTP layer");
  ASSIGN_OR_RETURN(std::unique_ptr<MtpDrafter> drafter,
                   MtpDrafter::Create(std::move(mtp_runner).value()));
  ASSIGN_OR_RETURN(std::unique_ptr<SteppedEngine> engine,
                   CreateSteppedEngine(std::move(runner), options, std::move(drafter)));
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace pd::engine
