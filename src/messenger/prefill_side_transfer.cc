// The prefill messenger's transfer tracking: engine events (the step observer's chunks become
// LayerWork, the engine's final output), posting each layer's page writes once the runner's
// progress says the layer is final, the metadata write, write completions, and a transfer's end
// (Fail, TryFinish, deadlines). Lifecycle and control messages are in prefill_side.cc; Impl's
// definition in prefill_side_impl.h.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "messenger/prefill_side_impl.h"

namespace pd::messenger {

// ------------------------------------------------------------------ engine events

Status PrefillMessenger::Impl::LocalPages(const std::vector<int32_t>& pages, int dp_rank,
                                          std::vector<int32_t>* local) const {
  *local = pages;
  if (dp_size_ == 1) return OkStatus();
  const int32_t per_rank = runner_.region().num_pages();
  for (int32_t& p : *local) {
    if (engine::DpRankOfPage(p, per_rank) != dp_rank)
      return Internal("page " + std::to_string(p) + " is not DP rank " + std::to_string(dp_rank) +
                      "'s");
    p = engine::DpLocalPage(p, per_rank);
  }
  return OkStatus();
}

void PrefillMessenger::Impl::OnStep(const engine::StepInfo& info) {
  // With DP ranks each rank's steps come apart, numbered by its own runner: the chunks' pages
  // say which rank's (every chunk has its request's whole page table).
  int rank = 0;
  if (dp_size_ > 1 && !info.prefill_chunks.front().page_table.empty())
    rank = engine::DpRankOfPage(info.prefill_chunks.front().page_table.front(),
                                runner_.region().num_pages());
  // A step index seen again means the step that had it failed before running: forget its work.
  work_.erase(std::remove_if(work_.begin(), work_.end(),
                             [&](const LayerWork& w) {
                               return w.dp_rank == rank && w.runner_step >= info.runner_step;
                             }),
              work_.end());
  for (const engine::PrefillChunk& c : info.prefill_chunks) {
    auto it = by_engine_id_.find(c.request_id);
    if (it == by_engine_id_.end()) continue;
    Transfer* t = Find(it->second);
    if (t == nullptr || !t->error.ok()) continue;
    std::vector<int32_t> pages;
    if (Status s = LocalPages(c.page_table, rank, &pages); !s.ok()) {
      Fail(t, s.WithContext("request " + std::to_string(t->request_id)));
      continue;
    }
    if (t->src_pages.empty()) {
      t->src_pages = pages;
      // DP ranks: planned as from a TP 1 instance, whose one source is the request's DP rank.
      if (dp_size_ > 1)
        for (ShardSlice& slice : t->plan.slices) slice.src_rank = rank;
    }
    if (t->src_pages != pages || t->src_pages.size() != t->dst_pages.size()) {
      Fail(t, Internal("the engine's page table of request " + std::to_string(t->request_id) +
                       " changed or does not match the destination pages"));
      continue;
    }
    const int end = c.start_pos + c.num_tokens;
    const int target =
        c.is_last_chunk ? (end + spec_.page_size - 1) / spec_.page_size : end / spec_.page_size;
    if (target > t->pages_scheduled || c.is_last_chunk) {
      work_.push_back(
          {t->request_id, info.runner_step, t->pages_scheduled, target, 0, c.is_last_chunk, rank});
      t->pages_scheduled = target;
    }
  }
}

void PrefillMessenger::Impl::OnEngineDone(const engine::RequestOutput& out) {
  auto it = by_engine_id_.find(out.request_id);
  if (it == by_engine_id_.end()) return;
  Transfer* t = Find(it->second);
  by_engine_id_.erase(it);
  if (t == nullptr) {  // set aside before its engine request ended
    if (out.prefill_result) engine_->ReleasePages(out.prefill_result->page_table);
    return;
  }
  t->engine_done = true;
  if (out.prefill_result) {
    t->kept_pages = out.prefill_result->page_table;
    t->last_hidden = out.prefill_result->last_hidden;
  } else if (t->error.ok()) {
    Fail(t, out.error.ok() ? Cancelled("the prefill engine aborted the request") : out.error);
    return;
  }
  const uint64_t request_id = t->request_id;
  MaybePostMetadata(t);  // a refused post fails t, which may free it
  if (Transfer* still = Find(request_id)) TryFinish(still);
}

// ------------------------------------------------------------------ writes

void PrefillMessenger::Impl::PostReady(const std::vector<uint64_t>& progress) {
  for (LayerWork& w : work_) {
    Transfer* t = Find(w.request_id);
    if (t == nullptr || !t->error.ok()) {
      w.next_layer = num_layers_;  // dropped below
      continue;
    }
    while (w.next_layer < num_layers_ &&
           progress[w.dp_rank] >= w.runner_step * num_layers_ + w.next_layer + 1) {
      if (w.end_page > w.first_page) PostLayer(t, w, w.next_layer);
      ++w.next_layer;
      if (!t->error.ok()) break;
    }
    if (w.next_layer == num_layers_ && w.is_last && t->error.ok()) {
      t->kv_posted = true;
      if (options_.kv_checksum) PostChecksums(t);
      MaybePostMetadata(t);
    }
  }
  work_.erase(std::remove_if(work_.begin(), work_.end(),
                             [&](const LayerWork& w) { return w.next_layer >= num_layers_; }),
              work_.end());
}

transfer::Completion PrefillMessenger::Impl::WriteDone(uint64_t request_id, size_t nic,
                                                       std::shared_ptr<transfer::TransferId> id) {
  std::weak_ptr<TaskQueue> weak = queue_;
  return [this, weak, request_id, nic, id](const Status& status) {
    if (auto q = weak.lock()) {
      q->Post([this, request_id, nic, id, status] {
        OnWriteDone(request_id, InflightKey(nic, *id), status);
      });
    }
  };
}

void PrefillMessenger::Impl::Track(Transfer* t, Result<uint64_t> key, uint32_t imm, uint64_t bytes,
                                   uint32_t writes, bool count) {
  if (!key.ok()) {
    Fail(t, key.status().WithContext("posting KV writes"));
    return;
  }
  t->outstanding++;
  t->inflight[*key] = {imm, NowSeconds()};
  if (!count) return;
  t->num_writes += writes;
  t->bytes += bytes;
}

// One paged write per run of the transfer's shard plan: from the run's source rank's region into
// its destination rank's region, for pages [w.first_page, w.end_page) of layer `layer`.
void PrefillMessenger::Impl::PostLayer(Transfer* t, const LayerWork& w, int layer) {
  const int64_t begin_ns = options_.tracer != nullptr ? Tracer::NowNs() : 0;
  std::vector<uint32_t> src_pages, dst_pages;
  for (int k = w.first_page; k < w.end_page; ++k) {
    src_pages.push_back(static_cast<uint32_t>(t->src_pages[k]));
    dst_pages.push_back(static_cast<uint32_t>(t->dst_pages[k]));
  }
  const uint32_t n = static_cast<uint32_t>(src_pages.size());
  const RunGeometry g{layer, static_cast<uint64_t>(runner_.region().num_pages()), t->dst_num_pages,
                      0, 0};
  uint64_t layer_bytes = 0;
  uint32_t layer_writes = 0;
  Result<uint64_t> last = Internal("no run");
  for (const ShardSlice& slice : t->plan.slices) {
    for (const PageRun& run : slice.runs) {
      KvWrite kw;
      kw.src_rank = slice.src_rank;
      kw.dst_rank = slice.dst_rank;
      kw.shape.src_pages = src_pages;
      kw.shape.dst_pages = dst_pages;
      SetRunGeometry(t->plan, run, g, &kw.shape);
      last = PostKv(t, kw, /*count=*/true);
      layer_bytes += uint64_t{n} * run.bytes;
      layer_writes += n;
      if (!t->error.ok()) return;
      t->log.push_back(std::move(kw));
      t->kv_bytes += uint64_t{n} * run.bytes;
      owner_->metrics_.RankWrites(slice.src_rank, n);
    }
  }
  if (options_.kv_checksum) ChecksumLayer(t, w, layer);  // while the writes fly
  if (options_.tracer != nullptr) {
    TracePosted(last, t->request_id, layer, begin_ns,
                {{"request", std::to_string(t->request_id)},
                 {"layer", int64_t{layer}},
                 {"step", static_cast<int64_t>(w.runner_step)},
                 {"first_page", int64_t{w.first_page}},
                 {"pages", int64_t{n}},
                 {"writes", int64_t{layer_writes}},
                 {"bytes", static_cast<int64_t>(layer_bytes)}});
  }
}

// "post writes" (or "post metadata") over the submit call; the write's flight is traced when
// its completion arrives (OnWriteDone).
void PrefillMessenger::Impl::TracePosted(Result<uint64_t> key, uint64_t request_id, int layer,
                                         int64_t begin_ns, TraceArgs args) {
  const int64_t now = Tracer::NowNs();
  if (!key.ok()) args.push_back({"error", key.status().ToString()});
  options_.tracer->Complete(layer < 0 ? "post metadata" : "post writes", "kv", begin_ns, now,
                            std::move(args));
  if (key.ok() && *key != 0) traced_[*key] = {request_id, layer, now};
}

void PrefillMessenger::Impl::MaybePostMetadata(Transfer* t) {
  if (!t->kv_posted || !t->engine_done || t->meta_posted || !t->error.ok()) return;
  if (!t->draft_posted) {  // the drafter's KV is whole once the engine's final output came
    t->draft_posted = true;
    const uint64_t id = t->request_id;
    PostDraftKv(t);
    t = Find(id);
    if (t == nullptr || !t->error.ok()) return;
  }
  if (t->last_hidden.size() * sizeof(float) != meta_bytes_) {
    Fail(t, Internal("the engine's last hidden state has " + std::to_string(t->last_hidden.size()) +
                     " floats, expected " + std::to_string(meta_bytes_ / 4)));
    return;
  }
  const uint64_t offset = uint64_t{meta_bytes_} * t->meta_slot;
  std::memcpy(meta_staging_.data() + offset, t->last_hidden.data(), meta_bytes_);
  transfer::WriteRequest req;
  req.src = meta_mr_;
  req.src_offset = offset;
  req.length = meta_bytes_;
  req.dst = t->meta;
  req.dst_offset = t->meta_offset;
  req.imm = t->meta_imm;  // counted apart: the decode side decodes without waiting for it
  t->meta_posted = true;
  const int64_t begin_ns = options_.tracer != nullptr ? Tracer::NowNs() : 0;
  auto slot = std::make_shared<transfer::TransferId>(0);
  auto id = domain_->SubmitWrite(req, WriteDone(t->request_id, 0, slot));
  Result<uint64_t> key = id.ok() ? Result<uint64_t>(InflightKey(0, *id)) : id.status();
  if (id.ok()) *slot = *id;
  if (options_.tracer != nullptr) {
    TracePosted(
        key, t->request_id, -1, begin_ns,
        {{"request", std::to_string(t->request_id)}, {"bytes", static_cast<int64_t>(meta_bytes_)}});
  }
  Track(t, key, t->meta_imm, meta_bytes_, 1);
}

void PrefillMessenger::Impl::OnWriteDone(uint64_t request_id, uint64_t key, const Status& status) {
  if (auto it = traced_.find(key); it != traced_.end()) {
    const TracedWrite w = it->second;
    traced_.erase(it);
    options_.tracer->Complete(w.layer < 0 ? "metadata write" : "write layer", "kv", w.posted_ns,
                              Tracer::NowNs(),
                              {{"request", std::to_string(w.request_id)},
                               {"layer", int64_t{w.layer}},
                               {"ok", int64_t{status.ok() ? 1 : 0}}});
  }
  Transfer* t = Find(request_id);
  if (t == nullptr) {
    auto aside = set_aside_.find(request_id);
    if (aside == set_aside_.end() || --aside->second.outstanding > 0) return;
    // Its last write came back: nothing of it can land any more.
    SendDone(aside->second.peer, request_id, aside->second.error, aside->second.num_writes);
    set_aside_.erase(aside);
    return;
  }
  t->outstanding--;
  auto flying = t->inflight.find(key);
  const uint32_t imm = flying != t->inflight.end() ? flying->second.imm : 0;
  if (flying != t->inflight.end()) t->inflight.erase(flying);
  if (!status.ok() && t->error.ok() && !MaybeReroute(t, InflightNic(key), imm, status)) {
    Fail(t, status.WithContext("KV write"));  // ends with TryFinish, which may free t
    return;
  }
  TryFinish(t);
}

// ------------------------------------------------------------------ life cycle

void PrefillMessenger::Impl::Fail(Transfer* t, const Status& status) {
  if (!t->error.ok()) return;
  t->error = status;
  t->failed_at = NowSeconds();
  if (options_.tracer != nullptr) {
    options_.tracer->Instant(
        "transfer failed", "kv",
        {{"request", std::to_string(t->request_id)}, {"error", status.ToString()}});
  }
  for (const auto& [key, w] : t->inflight) Nic(InflightNic(key)).Cancel(InflightId(key));
  if (!t->engine_done) engine_->Abort(t->engine_id);
  TryFinish(t);
}

void PrefillMessenger::Impl::TryFinish(Transfer* t) {
  if (!t->engine_done || LiveWrites(*t) > 0) return;
  if (t->error.ok() && (!t->meta_posted || t->rerouting)) return;  // writes still to come
  if (!t->kept_pages.empty()) engine_->ReleasePages(std::move(t->kept_pages));
  free_meta_slots_.push_back(t->meta_slot);
  SendDone(t->peer, t->request_id, t->error, t->num_writes);
  if (options_.tracer != nullptr) {
    options_.tracer->Complete(
        "transfer", "kv", static_cast<int64_t>(t->start_time * 1e9), Tracer::NowNs(),
        {{"request", std::to_string(t->request_id)},
         {"tokens", int64_t{t->num_tokens}},
         {"writes", int64_t{t->num_writes}},
         {"bytes", static_cast<int64_t>(t->bytes)},
         {"kv_bytes", static_cast<int64_t>(t->kv_bytes)},
         {"kv_bytes_per_token",
          static_cast<int64_t>(t->num_tokens > 0 ? t->kv_bytes / t->num_tokens : 0)},
         {"status", t->error.ok() ? std::string("ok") : t->error.ToString()}});
  }
  if (t->error.ok()) {
    owner_->metrics_.Succeeded(NowSeconds() - t->start_time, t->bytes, t->num_writes);
    // Tokens whose KV moved: those of the pages written (the decode side held the ones before).
    const int moved = std::max(0, t->num_tokens - t->first_page * spec_.page_size);
    owner_->metrics_.KvMoved(t->kv_bytes, static_cast<uint64_t>(moved));
    owner_->metrics_.PagesTransferred(t->dst_pages.size() - static_cast<size_t>(t->first_page));
  } else {
    owner_->metrics_.Failed();
    PD_LOG_WARN("prefill messenger: request {} failed: {}", t->request_id, t->error.ToString());
  }
  transfers_.erase(t->request_id);  // t is gone
  owner_->metrics_.SetActive(static_cast<int64_t>(transfers_.size()));
}

void PrefillMessenger::Impl::SetAside(Transfer* t) {
  owner_->metrics_.SetAside();
  PD_LOG_WARN(
      "prefill messenger: request {} failed ({}) but {} of its writes have not come back after "
      "{} s (its decode instance stalled?): its pages are freed, its PrefillDone waits for them",
      t->request_id, t->error.ToString(), t->outstanding, options_.drain_timeout_s);
  set_aside_[t->request_id] = {t->peer, t->outstanding, t->num_writes, t->error};
  if (!t->kept_pages.empty()) engine_->ReleasePages(std::move(t->kept_pages));
  free_meta_slots_.push_back(t->meta_slot);
  owner_->metrics_.Failed();
  // An engine request not ended yet (Fail aborted it) keeps its by_engine_id_ entry: its final
  // output finds no transfer and frees what it kept.
  transfers_.erase(t->request_id);  // t is gone
  owner_->metrics_.SetActive(static_cast<int64_t>(transfers_.size()));
}

void PrefillMessenger::Impl::CheckDeadlines() {
  const double now = NowSeconds();
  std::vector<Transfer*> stuck;
  for (auto& [id, t] : transfers_) {
    if (!t->error.ok() && t->outstanding > 0 && now - t->failed_at > options_.drain_timeout_s) {
      stuck.push_back(t.get());
    }
  }
  for (Transfer* t : stuck) SetAside(t);
  CheckStalledNics(now);
  std::vector<Transfer*> late;
  for (auto& [id, t] : transfers_) {
    if (t->error.ok() && now > t->deadline) late.push_back(t.get());
  }
  for (Transfer* t : late) {
    Fail(t, DeadlineExceeded("KV transfer of request " + std::to_string(t->request_id) +
                             " missed its deadline"));
  }
  std::vector<Transfer*> orphaned;
  for (auto& [id, t] : transfers_) {
    if (t->error.ok() && Silent(*t, now)) orphaned.push_back(t.get());
  }
  for (Transfer* t : orphaned) {
    owner_->metrics_.DroppedSilentPeer();
    char silence[32];
    std::snprintf(silence, sizeof(silence), "%g", options_.peer_silence_s);
    Fail(t, Unavailable("request " + std::to_string(t->request_id) +
                        " dropped: its decode instance has sent nothing for " + silence + " s"));
  }
}

void PrefillMessenger::Impl::Heard(const std::string& fabric_address) {
  last_heard_[fabric_address] = NowSeconds();
}

// A SIGSTOPped or wedged decode instance keeps its sockets open, so its writes neither fail nor
// complete: without this its queued and running prefills would hold their pages until their
// deadlines (up to max_deadline_ms).
bool PrefillMessenger::Impl::Silent(const Transfer& t, double now) const {
  if (options_.peer_silence_s <= 0) return false;
  auto it = last_heard_.find(t.peer.fabric_addr);
  return it != last_heard_.end() && now - it->second > options_.peer_silence_s;
}

Transfer* PrefillMessenger::Impl::Find(uint64_t request_id) {
  auto it = transfers_.find(request_id);
  return it == transfers_.end() ? nullptr : it->second.get();
}

}  // namespace pd::messenger
