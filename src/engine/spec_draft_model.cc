#include "engine/spec_draft_model.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/log.h"
#include "engine/engine_stepped.h"
#include "engine/rank_runner.h"
#include "engine/spec_decode.h"
#include "engine/tp_shard.h"

namespace pd::engine {

Result<size_t> KvPageBytesAllRanks(const model::ModelConfig& config,
                                   const ModelRunnerOptions& options) {
  const int tp = std::max(1, options.tensor_parallel_size);
  if (options.kv.page_size <= 0)
    return InvalidArgument("page_size must be positive, got " +
                           std::to_string(options.kv.page_size));
  size_t bytes = 0;
  for (int r = 0; r < tp; ++r) {
    const int heads = tp == 1 ? config.num_kv_heads : ComputeTpShard(config, tp, r).num_kv_heads;
    bytes += RankKvSpec(options.kv, config, heads).page_bytes();
  }
  return bytes * static_cast<size_t>(config.num_layers);
}

Status CheckDraftVocab(const model::ModelConfig& target, const model::ModelConfig& draft) {
  auto differs = [](const char* field, int t, int d) {
    return InvalidArgument(std::string("draft model: ") + field + " " + std::to_string(d) +
                           " differs from the target's " + std::to_string(t) +
                           " (the draft must use the target's tokenizer)");
  };
  if (draft.vocab_size != target.vocab_size)
    return differs("vocab_size", target.vocab_size, draft.vocab_size);
  if (draft.bos_token_id != target.bos_token_id)
    return differs("bos_token_id", target.bos_token_id, draft.bos_token_id);
  if (draft.eos_token_id != target.eos_token_id)
    return differs("eos_token_id", target.eos_token_id, draft.eos_token_id);
  return OkStatus();
}

Result<model::ModelWeights> FirstLayersOf(const model::ModelWeights& weights, int num_layers) {
  const int total = static_cast<int>(weights.layers.size());
  if (num_layers < 1 || num_layers > total)
    return InvalidArgument("draft layers must be in [1, " + std::to_string(total) + "], got " +
                           std::to_string(num_layers));
  model::ModelWeights view;
  view.config = weights.config;
  view.config.num_layers = num_layers;
  view.config.num_nextn_predict_layers = 0;
  view.dtype = weights.dtype;
  view.fp8 = weights.fp8;
  view.embed_tokens = weights.embed_tokens;
  view.layers.assign(weights.layers.begin(), weights.layers.begin() + num_layers);
  view.final_norm = weights.final_norm;
  view.lm_head = weights.lm_head;
  if (!weights.kv_scales.empty())
    view.kv_scales.assign(
        weights.kv_scales.begin(),
        weights.kv_scales.begin() + std::min<size_t>(num_layers, weights.kv_scales.size()));
  return view;
}

Result<std::unique_ptr<DraftModel>> DraftModel::Create(
    std::unique_ptr<ModelRunner> runner, std::unique_ptr<model::ModelWeights> weights) {
  if (runner == nullptr) return InvalidArgument("DraftModel needs a ModelRunner");
  return std::unique_ptr<DraftModel>(new DraftModel(std::move(runner), std::move(weights)));
}

void DraftModel::Reset(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  it->second.num_computed = -1;
  it->second.q.clear();
}

std::span<const double> DraftModel::DraftProbs(int64_t seq_id, int j) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || j < 0 || static_cast<size_t>(j) >= it->second.q.size()) return {};
  return it->second.q[j];
}

Status DraftModel::CatchUp(const ScheduledBatch& batch, std::span<const SeqUpdate> updates) {
  batch_.seqs.clear();
  tokens_.resize(std::max(tokens_.size(), batch.seqs.size()));
  std::vector<std::pair<SeqState*, int>> ran;  // (state, its new num_computed)
  for (const ScheduledSeq& s : batch.seqs) {
    SeqState& st = seqs_[s.seq_id];
    if (st.broken) continue;
    int accepted = 0;
    for (const SeqUpdate& u : updates) {
      if (u.seq_id == s.seq_id) accepted = std::clamp(u.num_accepted_drafts, 0, s.num_draft_tokens);
    }
    const Sequence& seq = *s.seq;
    if (st.num_computed < 0) {
      st.num_computed = seq.remote_kv ? 0 : s.start_pos;
    } else {
      // Past the sequence's tokens only the accepted drafts' KV is the sequence's.
      st.num_computed = std::min(st.num_computed, seq.num_tokens() + accepted);
    }
    st.q.clear();
    const int end = s.start_pos + s.num_tokens - s.num_draft_tokens + accepted;
    if (st.num_computed >= end) continue;
    std::vector<int32_t>& t = tokens_[batch_.seqs.size()];
    t.assign(seq.token_ids.begin(), seq.token_ids.end());
    t.insert(t.end(), seq.draft_token_ids.begin(), seq.draft_token_ids.begin() + accepted);
    SeqStep step;
    step.seq_id = s.seq_id;
    step.start_pos = st.num_computed;
    step.token_ids = std::span<const int32_t>(t).subspan(st.num_computed, end - st.num_computed);
    step.page_table = seq.page_table;
    batch_.seqs.push_back(step);
    ran.push_back({&st, end});
    num_prompt_tokens_ += std::max(0, std::min(end, seq.num_prompt_tokens) - st.num_computed);
  }
  if (batch_.seqs.empty()) return OkStatus();
  const Status status = runner_->Forward(batch_, &out_);
  for (auto& [st, end] : ran) {
    if (status.ok()) {
      st->num_computed = end;
    } else {
      st->broken = true;
    }
  }
  if (!status.ok()) return status.WithContext("draft model catch-up");
  return OkStatus();
}

int32_t ChooseDraft(const DraftRequest& r, std::span<const float> logits,
                    std::unique_ptr<RequestSampler>* sampler,
                    std::vector<std::vector<double>>* qs) {
  const SamplingParams& p = *r.sampling;
  if (p.temperature == 0.0f || p.constraint != nullptr) {
    qs->emplace_back();  // a point mass: verified by equality
    return ArgMax(logits);
  }
  if (*sampler == nullptr) {
    SamplingParams free = p;
    free.constraint = nullptr;
    free.seed = r.seed;  // a stream of its own: the draws must be independent of the target's
    *sampler = std::make_unique<RequestSampler>(free, r.seed);
  }
  std::vector<double>& q = qs->emplace_back();
  (*sampler)->Distribution(logits, &q);
  const double u = (*sampler)->Uniform();
  double cum = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i] <= 0.0) continue;
    last = static_cast<int32_t>(i);
    cum += q[i];
    if (u < cum) return last;
  }
  PD_CHECK(last >= 0) << "the draft distribution is empty";
  return last;  // rounding: the last token with mass
}

Status DraftModel::Propose(std::span<const DraftRequest> requests,
                           std::vector<std::vector<int32_t>>* drafts) {
  drafts->assign(requests.size(), {});
  // Active requests: index into `requests`, with their state; the first pass runs the tokens the
  // draft lacks up to the one just sampled, each later pass the previous draft.
  std::vector<std::pair<size_t, SeqState*>> active;
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    SeqState& st = seqs_[r.seq->id];
    st.q.clear();
    if (st.broken || st.num_computed < 0 || st.num_computed >= r.seq->num_tokens() ||
        r.num_drafts <= 0)
      continue;
    active.push_back({i, &st});
  }
  tokens_.resize(std::max(tokens_.size(), active.size()));
  Status status;
  for (int j = 0; !active.empty(); ++j) {
    batch_.seqs.clear();
    for (size_t a = 0; a < active.size(); ++a) {
      const DraftRequest& r = requests[active[a].first];
      SeqState& st = *active[a].second;
      std::vector<int32_t>& t = tokens_[a];
      if (j == 0) {
        t.assign(r.seq->token_ids.begin() + st.num_computed, r.seq->token_ids.end());
      } else {
        t.assign(1, (*drafts)[active[a].first].back());
      }
      SeqStep step;
      step.seq_id = r.seq->id;
      step.start_pos = st.num_computed;
      step.token_ids = t;
      step.page_table = r.seq->page_table;
      step.compute_logits = true;
      batch_.seqs.push_back(step);
    }
    status = runner_->Forward(batch_, &out_);
    if (status.ok() && out_.logits.size() != active.size())
      status = Internal("the draft model returned " + std::to_string(out_.logits.size()) +
                        " logit rows for " + std::to_string(active.size()) + " sequences");
    if (!status.ok()) {
      for (auto& [i, st] : active) {
        st->broken = true;
        (*drafts)[i].clear();
        st->q.clear();
      }
      return status.WithContext("draft model proposal");
    }
    std::vector<std::pair<size_t, SeqState*>> next;
    for (size_t a = 0; a < active.size(); ++a) {
      auto [i, st] = active[a];
      const DraftRequest& r = requests[i];
      st->num_computed += static_cast<int>(batch_.seqs[a].token_ids.size());
      (*drafts)[i].push_back(ChooseDraft(r, out_.logits[a], &st->sampler, &st->q));
      if (static_cast<int>((*drafts)[i].size()) < r.num_drafts) next.push_back({i, st});
    }
    active = std::move(next);
  }
  return OkStatus();
}

// The target's and the draft's runners over one page budget (spec_draft_model.h).
Result<std::unique_ptr<Engine>> CreateDraftModelEngine(const model::ModelWeights& weights,
                                                       const EngineOptions& options) {
  std::unique_ptr<model::ModelWeights> owned;
  const model::ModelWeights* draft_weights = options.draft_weights;
  if (draft_weights == nullptr) {
    const std::string& dir = options.speculative.model;
    if (dir.empty()) return InvalidArgument("--speculative-config: draft_model needs \"model\"");
    Result<model::ModelWeights> loaded = model::LoadModelWeights(dir);
    if (!loaded.ok()) return loaded.status().WithContext("draft model " + dir);
    owned = std::make_unique<model::ModelWeights>(std::move(loaded).value());
    draft_weights = owned.get();
  }
  RETURN_IF_ERROR(CheckDraftVocab(weights.config, draft_weights->config));
  const int draft_positions = draft_weights->config.max_position_embeddings;
  const int target_positions = weights.config.max_position_embeddings;
  const int max_model_len = target_positions > 0
                                ? std::min(options.scheduler.max_model_len, target_positions)
                                : options.scheduler.max_model_len;
  if (draft_positions > 0 && draft_positions < max_model_len) {
    return InvalidArgument("draft model: max_position_embeddings " +
                           std::to_string(draft_positions) + " is below max_model_len " +
                           std::to_string(max_model_len) + " (lower --max-model-len)");
  }
  ModelRunnerOptions target_options = options.runner;
  if (target_options.num_pages == 0) {  // one page of the budget: a target and a draft page
    ASSIGN_OR_RETURN(size_t target_bytes, KvPageBytesAllRanks(weights.config, options.runner));
    ASSIGN_OR_RETURN(size_t draft_bytes,
                     KvPageBytesAllRanks(draft_weights->config, options.runner));
    const size_t num_pages = options.runner.kv_cache_bytes / (target_bytes + draft_bytes);
    if (num_pages < 1) {
      return InvalidArgument("kv_cache_bytes " + std::to_string(options.runner.kv_cache_bytes) +
                             " holds no page: one takes " + std::to_string(target_bytes) +
                             " bytes for the target and " + std::to_string(draft_bytes) +
                             " for the draft model");
    }
    target_options.num_pages = static_cast<int>(std::min<size_t>(num_pages, 1 << 30));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                   ModelRunner::Create(weights, target_options));
  ModelRunnerOptions draft_options = target_options;
  draft_options.tracer = nullptr;  // the target's layers stand for the step
  Result<std::unique_ptr<ModelRunner>> draft_runner =
      ModelRunner::Create(*draft_weights, draft_options);
  if (!draft_runner.ok()) return draft_runner.status().WithContext("draft model");
  ASSIGN_OR_RETURN(std::unique_ptr<DraftModel> draft,
                   DraftModel::Create(std::move(draft_runner).value(), std::move(owned)));
  ASSIGN_OR_RETURN(std::unique_ptr<SteppedEngine> engine,
                   CreateSteppedEngine(std::move(runner), options, std::move(draft)));
  return std::unique_ptr<Engine>(std::move(engine));
}

SampleResult VerifyDraft(RequestSampler& sampler, std::span<const float> logits,
                         std::span<const double> q, int32_t draft, bool* accepted) {
  std::vector<double> p;
  sampler.Distribution(logits, &p);
  const double u_accept = sampler.Uniform();
  const double u_resample = sampler.Uniform();
  const RejectionResult r = RejectionSample(p, q, draft, u_accept, u_resample);
  *accepted = r.accepted;
  SampleResult out;
  out.token_id = r.token_id;
  out.logprob = LogSoftmaxAt(logits, r.token_id);
  const int n = sampler.params().logprobs;
  if (n > 0) out.top = TopLogprobs(logits, n);
  return out;
}

}  // namespace pd::engine
