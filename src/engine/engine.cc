// Engine: the scheduler, a ModelRunner and one sampler per request, driven one step at a time.
#include "engine/engine.h"

#include <algorithm>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/log.h"
#include "engine/engine_stepped.h"
#include "engine/kv_events.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/spec_draft_model.h"
#include "engine/spec_mtp.h"

namespace pd::engine {
namespace {

struct RequestState {
  RequestState(const SamplingParams& sampling, uint64_t default_seed, int32_t eos_token_id,
               int num_prompt_tokens)
      : sampler(sampling, default_seed, eos_token_id),
        draft_seed(sampling.seed.value_or(default_seed) ^ 0x9e3779b97f4a7c15ull),
        num_prompt_tokens(num_prompt_tokens) {}
  RequestSampler sampler;
  uint64_t draft_seed;  // the draft model's random stream (spec_draft_model.h)
  int num_prompt_tokens = 0;
  bool prefill_only = false;
  // (hidden) a remote-KV request's last prefilled position, from the prefill instance; empty
  // until it comes (DisaggHooks::SetPrefilledHidden).
  std::vector<float> prefilled_hidden;
};

// The scheduler's options: the prefix cache's key chain rooted in the model and the KV format.
SchedulerOptions SchedulerOptionsOf(const EngineOptions& options, const KvCacheSpec& spec) {
  SchedulerOptions o = options.scheduler;
  o.prefix_cache_root = PrefixCacheRoot(options.model_fingerprint, spec);
  return o;
}

// Thread safety: see Engine; only ValidateRequest may run concurrently with the rest.
class EngineImpl final : public SteppedEngine, public DisaggHooks {
 public:
  EngineImpl(std::unique_ptr<ModelRunner> runner, const EngineOptions& options,
             std::unique_ptr<Drafter> draft)
      : runner_(std::move(runner)),
        draft_(std::move(draft)),
        options_(options),
        clock_(options.clock != nullptr ? options.clock : &SystemClock::Get()),
        pool_(runner_->region().num_pages(),
              options.scheduler.enable_prefix_caching ? runner_->region().spec().page_size : 0),
        scheduler_(SchedulerOptionsOf(options, runner_->region().spec()), &pool_,
                   runner_->region().spec().page_size, clock_),
        seed_rng_(std::random_device{}()) {
    if (options.kv_events != nullptr && pool_.prefix_caching()) {
      const KvCacheSpec& spec = runner_->region().spec();
      options.kv_events->SetFormat(PrefixCacheRoot(options.model_fingerprint, spec),
                                   spec.page_size);
      pool_.SetEventLog(options.kv_events);
    }
    spec_.accepted_per_pos.assign(std::max(0, options.speculative.num_speculative_tokens), 0);
  }

  Status ValidateRequest(const Request& request) const override;
  Status AddRequest(Request request) override;
  void Abort(int64_t request_id) override;
  bool HasWork() const override { return scheduler_.HasWork() || !aborted_.empty(); }
  bool Stalled() const override { return stalled_ && aborted_.empty(); }
  Result<std::vector<RequestOutput>> Step() override;
  bool BeginStep(std::vector<RequestOutput>* outputs) override;
  const ForwardBatch& step_batch() const override { return forward_batch_; }
  ForwardOutput* step_output() override { return &forward_output_; }
  void EndStep(const Status& forward, std::vector<RequestOutput>* outputs) override;
  EngineStats stats() const override;
  const model::ModelConfig& config() const override { return runner_->config(); }
  ModelRunner& runner() override { return *runner_; }
  DisaggHooks* disagg_hooks() override { return this; }
  Status CheckPages() const override { return scheduler_.CheckPages(); }
  int CachedPrefixTokens(std::span<const int32_t> prompt) const override;

  Status AddPrefillOnlyRequest(Request request) override;
  void ReleasePages(std::span<const int32_t> pages) override { pool_.Release(pages); }
  void RetainPages(std::span<const int32_t> pages) override { pool_.AddRef(pages); }
  void SetStepObserver(StepObserver observer) override { observer_ = std::move(observer); }
  Status AddRemoteKvRequest(Request request) override;
  std::vector<KvReservation> TakeKvReservations() override;
  Status MarkKvReady(int64_t request_id) override;
  ModelRunner* DraftKvRunner() override { return draft_ != nullptr ? &draft_->runner() : nullptr; }
  void SetRemoteDraftKv(bool on) override { remote_draft_kv_ = on; }
  bool AwaitsKv() const override { return scheduler_.num_awaiting_kv() > 0; }
  Status SetPrefilledHidden(int64_t request_id, std::vector<float> hidden) override;
  std::span<const float> PrefilledHidden(int64_t request_id) const override {
    auto it = requests_.find(request_id);
    return it == requests_.end() ? std::span<const float>() : it->second->prefilled_hidden;
  }
  size_t WarmCaches(size_t max_bytes, const std::function<bool()>& stop) override;

 private:
  enum class Kind { kNormal, kPrefillOnly, kRemoteKv };
  Status Add(Request request, Kind kind);
  void NotifyObserver(const ScheduledBatch& batch);
  RequestOutput PrefillOutput(const ScheduledSeq& s, const RequestState& state, size_t row);
  RequestOutput MakeOutput(int64_t id, const RequestState& state, const Sequence* seq) const;
  void BuildForwardBatch(const ScheduledBatch& batch);
  // The target's tokens for one sampling sequence from its logit rows (spec_decode.h), cut at
  // the first that ends the request; fills `update` for the scheduler.
  RequestOutput SampleSeq(const ScheduledSeq& s, RequestState& state, size_t row,
                          SeqUpdate* update);
  // Drafts for the next step of every sequence that goes on decoding (speculative decoding).
  void ProposeDrafts(std::span<const SeqUpdate> updates);
  void FailBatch(const ScheduledBatch& batch, const Status& status,
                 std::vector<RequestOutput>* outputs);

  // The drafts of the sequences in `updates` that go on decoding, from the drafter.
  void ProposeDraftModel(std::span<const SeqUpdate> updates);
  int MaxDrafts(const Sequence& seq, const RequestState& state) const;

  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Drafter> draft_;  // methods draft_model and mtp; null otherwise
  const EngineOptions options_;
  const Clock* const clock_;
  PagePool pool_;
  Scheduler scheduler_;
  std::vector<MemRange> warm_ranges_;  // WarmCaches' scratch
  std::mt19937_64 seed_rng_;           // seeds for requests without one
  std::unordered_map<int64_t, std::unique_ptr<RequestState>> requests_;
  std::vector<RequestOutput> aborted_;               // reported at the next Step
  ScheduledBatch batch_;                             // of the step between BeginStep and EndStep
  ForwardBatch forward_batch_;                       // reused every step
  std::vector<std::vector<int32_t>> verify_tokens_;  // per batch row: last token + drafts
  SpecDecodeCounters spec_;
  ForwardOutput forward_output_;
  StepObserver observer_;
  bool stalled_ = false;  // the last Step scheduled nothing and preempted nothing
  bool remote_draft_kv_ =
      false;  // a remote-KV request's KV includes the draft's (SetRemoteDraftKv)
};

Status EngineImpl::ValidateRequest(const Request& request) const {
  const model::ModelConfig& config = runner_->config();
  const int num_prompt = static_cast<int>(request.prompt_ids.size());
  if (num_prompt == 0) return InvalidArgument("prompt_ids: the prompt is empty");
  for (int i = 0; i < num_prompt; ++i) {
    int32_t id = request.prompt_ids[i];
    if (id < 0 || id >= config.vocab_size) {
      return InvalidArgument("prompt_ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                             " is outside the vocabulary [0, " + std::to_string(config.vocab_size) +
                             ")");
    }
  }
  RETURN_IF_ERROR(ValidateSamplingParams(request.sampling, config.vocab_size));
  const int64_t total = int64_t{num_prompt} + request.sampling.max_tokens;
  const int max_len = options_.scheduler.max_model_len;
  if (total > max_len) {
    return InvalidArgument("prompt (" + std::to_string(num_prompt) + " tokens) + max_tokens (" +
                           std::to_string(request.sampling.max_tokens) +
                           ") = " + std::to_string(total) + " exceeds max_model_len " +
                           std::to_string(max_len));
  }
  const int64_t pages = (total + scheduler_.page_size() - 1) / scheduler_.page_size();
  if (pages > pool_.num_total()) {
    return InvalidArgument("prompt (" + std::to_string(num_prompt) + " tokens) + max_tokens (" +
                           std::to_string(request.sampling.max_tokens) + ") needs " +
                           std::to_string(pages) + " KV pages but the cache holds only " +
                           std::to_string(pool_.num_total()));
  }
  return OkStatus();
}

Status EngineImpl::AddRequest(Request request) { return Add(std::move(request), Kind::kNormal); }

Status EngineImpl::AddPrefillOnlyRequest(Request request) {
  request.sampling = SamplingParams{};  // never sampled: only the prompt must fit
  request.sampling.max_tokens = 1;
  return Add(std::move(request), Kind::kPrefillOnly);
}

Status EngineImpl::AddRemoteKvRequest(Request request) {
  return Add(std::move(request), Kind::kRemoteKv);
}

Status EngineImpl::Add(Request request, Kind kind) {
  RETURN_IF_ERROR(ValidateRequest(request));
  if (requests_.count(request.id) != 0) {
    return AlreadyExists("request " + std::to_string(request.id) + " is already running");
  }
  auto state =
      std::make_unique<RequestState>(request.sampling, seed_rng_(), runner_->config().eos_token_id,
                                     static_cast<int>(request.prompt_ids.size()));
  state->prefill_only = kind == Kind::kPrefillOnly;
  std::vector<int32_t> prompt = std::move(request.prompt_ids);
  switch (kind) {
    case Kind::kNormal:
      RETURN_IF_ERROR(scheduler_.AddSequence(request.id, std::move(prompt), request.arrival_time));
      break;
    case Kind::kPrefillOnly:
      RETURN_IF_ERROR(
          scheduler_.AddPrefillOnlySequence(request.id, std::move(prompt), request.arrival_time));
      break;
    case Kind::kRemoteKv:
      RETURN_IF_ERROR(
          scheduler_.AddRemoteKvSequence(request.id, std::move(prompt), request.arrival_time));
      break;
  }
  requests_.emplace(request.id, std::move(state));
  return OkStatus();
}

size_t EngineImpl::WarmCaches(size_t max_bytes, const std::function<bool()>& stop) {
  if (!AwaitsKv()) return 0;
  warm_ranges_.clear();
  runner_->AppendWarmRanges(scheduler_.AwaitingKvPages(), &warm_ranges_);
  size_t total = 0;
  for (const MemRange& r : warm_ranges_) total += r.bytes;
  if (total == 0 || total > max_bytes) return 0;
  return TouchRanges(warm_ranges_, stop);
}

std::vector<KvReservation> EngineImpl::TakeKvReservations() {
  std::vector<KvReservation> out;
  for (int64_t id : scheduler_.ReserveRemoteKv()) {
    const Sequence* seq = scheduler_.Find(id);
    PD_CHECK(seq != nullptr);
    out.push_back({id, seq->page_table, seq->num_cached_pages});
  }
  return out;
}

int EngineImpl::CachedPrefixTokens(std::span<const int32_t> prompt) const {
  if (!options_.scheduler.enable_prefix_caching || !pool_.prefix_caching() || prompt.empty())
    return 0;
  const int page_size = scheduler_.page_size();
  const size_t max_pages = (prompt.size() - 1) / static_cast<size_t>(page_size);
  std::vector<uint64_t> keys;
  ExtendPageKeys(scheduler_.options().prefix_cache_root, prompt.first(max_pages * page_size),
                 page_size, &keys);
  return static_cast<int>(pool_.MatchPrefix(keys, prompt).size()) * page_size;
}

void EngineImpl::NotifyObserver(const ScheduledBatch& batch) {
  if (!observer_) return;
  StepInfo info;
  info.runner_step = runner_->steps_done();
  for (const ScheduledSeq& s : batch.seqs) {
    if (!s.seq->prefill_only) continue;
    info.prefill_chunks.push_back(
        {s.seq_id, s.start_pos, s.num_tokens, s.seq->page_table, s.samples});
  }
  observer_(info);
}

// The last chunk of a prefill-only request ran: hand its pages (one extra reference, so the
// scheduler's release on finish leaves them allocated) and its last hidden state over.
RequestOutput EngineImpl::PrefillOutput(const ScheduledSeq& s, const RequestState& state,
                                        size_t row) {
  auto result = std::make_shared<PrefillResult>();
  result->page_table = s.seq->page_table;
  result->num_tokens = s.context_len();
  if (row < forward_output_.last_hidden.size())
    result->last_hidden = forward_output_.last_hidden[row];
  pool_.AddRef(result->page_table);
  RequestOutput out = MakeOutput(s.seq_id, state, s.seq);
  out.finish_reason = FinishReason::kStop;
  out.prefill_result = std::move(result);
  return out;
}

RequestOutput EngineImpl::MakeOutput(int64_t id, const RequestState& state,
                                     const Sequence* seq) const {
  RequestOutput out;
  out.request_id = id;
  out.num_prompt_tokens = state.num_prompt_tokens;
  if (seq != nullptr) {
    out.num_generated_tokens = seq->num_generated_tokens();
    out.num_cached_tokens = std::max(0, seq->num_cached_tokens);
    out.first_scheduled_time = std::max(0.0, seq->first_scheduled_time);
  }
  return out;
}

void EngineImpl::Abort(int64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  RequestOutput out = MakeOutput(request_id, *it->second, scheduler_.Find(request_id));
  out.finish_reason = FinishReason::kAbort;
  scheduler_.Abort(request_id);  // frees the pages now
  if (draft_ != nullptr) draft_->Forget(request_id);
  requests_.erase(it);
  aborted_.push_back(std::move(out));
}

void EngineImpl::BuildForwardBatch(const ScheduledBatch& batch) {
  forward_batch_.seqs.resize(batch.seqs.size());
  forward_batch_.all_hidden = draft_ != nullptr && draft_->needs_target_hidden();
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    SeqStep& step = forward_batch_.seqs[i];
    step.seq_id = s.seq_id;
    step.start_pos = s.start_pos;
    step.token_ids = std::span<const int32_t>(s.seq->token_ids).subspan(s.start_pos, s.num_tokens);
    step.page_table = s.seq->page_table;
    // The last chunk of a prompt, or a decode token; a prefill-only request is never sampled.
    step.compute_logits = s.samples && !s.seq->prefill_only;
    step.num_logits = 1;
    if (s.num_draft_tokens > 0) {  // verification: logits after the last token and each draft
      if (verify_tokens_.size() <= i) verify_tokens_.resize(batch.seqs.size());
      std::vector<int32_t>& t = verify_tokens_[i];
      t.assign(1, s.seq->token_ids[s.start_pos]);
      t.insert(t.end(), s.seq->draft_token_ids.begin(),
               s.seq->draft_token_ids.begin() + s.num_draft_tokens);
      step.token_ids = t;
      step.num_logits = s.num_tokens;
    }
  }
}

RequestOutput EngineImpl::SampleSeq(const ScheduledSeq& s, RequestState& state, size_t row,
                                    SeqUpdate* update) {
  const model::ModelConfig& config = runner_->config();
  const StopContext stop_ctx{config.eos_token_id, options_.scheduler.max_model_len};
  const std::vector<float>& logits = forward_output_.logits[row];
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  const int num_drafts = s.num_draft_tokens;
  PD_CHECK(logits.size() == vocab * (1 + num_drafts))
      << "logits of sequence " << s.seq_id << " have " << logits.size() << " entries";
  RequestOutput out = MakeOutput(s.seq_id, state, s.seq);
  int num_generated = s.seq->num_generated_tokens(), accepted = 0;
  for (int j = 0; j <= num_drafts; ++j) {
    const std::span<const float> row = std::span<const float>(logits).subspan(j * vocab, vocab);
    const std::span<const double> q = draft_ != nullptr && j < num_drafts
                                          ? draft_->DraftProbs(s.seq_id, j)
                                          : std::span<const double>();
    bool q_kept = false;
    SampleResult sample =
        q.empty() ? state.sampler.Sample(row)
                  : VerifyDraft(state.sampler, row, q, s.seq->draft_token_ids[j], &q_kept);
    ++num_generated;
    const StopCheck stop = CheckStop(state.sampler.params(), stop_ctx, sample.token_id,
                                     num_generated, s.seq->num_tokens() + j + 1);
    out.new_token_ids.push_back(sample.token_id);
    if (state.sampler.params().logprobs >= 0) {
      out.logprobs.push_back({sample.token_id, sample.logprob, std::move(sample.top)});
    }
    out.finish_reason = stop.reason;
    out.stop_token_id = stop.stop_token_id;
    const bool kept =
        q.empty() ? j < num_drafts && sample.token_id == s.seq->draft_token_ids[j] : q_kept;
    if (kept) ++spec_.accepted_per_pos[j];
    accepted += kept ? 1 : 0;
    if (!kept || stop.reason != FinishReason::kNone) break;
  }
  if (num_drafts > 0) {
    ++spec_.num_drafts;
    spec_.num_draft_tokens += num_drafts;
    spec_.num_accepted_tokens += accepted;
  }
  out.num_generated_tokens = num_generated;
  update->seq_id = s.seq_id;
  update->new_token_id = out.new_token_ids.back();
  update->finished = out.finish_reason != FinishReason::kNone;
  update->num_accepted_drafts = static_cast<int>(out.new_token_ids.size()) - 1;
  return out;
}

void EngineImpl::ProposeDrafts(std::span<const SeqUpdate> updates) {
  const SpeculativeConfig& spec = options_.speculative;
  if (!spec.enabled()) return;
  if (draft_ != nullptr) return ProposeDraftModel(updates);
  for (const SeqUpdate& u : updates) {
    if (u.finished) continue;
    const Sequence* seq = scheduler_.Find(u.seq_id);
    auto it = requests_.find(u.seq_id);
    if (seq == nullptr || it == requests_.end()) continue;
    const int k = MaxDrafts(*seq, *it->second);
    if (k <= 0) continue;
    std::vector<int32_t> drafts =
        NgramPropose(seq->token_ids, spec.prompt_lookup_min, spec.prompt_lookup_max, k);
    // A constrained request verifies only the drafts its constraint allows.
    drafts.resize(it->second->sampler.NumAllowedDrafts(drafts));
    if (!drafts.empty()) scheduler_.SetDraftTokens(u.seq_id, std::move(drafts));
  }
}

// Drafts and the token after them stay within max_tokens and max_model_len.
int EngineImpl::MaxDrafts(const Sequence& seq, const RequestState& state) const {
  return std::min({options_.speculative.num_speculative_tokens,
                   state.sampler.params().max_tokens - seq.num_generated_tokens() - 1,
                   options_.scheduler.max_model_len - seq.num_tokens() - 1});
}

void EngineImpl::ProposeDraftModel(std::span<const SeqUpdate> updates) {
  std::vector<DraftRequest> requests;
  for (const SeqUpdate& u : updates) {
    if (u.finished) continue;
    const Sequence* seq = scheduler_.Find(u.seq_id);
    auto it = requests_.find(u.seq_id);
    if (seq == nullptr || it == requests_.end() || seq->prefill_only) continue;
    int k = MaxDrafts(*seq, *it->second);
    if (k <= 0) continue;
    // A draft model writes the KV of the token just sampled and of drafts 1..k-1 (an MTP layer
    // one position less).
    const int covered = scheduler_.ReserveDraftPages(u.seq_id, seq->num_tokens() + k - 1);
    k = std::min(k, covered - seq->num_tokens() + 1);
    if (k <= 0) continue;
    requests.push_back({seq, k, &it->second->sampler.params(), it->second->draft_seed});
  }
  if (requests.empty()) return;
  std::vector<std::vector<int32_t>> drafts;
  const Status status = draft_->Propose(requests, &drafts);
  if (!status.ok()) PD_LOG_ERROR("speculative decoding stops for the batch: {}", status.ToString());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!drafts[i].empty()) scheduler_.SetDraftTokens(requests[i].seq->id, std::move(drafts[i]));
  }
}

Status EngineImpl::MarkKvReady(int64_t request_id) {
  RETURN_IF_ERROR(scheduler_.MarkKvReady(request_id));
  if (remote_draft_kv_ && draft_ != nullptr) {
    // The prefill instance sent the draft's KV of every token but the last, which the first
    // decode step runs (and the draft catches up on after it).
    const Sequence* seq = scheduler_.Find(request_id);
    if (seq != nullptr) draft_->MarkComputed(request_id, seq->num_tokens() - 1);
  }
  return OkStatus();
}

Status EngineImpl::SetPrefilledHidden(int64_t request_id, std::vector<float> hidden) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return NotFound("request " + std::to_string(request_id) + " is not running");
  }
  const int hidden_size = runner_->config().hidden_size;
  if (hidden.size() != static_cast<size_t>(hidden_size)) {
    return InvalidArgument("request " + std::to_string(request_id) +
                           ": the prefilled hidden state has " + std::to_string(hidden.size()) +
                           " floats, expected hidden_size " + std::to_string(hidden_size));
  }
  it->second->prefilled_hidden = std::move(hidden);
  if (draft_ != nullptr) draft_->SetPrefilledHidden(request_id, it->second->prefilled_hidden);
  return OkStatus();
}

void EngineImpl::FailBatch(const ScheduledBatch& batch, const Status& status,
                           std::vector<RequestOutput>* outputs) {
  PD_LOG_ERROR("engine step failed: {}", status.ToString());
  for (const ScheduledSeq& s : batch.seqs) {
    auto it = requests_.find(s.seq_id);
    if (it == requests_.end()) continue;
    RequestOutput out = MakeOutput(s.seq_id, *it->second, s.seq);
    out.finish_reason = FinishReason::kError;
    out.error = status;
    scheduler_.Abort(s.seq_id);
    if (draft_ != nullptr) draft_->Forget(s.seq_id);
    requests_.erase(it);
    outputs->push_back(std::move(out));
  }
}

Result<std::vector<RequestOutput>> EngineImpl::Step() {
  std::vector<RequestOutput> outputs;
  if (!BeginStep(&outputs)) return outputs;
  TraceSpan span(options_.runner.tracer, "step", "engine");  // what the step ran
  if (span.enabled()) {
    options_.runner.tracer->SetThreadName("engine");
    int64_t chunks = 0;
    for (const ScheduledSeq& s : batch_.seqs) chunks += s.is_decode ? 0 : 1;
    span.Arg("step", static_cast<int64_t>(runner_->steps_done()));
    span.Arg("prefill_chunks", chunks);
    span.Arg("prefill_tokens", int64_t{batch_.num_prefill_tokens});
    span.Arg("decodes", int64_t{batch_.num_decode_tokens});
  }
  const Status status = runner_->Forward(forward_batch_, &forward_output_);
  EndStep(status, &outputs);
  return outputs;
}

bool EngineImpl::BeginStep(std::vector<RequestOutput>* outputs) {
  for (RequestOutput& out : aborted_) outputs->push_back(std::move(out));
  aborted_.clear();
  batch_ = scheduler_.Schedule();
  if (draft_ != nullptr) {
    for (int64_t id : batch_.preempted_seq_ids) draft_->Reset(id);
  }
  stalled_ = batch_.empty() && batch_.preempted_seq_ids.empty();
  if (batch_.empty()) return false;
  BuildForwardBatch(batch_);
  NotifyObserver(batch_);
  return true;
}

void EngineImpl::EndStep(const Status& forward, std::vector<RequestOutput>* outputs) {
  const ScheduledBatch& batch = batch_;
  Status status = forward;
  if (status.ok() && forward_output_.logits.size() != batch.seqs.size()) {
    status = Internal("ModelRunner returned " + std::to_string(forward_output_.logits.size()) +
                      " logit rows for " + std::to_string(batch.seqs.size()) + " sequences");
  }
  if (!status.ok()) {
    FailBatch(batch, status, outputs);
    return;
  }
  std::vector<SeqUpdate> updates;
  updates.reserve(batch.seqs.size());
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    if (!s.samples) continue;
    RequestState& state = *requests_.at(s.seq_id);
    if (state.prefill_only) {
      outputs->push_back(PrefillOutput(s, state, i));
      updates.push_back({s.seq_id, 0, true});
      continue;
    }
    SeqUpdate update;
    outputs->push_back(SampleSeq(s, state, i, &update));
    updates.push_back(update);
  }
  if (draft_ != nullptr) {
    // Before Update: the finished sequences' pages still hold what the target computed.
    const Status caught_up = draft_->CatchUp(batch, updates, forward_output_);
    if (!caught_up.ok())
      PD_LOG_ERROR("speculative decoding stops for the batch: {}", caught_up.ToString());
  }
  scheduler_.Update(batch, updates);
  for (const SeqUpdate& u : updates) {
    if (!u.finished) continue;
    requests_.erase(u.seq_id);
    if (draft_ != nullptr) draft_->Forget(u.seq_id);
  }
  ProposeDrafts(updates);
}

EngineStats EngineImpl::stats() const {
  EngineStats s;
  s.num_running = scheduler_.num_running();
  s.num_waiting = scheduler_.num_waiting();
  s.num_free_pages = pool_.num_free();
  s.num_total_pages = pool_.num_total();
  s.num_preemptions = scheduler_.num_preemptions();
  s.num_awaiting_kv = scheduler_.num_awaiting_pages() + scheduler_.num_awaiting_kv();
  s.prefix_cache_queries = scheduler_.prefix_cache_queries();
  s.prefix_cache_hits = scheduler_.prefix_cache_hits();
  s.num_cached_pages = pool_.num_cached();
  s.spec_decode = spec_;
  if (draft_ != nullptr) s.spec_decode.num_draft_prompt_tokens = draft_->num_prompt_tokens();
  return s;
}

Status CheckOptions(const SchedulerOptions& o) {
  auto bad = [](const char* field, int value, const std::string& want) {
    return InvalidArgument(std::string(field) + " must be " + want + ", got " +
                           std::to_string(value));
  };
  if (o.max_num_seqs < 1) return bad("max_num_seqs", o.max_num_seqs, ">= 1");
  if (o.max_num_batched_tokens < o.max_num_seqs) {
    // Every running sequence must be able to decode in one step.
    return bad("max_num_batched_tokens", o.max_num_batched_tokens,
               ">= max_num_seqs (" + std::to_string(o.max_num_seqs) + ")");
  }
  if (o.max_model_len < 2) return bad("max_model_len", o.max_model_len, ">= 2");
  if (!o.enable_chunked_prefill && o.max_num_batched_tokens < o.max_model_len) {
    // Without chunks a sequence (also when recomputed after preemption) runs in one step.
    return bad(
        "max_num_batched_tokens", o.max_num_batched_tokens,
        ">= max_model_len (" + std::to_string(o.max_model_len) + ") when chunked prefill is off");
  }
  return OkStatus();
}

}  // namespace

Result<std::unique_ptr<SteppedEngine>> CreateSteppedEngine(std::unique_ptr<ModelRunner> runner,
                                                           const EngineOptions& options,
                                                           std::unique_ptr<Drafter> draft) {
  if (runner == nullptr) return InvalidArgument("Engine needs a ModelRunner");
  EngineOptions opts = options;
  const int max_pos = runner->config().max_position_embeddings;
  if (max_pos > 0 && opts.scheduler.max_model_len > max_pos) {
    opts.scheduler.max_model_len = max_pos;  // the model knows no positions beyond it
  }
  RETURN_IF_ERROR(CheckOptions(opts.scheduler));
  RETURN_IF_ERROR(ValidateSpeculativeConfig(opts.speculative));
  const SpecMethod method = opts.speculative.method;
  if ((method == SpecMethod::kDraftModel || method == SpecMethod::kMtp) && draft == nullptr) {
    return Unimplemented("--speculative-config: method \"" + std::string(SpecMethodName(method)) +
                         "\" runs in an engine made by Engine::Create (which makes its drafter), "
                         "not on a given runner or data-parallel ranks");
  }
  if (draft != nullptr && draft->runner().region().num_pages() != runner->region().num_pages()) {
    return InvalidArgument("the draft model's KV region has " +
                           std::to_string(draft->runner().region().num_pages()) +
                           " pages, the target's " + std::to_string(runner->region().num_pages()));
  }
  if (runner->region().num_pages() < 1) return InvalidArgument("the KV cache has no pages");
  return std::unique_ptr<SteppedEngine>(new EngineImpl(std::move(runner), opts, std::move(draft)));
}

Result<std::unique_ptr<SteppedEngine>> CreateSteppedEngine(std::unique_ptr<ModelRunner> runner,
                                                           const EngineOptions& options) {
  return CreateSteppedEngine(std::move(runner), options, nullptr);
}

Result<std::unique_ptr<Engine>> Engine::CreateWithRunner(std::unique_ptr<ModelRunner> runner,
                                                         const EngineOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<SteppedEngine> engine,
                   CreateSteppedEngine(std::move(runner), options));
  return std::unique_ptr<Engine>(std::move(engine));
}

Result<std::unique_ptr<Engine>> Engine::Create(const model::ModelWeights& weights,
                                               const EngineOptions& options) {
  if (options.speculative.method == SpecMethod::kDraftModel)
    return CreateDraftModelEngine(weights, options);
  if (options.speculative.method == SpecMethod::kMtp) return CreateMtpEngine(weights, options);
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                   ModelRunner::Create(weights, options.runner));
  return CreateWithRunner(std::move(runner), options);
}

}  // namespace pd::engine
