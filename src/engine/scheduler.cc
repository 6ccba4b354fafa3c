#include "engine/scheduler.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/check.h"
#include "engine/prefix_cache.h"

namespace pd::engine {

struct Scheduler::StepState {
  ScheduledBatch batch;
  int budget = 0;          // tokens left this step
  bool preempted = false;  // a preemption happened: admit nothing new this step
};

Scheduler::Scheduler(const SchedulerOptions& options, PagePool* pool, int page_size,
                     const Clock* clock)
    : options_(options), pool_(pool), page_size_(page_size), clock_(clock) {
  PD_CHECK(pool_ != nullptr);
  PD_CHECK(clock_ != nullptr);
  PD_CHECK(page_size_ > 0);
  PD_CHECK(options_.max_num_seqs > 0);
  PD_CHECK(options_.max_num_batched_tokens > 0);
}

Scheduler::~Scheduler() {
  for (auto& [id, seq] : seqs_) pool_->Release(seq->page_table);
}

Status Scheduler::Add(int64_t id, std::vector<int32_t> prompt_ids, double arrival_time,
                      Sequence** added) {
  if (prompt_ids.empty()) {
    return InvalidArgument("sequence " + std::to_string(id) + ": empty prompt");
  }
  if (seqs_.count(id) != 0) {
    return AlreadyExists("sequence " + std::to_string(id) + " is already scheduled");
  }
  auto seq = std::make_unique<Sequence>();
  seq->id = id;
  seq->num_prompt_tokens = static_cast<int>(prompt_ids.size());
  seq->token_ids = std::move(prompt_ids);
  seq->arrival_time = arrival_time;
  *added = seq.get();
  seqs_.emplace(id, std::move(seq));
  return OkStatus();
}

Status Scheduler::AddSequence(int64_t id, std::vector<int32_t> prompt_ids, double arrival_time) {
  Sequence* seq = nullptr;
  RETURN_IF_ERROR(Add(id, std::move(prompt_ids), arrival_time, &seq));
  waiting_.push_back(seq);
  return OkStatus();
}

Status Scheduler::AddPrefillOnlySequence(int64_t id, std::vector<int32_t> prompt_ids,
                                         double arrival_time) {
  Sequence* seq = nullptr;
  RETURN_IF_ERROR(Add(id, std::move(prompt_ids), arrival_time, &seq));
  seq->prefill_only = true;
  waiting_.push_back(seq);
  return OkStatus();
}

Status Scheduler::AddRemoteKvSequence(int64_t id, std::vector<int32_t> prompt_ids,
                                      double arrival_time) {
  Sequence* seq = nullptr;
  RETURN_IF_ERROR(Add(id, std::move(prompt_ids), arrival_time, &seq));
  seq->remote_kv = true;
  seq->state = SeqState::kAwaitingPages;
  reserve_queue_.push_back(seq);
  return OkStatus();
}

std::vector<int64_t> Scheduler::ReserveRemoteKv() {
  std::vector<int64_t> reserved;
  // A waiting sequence (preempted, or new) came first: the pages it needs are not reserved away
  // from it (else a stream of transfers could keep a preempted sequence waiting for ever).
  if (WaitingNeedsPages()) return reserved;
  while (!reserve_queue_.empty()) {
    Sequence* seq = reserve_queue_.front();
    if (!ReservePrompt(seq)) break;  // FCFS: nobody jumps ahead
    reserve_queue_.pop_front();
    seq->state = SeqState::kAwaitingKv;
    seq->num_computed_tokens = seq->num_prompt_tokens - 1;
    ++num_awaiting_kv_;
    reserved.push_back(seq->id);
  }
  return reserved;
}

// The whole prompt's pages for a remote-KV sequence: its cached prefix (whole pages, never the
// page of its last token, which runs here) shared from the prefix cache, the rest new. Counted
// in the prefix cache's queries and hits like any first admission.
bool Scheduler::ReservePrompt(Sequence* seq) {
  if (!options_.enable_prefix_caching || !pool_->prefix_caching() || !seq->page_table.empty())
    return GrowPages(seq, seq->num_prompt_tokens);
  const std::vector<int32_t> hits = CachedPrefix(seq);
  const int num_new = seq->num_prompt_tokens - static_cast<int>(hits.size()) * page_size_;
  return TakePrefixPages(seq, hits, num_new);
}

Status Scheduler::MarkKvReady(int64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFound("sequence " + std::to_string(id) + " is not known");
  Sequence* seq = it->second.get();
  if (seq->state != SeqState::kAwaitingKv) {
    return FailedPrecondition("sequence " + std::to_string(id) + " is not awaiting its KV");
  }
  seq->state = SeqState::kWaiting;
  --num_awaiting_kv_;
  waiting_.push_front(seq);  // it has waited for its transfer already
  return OkStatus();
}

bool Scheduler::Abort(int64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  Sequence* seq = it->second.get();
  pool_->Release(seq->page_table);
  switch (seq->state) {
    case SeqState::kRunning:
      running_.erase(std::find(running_.begin(), running_.end(), seq));
      break;
    case SeqState::kWaiting:
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
      break;
    case SeqState::kAwaitingPages:
      reserve_queue_.erase(std::find(reserve_queue_.begin(), reserve_queue_.end(), seq));
      break;
    case SeqState::kAwaitingKv:
      --num_awaiting_kv_;
      break;
  }
  seqs_.erase(it);
  return true;
}

const Sequence* Scheduler::Find(int64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

bool Scheduler::GrowPages(Sequence* seq, int num_tokens) {
  int needed = PagesFor(num_tokens) - static_cast<int>(seq->page_table.size());
  if (needed <= 0) return true;
  auto pages = pool_->Allocate(needed);
  if (!pages.ok()) return false;
  seq->page_table.insert(seq->page_table.end(), pages->begin(), pages->end());
  return true;
}

void Scheduler::Preempt(Sequence* seq) {
  PD_CHECK(seq->state == SeqState::kRunning);
  pool_->Release(seq->page_table);
  seq->page_table.clear();
  seq->num_computed_tokens = 0;
  seq->num_cached_pages = 0;  // its registered pages stay cached (evictable): it may find them
  seq->cache_chain_broken = false;
  seq->draft_token_ids.clear();
  seq->state = SeqState::kWaiting;
  seq->num_preemptions++;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
  num_preemptions_++;
}

// The newest running sequence that may be recomputed: never a prefill-only one, whose pages the
// messenger may be reading.
Sequence* Scheduler::PickVictim() {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (!(*it)->prefill_only) return *it;
  }
  return nullptr;
}

namespace {

// One token left to compute and it comes after the prompt, or it is the last prompt token of a
// remote-KV sequence whose other prompt tokens arrived from a prefill instance.
bool IsDecodeStep(const Sequence& seq, int start_pos, int num_new) {
  if (num_new != 1 || start_pos + 1 != seq.num_tokens()) return false;
  return start_pos >= seq.num_prompt_tokens ||
         (seq.remote_kv && start_pos == seq.num_prompt_tokens - 1);
}

// Tokens the page table must cover before `num_new` more tokens run: prefill-only sequences get
// all their pages at once.
int PagesTarget(const Sequence& seq, int num_new) {
  return seq.prefill_only ? seq.num_tokens() : seq.num_computed_tokens + num_new;
}

void AddToBatch(ScheduledBatch* batch, const Sequence* seq, int num_new) {
  ScheduledSeq s;
  s.seq = seq;
  s.seq_id = seq->id;
  s.start_pos = seq->num_computed_tokens;
  s.num_tokens = num_new;
  s.samples = s.start_pos + num_new == seq->num_tokens();
  s.is_decode = IsDecodeStep(*seq, s.start_pos, num_new);
  (s.is_decode ? batch->num_decode_tokens : batch->num_prefill_tokens) += num_new;
  batch->seqs.push_back(s);
}

// Removes `id` from the batch; returns the tokens it had (0 if it was not there).
int RemoveFromBatch(ScheduledBatch* batch, int64_t id) {
  auto it = std::find_if(batch->seqs.begin(), batch->seqs.end(),
                         [id](const ScheduledSeq& s) { return s.seq_id == id; });
  if (it == batch->seqs.end()) return 0;
  int n = it->num_tokens;
  (it->is_decode ? batch->num_decode_tokens : batch->num_prefill_tokens) -= n;
  batch->seqs.erase(it);
  return n;
}

bool InBatch(const ScheduledBatch& batch, int64_t id) {
  return std::any_of(batch.seqs.begin(), batch.seqs.end(),
                     [id](const ScheduledSeq& s) { return s.seq_id == id; });
}

}  // namespace

void Scheduler::ScheduleRunning(StepState* step, bool decodes) {
  const std::vector<Sequence*> snapshot = running_;  // preemption edits running_
  for (Sequence* seq : snapshot) {
    if (step->budget <= 0) return;
    if (seq->state != SeqState::kRunning || InBatch(step->batch, seq->id)) continue;
    int remaining = seq->num_tokens() - seq->num_computed_tokens;
    PD_CHECK(remaining > 0) << "sequence " << seq->id << " has nothing to compute";
    bool is_decode = IsDecodeStep(*seq, seq->num_computed_tokens, remaining);
    if (is_decode != decodes) continue;
    if (remaining > step->budget && !options_.enable_chunked_prefill) continue;
    int num_new = std::min(remaining, step->budget);
    bool scheduled = true;
    while (!GrowPages(seq, PagesTarget(*seq, num_new))) {
      if (ReclaimDraftPages(step->batch)) continue;  // drafts never cause a preemption
      Sequence* victim = PickVictim();
      // A prefill-only sequence has all its pages: only a normal one (itself a candidate) grows.
      PD_CHECK(victim != nullptr);
      step->budget += RemoveFromBatch(&step->batch, victim->id);
      step->batch.preempted_seq_ids.push_back(victim->id);
      step->preempted = true;
      Preempt(victim);
      if (victim == seq) {
        scheduled = false;
        break;
      }
    }
    if (!scheduled) continue;
    AddToBatch(&step->batch, seq, num_new);
    step->budget -= num_new;
  }
}

bool Scheduler::SetDraftTokens(int64_t id, std::vector<int32_t> draft_ids) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  Sequence* seq = it->second.get();
  const int remaining = seq->num_tokens() - seq->num_computed_tokens;
  if (seq->state != SeqState::kRunning || seq->prefill_only ||
      !IsDecodeStep(*seq, seq->num_computed_tokens, remaining)) {
    seq->draft_token_ids.clear();
    return false;
  }
  seq->draft_token_ids = std::move(draft_ids);
  return true;
}

bool Scheduler::ReclaimDraftPages(const ScheduledBatch& batch) {
  bool any = false;
  for (Sequence* seq : running_) {
    if (static_cast<int>(seq->page_table.size()) <= PagesFor(seq->num_tokens())) continue;
    const bool verifying = std::any_of(
        batch.seqs.begin(), batch.seqs.end(),
        [&](const ScheduledSeq& s) { return s.seq_id == seq->id && s.num_draft_tokens > 0; });
    if (verifying) continue;
    seq->draft_token_ids.clear();  // their KV was in the pages given back
    TrimPages(seq);
    any = true;
  }
  return any;
}

int Scheduler::ReserveDraftPages(int64_t id, int num_tokens) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return 0;
  Sequence* seq = it->second.get();
  PD_CHECK(seq->state == SeqState::kRunning) << "sequence " << seq->id << " is not running";
  const int need = PagesFor(num_tokens) - static_cast<int>(seq->page_table.size());
  for (int n = need; n > 0 && !GrowPages(seq, num_tokens); --n) {
    num_tokens -= page_size_;  // as many of the pages as the pool has
  }
  return static_cast<int>(seq->page_table.size()) * page_size_;
}

void Scheduler::ScheduleDrafts(StepState* step) {
  for (ScheduledSeq& s : step->batch.seqs) {
    if (step->budget <= 0) return;
    if (!s.is_decode) continue;
    Sequence* seq = seqs_.at(s.seq_id).get();
    const int k = std::min(static_cast<int>(seq->draft_token_ids.size()), step->budget);
    if (k == 0 || !GrowPages(seq, seq->num_computed_tokens + 1 + k)) continue;
    s.num_tokens += k;
    s.num_draft_tokens = k;
    step->batch.num_decode_tokens += k;
    step->budget -= k;
  }
}

void Scheduler::TrimPages(Sequence* seq) {
  const size_t keep = static_cast<size_t>(PagesFor(seq->num_tokens()));
  if (seq->page_table.size() <= keep) return;
  pool_->Release(std::span<const int32_t>(seq->page_table).subspan(keep));
  seq->page_table.resize(keep);
}

void Scheduler::ScheduleWaiting(StepState* step) {
  if (step->preempted) return;
  // Once a sequence waits for pages, only those holding every page they need (a remote-KV one
  // whose KV has arrived) may pass it: they take nothing from the pool, and the pages it waits
  // for may be theirs, freed only when they run.
  bool blocked = false;
  auto it = waiting_.begin();
  while (it != waiting_.end() && step->budget > 0 &&
         static_cast<int>(running_.size()) < options_.max_num_seqs) {
    Sequence* seq = *it;
    if (blocked) {
      const int remaining = seq->num_tokens() - seq->num_computed_tokens;
      const bool fits = remaining <= step->budget || options_.enable_chunked_prefill;
      if (!fits || NeedsPages(*seq, std::min(remaining, step->budget))) {
        ++it;
        continue;
      }
    } else {
      const bool lookup = UsesPrefixCache(*seq);
      const std::vector<int32_t> hits = lookup ? CachedPrefix(seq) : std::vector<int32_t>();
      const int computed = seq->num_computed_tokens + static_cast<int>(hits.size()) * page_size_;
      const int remaining = seq->num_tokens() - computed;
      if (remaining > step->budget && !options_.enable_chunked_prefill) return;  // FCFS
      const int num_new = std::min(remaining, step->budget);
      if (lookup ? !TakePrefixPages(seq, hits, num_new)
                 : !GrowPages(seq, PagesTarget(*seq, num_new))) {
        blocked = true;
        ++it;
        continue;
      }
    }
    const int num_new = std::min(seq->num_tokens() - seq->num_computed_tokens, step->budget);
    it = waiting_.erase(it);
    seq->state = SeqState::kRunning;
    running_.push_back(seq);
    if (seq->first_scheduled_time < 0) seq->first_scheduled_time = step->batch.time;
    AddToBatch(&step->batch, seq, num_new);
    step->budget -= num_new;
  }
}

bool Scheduler::UsesPrefixCache(const Sequence& seq) const {
  // A remote-KV sequence looks its prompt up when its pages are reserved (ReservePrompt), not
  // here; it registers the pages that arrived once they have run (CacheComputedPages).
  return options_.enable_prefix_caching && pool_->prefix_caching() && !seq.remote_kv &&
         seq.page_table.empty() && seq.num_computed_tokens == 0;
}

std::vector<int32_t> Scheduler::CachedPrefix(Sequence* seq) {
  // The last token is always computed: it yields the logits (or the hidden state) of the step.
  const int max_pages = (seq->num_tokens() - 1) / page_size_;
  const std::span<const int32_t> tokens(seq->token_ids);
  ExtendPageKeys(options_.prefix_cache_root, tokens.first(size_t(max_pages) * page_size_),
                 page_size_, &seq->page_keys);
  const size_t n = std::min(seq->page_keys.size(), static_cast<size_t>(max_pages));
  return pool_->MatchPrefix(std::span<const uint64_t>(seq->page_keys).first(n), tokens);
}

bool Scheduler::TakePrefixPages(Sequence* seq, std::span<const int32_t> hits, int num_new) {
  const int num_hits = static_cast<int>(hits.size());
  const int computed = num_hits * page_size_;
  const int target = seq->prefill_only ? seq->num_tokens() : computed + num_new;
  auto pages = pool_->AcquirePrefix(hits, PagesFor(target) - num_hits);
  if (!pages.ok()) return false;
  seq->page_table = *std::move(pages);
  seq->num_computed_tokens = computed;
  seq->num_cached_pages = num_hits;
  seq->cache_chain_broken = false;
  if (seq->num_cached_tokens < 0) {
    // vLLM v1 counts a request's first lookup only, not those after a preemption.
    seq->num_cached_tokens = computed;
    prefix_cache_queries_ += seq->num_tokens();
    prefix_cache_hits_ += computed;
  }
  return true;
}

void Scheduler::CacheComputedPages(Sequence* seq) {
  if (!options_.enable_prefix_caching || !pool_->prefix_caching() || seq->cache_chain_broken)
    return;
  const int full =
      std::min(seq->num_computed_tokens / page_size_, static_cast<int>(seq->page_table.size()));
  if (full <= seq->num_cached_pages) return;
  const std::span<const int32_t> tokens(seq->token_ids);
  ExtendPageKeys(options_.prefix_cache_root, tokens.first(size_t(full) * page_size_), page_size_,
                 &seq->page_keys);
  for (int i = seq->num_cached_pages; i < full; ++i) {
    const int32_t parent = i == 0 ? -1 : seq->page_table[i - 1];
    if (!pool_->Register(seq->page_table[i], parent, seq->page_keys[i],
                         tokens.subspan(size_t(i) * page_size_, page_size_))) {
      seq->cache_chain_broken = true;  // another page holds this prefix (computed alongside)
      return;
    }
    seq->num_cached_pages = i + 1;
  }
}

Status Scheduler::CheckPages() const {
  RETURN_IF_ERROR(pool_->CheckConsistency());
  std::unordered_map<int32_t, int> held;  // references the sequences' page tables account for
  for (const auto& [id, seq] : seqs_) {
    for (int32_t p : seq->page_table) ++held[p];
  }
  for (const auto& [page, count] : held) {
    if (pool_->RefCount(page) < count)
      return Internal("page " + std::to_string(page) + " is in " + std::to_string(count) +
                      " page tables but has " + std::to_string(pool_->RefCount(page)) +
                      " references");
  }
  return OkStatus();
}

bool Scheduler::NeedsPages(const Sequence& seq, int num_new) const {
  return PagesFor(PagesTarget(seq, num_new)) > static_cast<int>(seq.page_table.size());
}

bool Scheduler::WaitingNeedsPages() const {
  return std::any_of(waiting_.begin(), waiting_.end(), [&](const Sequence* seq) {
    return NeedsPages(*seq, seq->num_tokens() - seq->num_computed_tokens);
  });
}

ScheduledBatch Scheduler::Schedule() {
  StepState step;
  step.budget = options_.max_num_batched_tokens;
  step.batch.time = clock_->NowSeconds();
  ScheduleRunning(&step, /*decodes=*/true);
  ScheduleDrafts(&step);
  ScheduleRunning(&step, /*decodes=*/false);
  ScheduleWaiting(&step);
  return std::move(step.batch);
}

void Scheduler::Update(const ScheduledBatch& batch, std::span<const SeqUpdate> updates) {
  std::unordered_map<int64_t, const SeqUpdate*> by_id;
  by_id.reserve(updates.size());
  for (const SeqUpdate& u : updates) by_id[u.seq_id] = &u;
  for (const ScheduledSeq& s : batch.seqs) {
    auto it = seqs_.find(s.seq_id);
    if (it == seqs_.end()) continue;  // aborted since Schedule
    Sequence* seq = it->second.get();
    PD_CHECK(seq->state == SeqState::kRunning && seq->num_computed_tokens == s.start_pos)
        << "sequence " << seq->id << " changed between Schedule and Update";
    auto u = by_id.find(s.seq_id);
    const int kept =
        u == by_id.end() ? 0 : std::clamp(u->second->num_accepted_drafts, 0, s.num_draft_tokens);
    // Only the last token and the accepted drafts have their KV: the rest is overwritten later.
    seq->num_computed_tokens += s.num_tokens - s.num_draft_tokens + kept;
    if (s.samples) {
      PD_CHECK(u != by_id.end()) << "sequence " << seq->id << " sampled but got no update";
      seq->token_ids.insert(seq->token_ids.end(), seq->draft_token_ids.begin(),
                            seq->draft_token_ids.begin() + kept);
      seq->token_ids.push_back(u->second->new_token_id);
    }
    seq->draft_token_ids.clear();
    CacheComputedPages(seq);
    if (u != by_id.end() && u->second->finished) {
      Abort(seq->id);
    } else {
      TrimPages(seq);  // rejected drafts' pages, and those reserved for drafts not scheduled
    }
  }
}

std::vector<int32_t> Scheduler::AwaitingKvPages() const {
  std::vector<int32_t> pages;
  if (num_awaiting_kv_ == 0) return pages;
  for (const auto& [id, seq] : seqs_) {
    if (seq->state == SeqState::kAwaitingKv) {
      pages.insert(pages.end(), seq->page_table.begin(), seq->page_table.end());
    }
  }
  return pages;
}

}  // namespace pd::engine
