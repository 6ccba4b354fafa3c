// The continuous-batching scheduler: a pure step function in the vLLM v1 style.
//
//   ScheduledBatch batch = scheduler.Schedule();   // which chunk of which sequence runs now
//   ... run the batch (ModelRunner, or a simulator's cost model) ...
//   scheduler.Update(batch, results);             // append sampled tokens, retire finished ones
//
// It knows sequences, token counts and a PagePool, nothing of the model: the engine drives it with
// a ModelRunner, the planner's simulator with a SimClock and a fake executor.
//
// Policy, per step:
//   1. running sequences that decode (one token each), oldest first;
//   2. running sequences still prefilling (a chunk each), oldest first;
//   2a. speculative drafts (SetDraftTokens) of the decodes scheduled in 1, in the same order,
//      while the budget and the free pages allow: a decode with K drafts runs K + 1 tokens and
//      yields up to K + 1 (its accepted drafts and one more). Drafts never preempt anyone.
//   3. waiting sequences, FCFS, while max_num_seqs and the token budget allow; a prompt larger
//      than the remaining budget gets a chunk (enable_chunked_prefill) or waits. Behind one that
//      waits for pages only sequences that already hold theirs (remote-KV, their KV arrived) pass.
// Pages are allocated as positions grow. When a running sequence needs a page and the pool is
// empty, the newest running sequence is preempted by recompute: its pages are released and it goes
// back to the front of the waiting queue, to re-prefill its prompt and generated tokens. No
// waiting sequence is admitted in a step that preempted.
//
// Callers guarantee progress: a sequence at its longest (prompt + max tokens) fits in the pool,
// and, without chunked prefill, in one step's budget (the Engine checks both).
//
// Disaggregation (docs/architecture.md, "Request flow, disaggregated") adds two kinds of sequence:
//   - prefill-only (prefill instance): its tokens are computed and never sampled; all its pages
//     are allocated when it is admitted and it is never a preemption victim, so the messenger can
//     stream its pages while it runs. Its last chunk `samples` like any other: the engine turns
//     that into a hand-over of the pages instead of a token.
//   - remote-KV (decode instance): its prompt's KV arrives from elsewhere. ReserveRemoteKv()
//     allocates pages for the whole prompt (FCFS, when the free pages hold them), sharing the
//     leading pages the prefix cache holds (num_cached_pages: only the rest must arrive); it
//     then waits, out of scheduling and never a victim, until MarkKvReady; then
//     num_computed_tokens is prompt - 1 and its last prompt token runs as its first decode step. It
//     holds its pages while it waits, so it passes a waiting sequence that needs pages (which might
//     be its own), and no reservation is made while a waiting sequence needs pages (it came first).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "engine/engine.h"
#include "engine/kv_cache.h"

namespace pd::engine {

enum class SeqState {
  kWaiting,
  kRunning,
  kAwaitingPages,  // remote-KV: queued for its page reservation
  kAwaitingKv,     // remote-KV: pages reserved, waiting for MarkKvReady
};

// One sequence as the scheduler sees it.
struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> token_ids;  // prompt, then generated tokens
  int num_prompt_tokens = 0;
  int num_computed_tokens = 0;      // leading tokens whose KV is in the cache
  std::vector<int32_t> page_table;  // covers num_computed_tokens (+ the scheduled chunk)
  SeqState state = SeqState::kWaiting;
  double arrival_time = 0.0;
  double first_scheduled_time = -1.0;  // -1 until first scheduled
  int num_preemptions = 0;
  bool prefill_only = false;  // computed, never sampled; pages allocated whole at admission
  bool remote_kv = false;     // the prompt's KV (all but the last token) arrives from elsewhere
  // Prefix cache: keys of the leading full pages of token_ids (as far as computed so far), the
  // leading pages of page_table that are in the cache (taken from it or registered), whether
  // registering stopped (another page holds a key: those after it cannot be found), and the
  // prompt tokens found cached at the first admission (-1 before it).
  std::vector<uint64_t> page_keys;
  int num_cached_pages = 0;
  bool cache_chain_broken = false;
  int num_cached_tokens = -1;
  // Speculative decoding: tokens proposed to follow token_ids, verified at the next decode step.
  // Never counted as computed or cached before they are accepted.
  std::vector<int32_t> draft_token_ids;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_generated_tokens() const { return num_tokens() - num_prompt_tokens; }
};

// One sequence's part of a step: tokens [start_pos, start_pos + num_tokens) of `seq`.
struct ScheduledSeq {
  const Sequence* seq = nullptr;  // valid until Update, Abort or the next Schedule
  int64_t seq_id = 0;
  int start_pos = 0;
  int num_tokens = 0;
  bool is_decode = false;  // one token after the prompt (and any re-prefill) was computed
  bool samples = false;    // the chunk ends at the sequence's last token: the step yields a token
  // A decode verifying drafts: num_tokens is 1 + num_draft_tokens, the last token then
  // seq->draft_token_ids[0, num_draft_tokens).
  int num_draft_tokens = 0;
  int context_len() const { return start_pos + num_tokens; }
};

struct ScheduledBatch {
  std::vector<ScheduledSeq> seqs;  // decodes first, then prefill chunks
  int num_prefill_tokens = 0;
  int num_decode_tokens = 0;
  std::vector<int64_t> preempted_seq_ids;  // preempted while building this batch
  double time = 0.0;                       // clock seconds when scheduled
  bool empty() const { return seqs.empty(); }
  int num_tokens() const { return num_prefill_tokens + num_decode_tokens; }
};

// What the step produced for one scheduled sequence.
struct SeqUpdate {
  int64_t seq_id = 0;
  int32_t new_token_id = -1;  // appended when the scheduled chunk `samples`; ignored otherwise
  bool finished = false;      // release the sequence (only meaningful when it sampled)
  // Verification: the leading drafts kept, appended (and counted computed) before new_token_id.
  // The KV of the drafts after them is dropped: their pages past the sequence's end go back.
  int num_accepted_drafts = 0;
};

// Thread safety: not thread-safe; one thread (the engine loop or the simulator) calls everything.
class Scheduler {
 public:
  // `pool` and `clock` are borrowed and must outlive the scheduler.
  Scheduler(const SchedulerOptions& options, PagePool* pool, int page_size, const Clock* clock);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a new sequence (waiting, FCFS by call order). AlreadyExists for a live id;
  // InvalidArgument for an empty prompt.
  Status AddSequence(int64_t id, std::vector<int32_t> prompt_ids, double arrival_time);
  // A prefill-only sequence (see the top of this file). Errors as AddSequence.
  Status AddPrefillOnlySequence(int64_t id, std::vector<int32_t> prompt_ids, double arrival_time);
  // A remote-KV sequence, queued for its page reservation. Errors as AddSequence.
  Status AddRemoteKvSequence(int64_t id, std::vector<int32_t> prompt_ids, double arrival_time);
  // Reserves pages for queued remote-KV sequences, FCFS while the free pages hold the next one's
  // prompt and no waiting sequence needs pages (it came first); returns the ids reserved now
  // (their page tables: Find(id)->page_table).
  std::vector<int64_t> ReserveRemoteKv();
  // The KV of a reserved remote-KV sequence has arrived: it joins the front of the waiting queue.
  // NotFound for an unknown id, FailedPrecondition when it is not awaiting its KV.
  Status MarkKvReady(int64_t id);
  // Removes the sequence wherever it is and releases its pages now. False if unknown.
  // Not to be called between Schedule and Update for a sequence of that batch.
  bool Abort(int64_t id);

  // Drafts for the next decode step of a running sequence whose next step is a decode (others:
  // ignored, false). Replaces earlier drafts; cleared by every Update and by preemption.
  bool SetDraftTokens(int64_t id, std::vector<int32_t> draft_ids);
  // Grows a running sequence's page table towards num_tokens tokens from the free pages, never
  // preempting (a draft model writes its drafts' KV there before they are scheduled); returns
  // the tokens the table covers now (0 for an unknown id). Update gives back what the sequence's
  // tokens do not need; a sequence that needs a page takes them back (with the drafts) before
  // anyone is preempted.
  int ReserveDraftPages(int64_t id, int num_tokens);

  ScheduledBatch Schedule();
  // Advances every scheduled sequence by its chunk, appends sampled tokens and releases finished
  // sequences. Updates for ids no longer known (aborted) are ignored.
  void Update(const ScheduledBatch& batch, std::span<const SeqUpdate> updates);

  const Sequence* Find(int64_t id) const;
  bool HasWork() const { return !waiting_.empty() || !running_.empty(); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_awaiting_pages() const { return static_cast<int>(reserve_queue_.size()); }
  int num_awaiting_kv() const { return num_awaiting_kv_; }
  // The pages of every sequence whose pages are reserved and whose KV has not arrived yet.
  std::vector<int32_t> AwaitingKvPages() const;
  int64_t num_preemptions() const { return num_preemptions_; }
  // Prefix cache counters (EngineStats): prompt tokens looked up and found.
  int64_t prefix_cache_queries() const { return prefix_cache_queries_; }
  int64_t prefix_cache_hits() const { return prefix_cache_hits_; }
  int page_size() const { return page_size_; }
  // Pages a sequence of num_tokens tokens occupies.
  int PagesFor(int num_tokens) const { return (num_tokens + page_size_ - 1) / page_size_; }
  const SchedulerOptions& options() const { return options_; }
  const PagePool& pool() const { return *pool_; }
  // Recounts the pages (a debug check, O(pages)): the pool is consistent (PagePool::
  // CheckConsistency) and every page in a sequence's table has at least that many references.
  Status CheckPages() const;

 private:
  struct StepState;
  bool GrowPages(Sequence* seq, int num_tokens);
  bool ReservePrompt(Sequence* seq);  // a remote-KV sequence's pages (false: not enough free)
  void Preempt(Sequence* seq);
  void ScheduleRunning(StepState* step, bool decodes);
  void ScheduleWaiting(StepState* step);
  void ScheduleDrafts(StepState* step);
  // Gives back the pages past those the sequence's tokens need (rejected drafts' KV).
  void TrimPages(Sequence* seq);
  // A running sequence needs a page and none is free: before anyone is preempted, the pages
  // reserved for drafts (ReserveDraftPages) of sequences not verifying in `batch` go back, and
  // those drafts with them. True when any page was given back.
  bool ReclaimDraftPages(const ScheduledBatch& batch);
  // True when running num_new more tokens of `seq` needs pages its table lacks.
  bool NeedsPages(const Sequence& seq, int num_new) const;
  // A waiting sequence needs pages it does not hold (one holding all it needs is a remote-KV
  // sequence whose KV arrived).
  bool WaitingNeedsPages() const;
  Sequence* PickVictim();
  // Prefix cache: the cached pages of a waiting sequence's prefix (none unless it may use the
  // cache), pages for it to run num_new more tokens after them (false: not enough, nothing
  // taken), and the registration of its computed full pages.
  bool UsesPrefixCache(const Sequence& seq) const;
  std::vector<int32_t> CachedPrefix(Sequence* seq);
  bool TakePrefixPages(Sequence* seq, std::span<const int32_t> hits, int num_new);
  void CacheComputedPages(Sequence* seq);
  Status Add(int64_t id, std::vector<int32_t> prompt_ids, double arrival_time, Sequence** added);

  const SchedulerOptions options_;
  PagePool* const pool_;
  const int page_size_;
  const Clock* const clock_;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;        // FCFS; preempted sequences go to the front
  std::vector<Sequence*> running_;       // in admission order: back() is the newest
  std::deque<Sequence*> reserve_queue_;  // remote-KV sequences waiting for pages, FCFS
  int num_awaiting_kv_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t prefix_cache_queries_ = 0;
  int64_t prefix_cache_hits_ = 0;
};

}  // namespace pd::engine
