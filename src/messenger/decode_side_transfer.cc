// The decode messenger's per-request transfer flow (decode_side.h's header comment tells the
// story): Submit and the page reservation, each attempt (StartAttempt, the imm counter firing in
// OnKvArrived, PrefillDone, EndAttempt/FailAttempt and the retry), failing a request, its end,
// the fences that keep an ended attempt's pages and metadata slot out of use, and the deadlines.
// Lifecycle and peers are in decode_side.cc; Impl's definition in decode_side_impl.h.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "common/log.h"
#include "messenger/decode_side_impl.h"

namespace pd::messenger {
namespace {

bool Retryable(StatusCode code) {
  return code != StatusCode::kInvalidArgument && code != StatusCode::kOutOfRange &&
         code != StatusCode::kFailedPrecondition && code != StatusCode::kUnimplemented;
}

}  // namespace

// ------------------------------------------------------------------ requests

Result<int64_t> DecodeMessenger::Impl::Submit(std::vector<int32_t> prompt,
                                              const engine::SamplingParams& sampling,
                                              engine::OutputCallback on_output) {
  engine::AsyncEngine& inner = *owner_->inner_;
  if (prompt.size() < 2) return inner.Submit(std::move(prompt), sampling, std::move(on_output));
  if (options_.local_prefill_max_tokens >= 0) {
    // Conditional disaggregation: a short uncached part (none, often, with the prefix cache) costs
    // less to compute here than a round trip to a prefill instance.
    const int uncached = static_cast<int>(prompt.size()) - 1 - inner.CachedPrefixTokens(prompt);
    if (uncached <= options_.local_prefill_max_tokens) {
      auto id = inner.Submit(std::move(prompt), sampling, std::move(on_output));
      if (id.ok()) owner_->metrics_.LocalPrefill();
      return id;
    }
  }
  {
    // None accepted now: the request waits for one only if one that accepted us may come back.
    MutexLock lock(&peers_mu_);
    const bool wait = options_.prefill_wait_s > 0;
    if (std::none_of(peer_status_.begin(), peer_status_.end(), [wait](const PeerStatus& p) {
          return !p.removed && (p.state == PeerStatus::State::kAccepted ||
                                (wait && p.was_accepted && p.state != PeerStatus::State::kRefused));
        })) {
      return Unavailable("no prefill instance has accepted this decode instance");
    }
  }
  auto info = std::make_shared<RequestInfo>();
  info->prefill_tokens.assign(prompt.begin(), prompt.end() - 1);
  std::weak_ptr<TaskQueue> weak = queue_;
  auto wrapped = [this, info, weak, cb = std::move(on_output)](const engine::RequestOutput& out) {
    if (!out.finished()) {
      if (cb) cb(out);
      return;
    }
    engine::RequestOutput copy = out;
    {
      MutexLock lock(&info->mu);
      if (!info->failure.ok() && copy.finish_reason == engine::FinishReason::kAbort) {
        copy.finish_reason = engine::FinishReason::kError;
        copy.error = info->failure;
      }
    }
    if (auto q = weak.lock()) q->Post([this, id = out.request_id] { OnEnded(id); });
    if (cb) cb(copy);
  };
  // On the engine thread, before an abort of this request could free its pages: the messenger
  // takes a reference of its own for the transfer (see Fence).
  auto on_reserved = [this, info, weak](const engine::KvReservation& r) {
    auto q = weak.lock();
    if (q == nullptr) return;
    owner_->inner_->RetainPages(r.page_table);
    q->Post([this, r, info] { OnReserved(r, info); });
  };
  return inner.SubmitRemoteKv(std::move(prompt), sampling, std::move(wrapped),
                              std::move(on_reserved));
}

void DecodeMessenger::Impl::OnReserved(const engine::KvReservation& reservation,
                                       std::shared_ptr<RequestInfo> info) {
  const int64_t id = reservation.request_id;
  owner_->metrics_.PagesCached(static_cast<uint64_t>(reservation.num_cached_pages));
  const uint64_t cached_tokens = uint64_t(reservation.num_cached_pages) * spec_.page_size;
  if (cached_tokens >= info->prefill_tokens.size()) {
    // The prefix cache held every prompt page since Submit looked: nothing to transfer.
    owner_->inner_->ReleasePages(reservation.page_table);  // on_reserved's reference
    owner_->metrics_.LocalPrefill();
    owner_->inner_->MarkKvReady(id);
    return;
  }
  auto r = std::make_unique<Req>();
  r->id = id;
  r->info = std::move(info);
  r->pages = reservation.page_table;
  r->first_page = reservation.num_cached_pages;
  r->holding = true;  // taken in on_reserved
  r->start = NowSeconds();
  Req* raw = r.get();
  reqs_[id] = std::move(r);
  owner_->metrics_.Started();
  StartAttempt(raw, OkStatus());
}

void DecodeMessenger::Impl::StartAttempt(Req* r, const Status& last_error) {
  const int peer = PickPeer(*r);
  if (peer < 0) {
    const Status why = last_error.ok() ? Unavailable("no prefill instance available")
                                       : Status(last_error.code(), last_error.message() +
                                                                       " (and no other prefill "
                                                                       "instance to retry on)");
    if (!Wait(r, why)) Fail(r, why);
    return;
  }
  r->wait_until = 0.0;
  if (free_meta_slots_.empty()) {
    Fail(r, ResourceExhausted("every metadata slot is in use"));
    return;
  }
  // A fresh wire id per attempt: a late PrefillDone of an earlier attempt lifts only its fence.
  r->wire_id = wire_prefix_ | next_wire_++;
  r->done_received = false;
  if (!r->holding) {  // a retry: the earlier attempt's reference went to its fence
    owner_->inner_->RetainPages(r->pages);
    r->holding = true;
  }
  const uint32_t num_tokens = static_cast<uint32_t>(r->info->prefill_tokens.size());
  const uint32_t num_pages = PagesForTokens(num_tokens, spec_.page_size);
  // Only the pages our prefix cache lacked are written.
  auto expected = ExpectedWrites(peers_[peer].scheme, scheme_, format_,
                                 num_pages - static_cast<uint32_t>(r->first_page), r->wire_id);
  if (!expected.ok()) {
    Fail(r, expected.status());
    return;
  }
  if (Status s = ExpectWrites(r, *expected); !s.ok()) {
    Fail(r, s);
    return;
  }
  r->meta_slot = free_meta_slots_.back();
  free_meta_slots_.pop_back();
  by_wire_[r->wire_id] = r->id;
  // The canary the prefill's metadata write must replace (every float a NaN no computation makes).
  std::memset(meta_buffer_.data() + slot_bytes_ * r->meta_slot, 0xFF, meta_bytes_);
  // --kv-checksum: no record until this attempt's lands (a zero imm matches no attempt).
  std::memset(meta_buffer_.data() + slot_bytes_ * r->meta_slot + meta_bytes_, 0,
              slot_bytes_ - meta_bytes_);
  r->peer = peer;
  r->in_flight = true;
  r->attempts++;
  r->tried.push_back(peer);
  r->deadline = NowSeconds() + options_.transfer_timeout_ms / 1000.0;
  peers_[peer].outstanding++;
  PublishPeer(peer);
  UpdateActive();
  bool sent_any = false;
  if (Status s = SendPrefillRequest(r, num_pages, *expected, &sent_any); !s.ok()) {
    // Nothing is wrong with the peer: only this attempt fails (and is retried if that can help).
    // When not even the PrefillRequest left, nothing can write for it: no fence to wait on.
    if (!sent_any) r->done_received = true;
    FailAttempt(
        r, Status(s.code(), "could not send the PrefillRequest to prefill instance " +
                                peers_[peer].config.name + " (a local error): " + s.message()));
  }
}

// Two fresh counters for the attempt: its `expected` KV page writes (the request decodes once they
// have landed) and its metadata write, which the prefill instance posts only after its step ended.
Status DecodeMessenger::Impl::ExpectWrites(Req* r, uint64_t expected) {
  const uint32_t imm = NextImm();
  const uint32_t meta_imm = NextImm();
  const int64_t id = r->id;
  const uint64_t wire_id = r->wire_id;
  std::weak_ptr<TaskQueue> weak = queue_;
  auto kv = domain_->imm_counters().Expect(imm, expected, [this, weak, id, imm] {
    if (auto q = weak.lock()) q->Post([this, id, imm] { OnKvArrived(id, imm); });
  });
  if (!kv.ok()) return kv.status();
  auto meta = domain_->imm_counters().Expect(meta_imm, 1, [this, weak, wire_id, meta_imm] {
    if (auto q = weak.lock())
      q->Post([this, wire_id, meta_imm] { OnMetaArrived(wire_id, meta_imm); });
  });
  if (!meta.ok()) {
    domain_->imm_counters().Remove(imm);
    return meta.status();
  }
  r->imm = imm;
  r->expected = expected;
  r->meta_imm = meta_imm;
  r->meta_landed = false;
  return OkStatus();
}

std::vector<const transfer::MemoryRegion*> DecodeMessenger::Impl::TargetRegions(
    const Req& r) const {
  const std::vector<transfer::MemoryRegion>& mrs = peers_[r.peer].kv_mrs;
  std::vector<const transfer::MemoryRegion*> out;
  for (size_t k = 0; k < mrs.size(); ++k)
    if (dp_size_ == 1 || static_cast<int>(k) == TargetRank(r, 0)) out.push_back(&mrs[k]);
  return out;
}

int DecodeMessenger::Impl::TargetRank(const Req& r, size_t k) const {
  if (dp_size_ == 1) return static_cast<int>(k);
  return engine::DpRankOfPage(r.pages.at(0), pages_per_dp_rank_);  // one rank holds them all
}

std::vector<int32_t> DecodeMessenger::Impl::TargetPages(const Req& r, uint32_t num_pages) const {
  std::vector<int32_t> out(r.pages.begin(), r.pages.begin() + num_pages);
  if (dp_size_ > 1)
    for (int32_t& p : out) p = engine::DpLocalPage(p, pages_per_dp_rank_);
  return out;
}

// The attempt's PrefillRequest to peers_[r->peer]: the prompt without its last token, our rank
// regions, the first `num_pages` reserved pages, the metadata slot and the deadline. Ids that do
// not fit in one control message (ours or the peer's limit, whichever is smaller) follow in
// PromptChunks: tokens first, then pages, each message as full as it can be.
Status DecodeMessenger::Impl::SendPrefillRequest(Req* r, uint32_t num_pages, uint64_t expected,
                                                 bool* sent_any) {
  const int peer = r->peer;
  const std::vector<int32_t>& tokens = r->info->prefill_tokens;
  const uint32_t num_tokens = static_cast<uint32_t>(tokens.size());
  PrefillRequest m;
  m.request_id = r->wire_id;
  m.transfer_imm = r->imm;
  m.num_tokens = num_tokens;
  m.num_pages = num_pages;
  m.decode_scheme = scheme_;
  for (const transfer::MemoryRegion* mr : TargetRegions(*r))
    m.rank_regions.push_back(mr->descriptor.ToBytes());
  // Per further NIC, the same ranks' regions (with data-parallel ranks: the request's rank only).
  for (const auto& nic : peers_[peer].nic_kv_mrs) {
    for (size_t k = 0; k < nic.size(); ++k)
      if (dp_size_ == 1 || static_cast<int>(k) == TargetRank(*r, 0))
        m.nic_regions.push_back(nic[k].descriptor.ToBytes());
  }
  // The draft KV region's, likewise (never with data-parallel ranks: CheckDraftKvRunner).
  for (const transfer::MemoryRegion& mr : peers_[peer].draft_mrs)
    m.draft_rank_regions.push_back(mr.descriptor.ToBytes());
  for (const auto& nic : peers_[peer].nic_draft_mrs)
    for (const transfer::MemoryRegion& mr : nic)
      m.draft_nic_regions.push_back(mr.descriptor.ToBytes());
  const std::vector<int32_t> pages = TargetPages(*r, num_pages);
  m.metadata_region = peers_[peer].meta_mr.descriptor.ToBytes();
  m.metadata_offset = slot_bytes_ * r->meta_slot;
  m.metadata_bytes = meta_bytes_;
  m.deadline_ms = options_.transfer_timeout_ms;
  m.metadata_imm = r->meta_imm;
  m.first_page = static_cast<uint32_t>(r->first_page);
  m.dp_rank = static_cast<uint16_t>(dp_size_ > 1 ? TargetRank(*r, 0) : 0);
  if (num_tokens > kMaxPromptTokens || num_pages > kMaxPages) {
    return InvalidArgument("a prompt of " + std::to_string(num_tokens) + " tokens (" +
                           std::to_string(num_pages) + " pages) exceeds the wire limits of " +
                           std::to_string(kMaxPromptTokens) + " tokens and " +
                           std::to_string(kMaxPages) + " pages");
  }
  const size_t limit = std::min(options_.max_message_bytes, peers_[peer].max_message_bytes);
  // Room for ids once the fixed fields are in: what an id-less frame of each kind takes.
  const size_t request_base = EncodeFrame({0, 0, 0, m}, "").size();
  const size_t chunk_base = EncodeFrame({0, 0, 0, PromptChunk{}}, "").size();
  if (request_base + sizeof(int32_t) > limit) {
    return InvalidArgument("a PrefillRequest takes " + std::to_string(request_base) +
                           " bytes without its ids; control messages are limited to " +
                           std::to_string(limit));
  }
  // The ids as one sequence: tokens [0, num_tokens), then pages [num_tokens, +num_pages).
  const uint64_t total = uint64_t{num_tokens} + num_pages;
  auto take = [&](uint64_t from, uint64_t count, std::vector<int32_t>* t, std::vector<int32_t>* p) {
    const uint64_t end = from + count;
    if (from < num_tokens)
      t->assign(tokens.begin() + from, tokens.begin() + std::min<uint64_t>(end, num_tokens));
    if (end > num_tokens) {
      const uint64_t p0 = std::max<uint64_t>(from, num_tokens) - num_tokens;
      p->assign(pages.begin() + p0, pages.begin() + (end - num_tokens));
    }
  };
  uint64_t sent = std::min<uint64_t>(total, (limit - request_base) / sizeof(int32_t));
  take(0, sent, &m.token_ids, &m.dst_pages);
  int messages = 1;
  RETURN_IF_ERROR(Send(peer, m));
  *sent_any = true;  // from now on a failure leaves a partial prompt there, which Cancel drops
  const uint64_t per_chunk = (limit - chunk_base) / sizeof(int32_t);
  while (sent < total) {
    PromptChunk c;
    c.request_id = r->wire_id;
    const uint64_t n = std::min(per_chunk, total - sent);
    c.token_offset = static_cast<uint32_t>(std::min<uint64_t>(sent, num_tokens));
    c.page_offset = static_cast<uint32_t>(std::max<uint64_t>(sent, num_tokens) - num_tokens);
    take(sent, n, &c.token_ids, &c.dst_pages);
    RETURN_IF_ERROR(Send(peer, c));
    sent += n;
    ++messages;
  }
  if (options_.tracer != nullptr) {
    r->attempt_ns = Tracer::NowNs();
    options_.tracer->Instant("prefill request sent", "kv",
                             {{"request", std::to_string(r->wire_id)},
                              {"engine_request", r->id},
                              {"peer", peers_[peer].config.name},
                              {"attempt", int64_t{r->attempts}},
                              {"tokens", int64_t{num_tokens}},
                              {"messages", int64_t{messages}},
                              {"expected_writes", static_cast<int64_t>(expected)}});
  }
  return OkStatus();
}

// Every KV write of the attempt has landed: the request decodes now. Its metadata (not needed to
// decode: the last prompt token runs as the first decode step) may still be on its way; EndAttempt
// keeps the slot fenced until it lands.
void DecodeMessenger::Impl::OnKvArrived(int64_t id, uint32_t imm) {
  Req* r = Find(id);
  if (r == nullptr || !r->in_flight || r->imm != imm) return;
  if (format_.kv_checksum) {
    const int64_t begin_ns = options_.tracer != nullptr ? Tracer::NowNs() : 0;
    Status s = CheckKvChecksums(*r);
    if (options_.tracer != nullptr) {
      options_.tracer->Complete(
          "kv checksum", "kv", begin_ns, Tracer::NowNs(),
          {{"request", std::to_string(r->wire_id)}, {"ok", int64_t{s.ok() ? 1 : 0}}});
    }
    if (!s.ok()) {
      owner_->metrics_.ChecksumMismatch();
      FailAttempt(r, s.WithContext("prefill instance " + peers_[r->peer].config.name));
      return;
    }
  }
  // The pages that crossed: those our prefix cache lacked.
  const uint64_t num_pages =
      PagesForTokens(static_cast<uint32_t>(r->info->prefill_tokens.size()), spec_.page_size) -
      static_cast<uint64_t>(r->first_page);
  // Every destination rank's share, from the attempt's plan (an MLA latent lands whole on each).
  uint64_t kv_bytes = num_pages * spec_.num_layers * spec_.page_bytes();
  uint64_t kv_writes = num_pages * spec_.num_layers;
  if (auto plan = PlanTransfer(peers_[r->peer].scheme, scheme_, format_, r->wire_id); plan.ok()) {
    const WriteCounts c = ExpectedWrites(*plan, num_pages, spec_.num_layers);
    kv_bytes = 0;
    for (uint64_t b : c.bytes_per_dst_rank) kv_bytes += b;
    kv_writes = c.total_writes;
  }
  if (format_.draft_kv.num_layers > 0) {
    if (auto plan = PlanDraftTransfer(peers_[r->peer].scheme, scheme_, format_, r->wire_id);
        plan.ok()) {
      const WriteCounts c = ExpectedWrites(*plan, num_pages, format_.draft_kv.num_layers);
      for (uint64_t b : c.bytes_per_dst_rank) kv_bytes += b;
      kv_writes += c.total_writes;
    }
  }
  const uint64_t bytes = kv_bytes + meta_bytes_;
  const uint64_t num_tokens =
      r->info->prefill_tokens.size() - static_cast<uint64_t>(r->first_page) * spec_.page_size;
  owner_->metrics_.Succeeded(NowSeconds() - r->start, bytes, kv_writes + 1);
  owner_->metrics_.KvMoved(kv_bytes, num_tokens);
  owner_->metrics_.PagesTransferred(num_pages);
  if (options_.tracer != nullptr) {
    options_.tracer->Complete(
        "kv transfer", "kv", r->attempt_ns, Tracer::NowNs(),
        {{"request", std::to_string(r->wire_id)},
         {"peer", peers_[r->peer].config.name},
         {"attempt", int64_t{r->attempts}},
         {"bytes", static_cast<int64_t>(bytes)},
         {"tokens", static_cast<int64_t>(num_tokens)},
         {"kv_bytes_per_token", static_cast<int64_t>(num_tokens > 0 ? kv_bytes / num_tokens : 0)},
         {"metadata_landed", int64_t{r->meta_landed ? 1 : 0}}});
    options_.tracer->Instant("kv ready", "kv", {{"request", std::to_string(r->wire_id)}});
  }
  EndAttempt(r, /*fence=*/false);  // every KV write of this attempt has landed
  ReleaseHold(r);
  owner_->inner_->MarkKvReady(id);
}

void DecodeMessenger::Impl::OnMetaArrived(uint64_t wire_id, uint32_t meta_imm) {
  if (auto f = fences_.find(wire_id); f != fences_.end()) {
    Fence& fence = f->second;
    if (fence.meta_imm != meta_imm || fence.meta_landed) return;
    fence.meta_landed = true;
    if (!fence.kv_landed) return;  // a failed attempt: its KV writes may still come
    DeliverMetadata(fence.request_id, fence.peer, fence.meta_slot);
    ReleaseFence(wire_id, "landed");
    return;
  }
  auto it = by_wire_.find(wire_id);
  if (it == by_wire_.end()) return;
  Req* r = Find(it->second);
  if (r == nullptr || !r->in_flight || r->meta_imm != meta_imm || r->meta_landed) return;
  r->meta_landed = true;  // before the last KV write: the slot is free once the KV lands
  DeliverMetadata(r->id, r->peer, r->meta_slot);
}

// The slot's hidden state to on_metadata and onto the request in the engine (a drafter that starts
// from it, MTP, drafts at once), unless it still holds the canary StartAttempt put there (the write
// landed elsewhere): counted and logged, the request (decoding already) goes on.
void DecodeMessenger::Impl::DeliverMetadata(int64_t id, int peer, int meta_slot) {
  std::vector<float> hidden(meta_bytes_ / sizeof(float));
  std::memcpy(hidden.data(), meta_buffer_.data() + slot_bytes_ * meta_slot, meta_bytes_);
  const auto canary = std::count_if(hidden.begin(), hidden.end(), [](float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    return bits == 0xFFFFFFFFu;
  });
  if (options_.tracer != nullptr) {
    options_.tracer->Instant("metadata landed", "kv",
                             {{"request", std::to_string(id)}, {"canary", int64_t{canary}}});
  }
  if (canary != 0) {
    owner_->metrics_.MetadataBad();
    PD_LOG_WARN(
        "decode messenger: request {}: prefill instance {} counted its metadata write but the "
        "slot still holds the canary ({} of {} values); the request decodes without it",
        id, peers_[peer].config.name, canary, hidden.size());
    return;
  }
  if (options_.on_metadata) options_.on_metadata(id, hidden);
  owner_->inner_->SetPrefilledHidden(id, std::move(hidden));  // ignored once the request ended
}

void DecodeMessenger::Impl::OnPrefillDone(const PrefillDone& done, const Frame& frame) {
  if (auto f = fences_.find(done.request_id); f != fences_.end()) {
    if (!FromPeer(f->second.peer, frame)) return;
    ReleaseFence(done.request_id, "PrefillDone came first");  // it has stopped writing for it
    return;
  }
  auto it = by_wire_.find(done.request_id);
  if (it == by_wire_.end()) return;
  Req* r = Find(it->second);
  if (r == nullptr || !r->in_flight) return;
  if (!FromPeer(r->peer, frame)) return;
  if (done.status_code == 0) {  // the imm counter says when the writes have landed
    r->done_received = true;
    return;
  }
  r->done_received = true;  // an error answer: that instance has stopped writing for it
  if (done.status_code == static_cast<uint16_t>(StatusCode::kUnavailable) &&
      done.message == kDrainingMessage) {
    // It refused before doing anything: send it nothing new, and the retry elsewhere is free.
    Peer& p = peers_[r->peer];
    if (p.state == PeerStatus::State::kAccepted) {
      PD_LOG_INFO("decode messenger: prefill instance {} is draining: sending it nothing new",
                  p.config.name);
      p.state = PeerStatus::State::kDraining;
      PublishPeer(r->peer);
    }
    --r->attempts;
  }
  FailAttempt(r, Status(static_cast<StatusCode>(done.status_code),
                        "prefill instance " + peers_[r->peer].config.name + ": " + done.message));
}

// `fence`: the attempt failed or was cancelled, so its KV writes may still land: pages and slot
// wait in a fence. Without it every KV write has landed and only the metadata may still come: the
// slot alone waits for it (or for the fence rules). Either way nothing waits once the prefill
// instance has stopped writing (PrefillDone) or is unreachable.
void DecodeMessenger::Impl::EndAttempt(Req* r, bool fence) {
  if (!r->in_flight) return;
  r->in_flight = false;
  domain_->imm_counters().Remove(r->imm);
  by_wire_.erase(r->wire_id);
  const bool stopped = r->done_received || peers_[r->peer].state == PeerStatus::State::kDown;
  if (!stopped && (fence || !r->meta_landed)) {
    Fence& f = fences_[r->wire_id];
    f.peer = r->peer;
    f.meta_slot = r->meta_slot;
    f.meta_imm = r->meta_imm;
    if (fence && r->holding) {
      f.pages = r->pages;  // the attempt's reference moves to the fence
      r->holding = false;
    }
    f.kv_landed = !fence;
    f.meta_landed = r->meta_landed;
    f.request_id = r->id;
    f.deadline = r->deadline + options_.fence_grace_s;
    PublishFences();
  } else {
    if (!fence && !r->meta_landed) MetadataNeverLanded(r->id, r->peer, "it stopped writing");
    FreeMetaSlot(r->meta_slot, r->meta_imm);
  }
  r->meta_slot = -1;
  peers_[r->peer].outstanding--;
  PublishPeer(r->peer);
  UpdateActive();
}

void DecodeMessenger::Impl::FailAttempt(Req* r, const Status& status) {
  if (!r->in_flight) return;
  PD_LOG_WARN("decode messenger: request {} attempt {} failed: {}", r->id, r->attempts,
              status.ToString());
  const int old_peer = r->peer;
  const uint64_t wire_id = r->wire_id;
  if (options_.tracer != nullptr) {
    options_.tracer->Instant("attempt failed", "kv",
                             {{"request", std::to_string(wire_id)},
                              {"peer", peers_[old_peer].config.name},
                              {"attempt", int64_t{r->attempts}},
                              {"error", status.ToString()}});
  }
  EndAttempt(r, /*fence=*/true);
  // With no peer eligible now, StartAttempt may wait for one (Wait) or fails the request.
  if (Retryable(status.code()) && r->attempts < options_.max_attempts &&
      (!Eligible(*r).empty() || options_.prefill_wait_s > 0)) {
    owner_->metrics_.Retried();
    StartAttempt(r, status);  // before the Cancel, which a dead peer may hold up
  } else {
    Fail(r, status);
  }
  if (Serving(peers_[old_peer])) {
    (void)Send(old_peer, Cancel{wire_id});  // a local error: the fence's rules still apply
  }
}

bool DecodeMessenger::Impl::Wait(Req* r, const Status& why) {
  if (options_.prefill_wait_s <= 0 || !Retryable(why.code()) || !MayComeBack()) return false;
  const double now = NowSeconds();
  if (r->wait_until == 0.0) {
    r->wait_until = now + options_.prefill_wait_s;
    owner_->metrics_.Waited();
    PD_LOG_INFO("decode messenger: request {} waits up to {} s for a prefill instance: {}", r->id,
                options_.prefill_wait_s, why.ToString());
  } else if (now >= r->wait_until) {
    return false;
  }
  r->wait_error = why;
  return true;
}

void DecodeMessenger::Impl::StartWaiting() {
  std::vector<Req*> waiting;
  for (auto& [id, r] : reqs_) {
    if (r->wait_until != 0.0 && !r->in_flight) waiting.push_back(r.get());
  }
  const double now = NowSeconds();
  for (Req* r : waiting) {
    if (!Eligible(*r).empty()) {
      StartAttempt(r, r->wait_error);
    } else if (now >= r->wait_until || !MayComeBack()) {
      r->wait_until = 0.0;
      Fail(r, r->wait_error.WithContext(fmt::format(
                  "no prefill instance became available within {} s", options_.prefill_wait_s)));
    }
  }
}

void DecodeMessenger::Impl::ForgetTried(int peer) {
  for (auto& [id, r] : reqs_) std::erase(r->tried, peer);
}

// A peer that accepted us once and is now down or draining may come back (ForgetTried then lets
// every request try it afresh). One serving now does not count: a request that already tried
// it and failed would wait for nothing, so it fails at once as without a wait.
bool DecodeMessenger::Impl::MayComeBack() const {
  return std::any_of(peers_.begin(), peers_.end(), [](const Peer& p) {
    return !p.removed && p.was_accepted && p.state != PeerStatus::State::kRefused &&
           p.state != PeerStatus::State::kAccepted;
  });
}

void DecodeMessenger::Impl::Fail(Req* r, const Status& status) {
  owner_->metrics_.Failed();
  if (options_.tracer != nullptr) {
    options_.tracer->Instant("transfer failed", "kv",
                             {{"request", std::to_string(r->wire_id)},
                              {"attempts", int64_t{r->attempts}},
                              {"error", status.ToString()}});
  }
  {
    MutexLock lock(&r->info->mu);
    r->info->failure =
        Status(status.code(), "KV transfer failed after " + std::to_string(r->attempts) +
                                  " attempt(s): " + status.message());
  }
  owner_->inner_->Abort(r->id);  // the final output comes back as kError (see Submit)
}

void DecodeMessenger::Impl::OnEnded(int64_t id) {
  Req* r = Find(id);
  if (r == nullptr) return;
  if (r->in_flight) {
    if (Serving(peers_[r->peer])) {
      (void)Send(r->peer, Cancel{r->wire_id});  // a local error: the fence's rules still apply
    }
    EndAttempt(r, /*fence=*/true);
  }
  ReleaseHold(r);
  reqs_.erase(id);
}

void DecodeMessenger::Impl::ReleaseHold(Req* r) {
  if (!r->holding) return;
  r->holding = false;
  owner_->inner_->ReleasePages(r->pages);
}

void DecodeMessenger::Impl::ReleaseFence(uint64_t wire_id, const char* why) {
  auto it = fences_.find(wire_id);
  if (it == fences_.end()) return;
  Fence& f = it->second;
  if (!f.pages.empty()) owner_->inner_->ReleasePages(std::move(f.pages));
  if (f.kv_landed && !f.meta_landed) MetadataNeverLanded(f.request_id, f.peer, why);
  FreeMetaSlot(f.meta_slot, f.meta_imm);
  fences_.erase(it);
  PublishFences();
}

void DecodeMessenger::Impl::PublishFences() {
  int64_t pages = 0;
  for (const auto& [wire, f] : fences_) pages += static_cast<int64_t>(f.pages.size());
  owner_->metrics_.SetFenced(static_cast<int64_t>(fences_.size()));
  owner_->metrics_.SetQuarantinedPages(pages);
}

void DecodeMessenger::Impl::MetadataNeverLanded(int64_t id, int peer, const char* why) {
  owner_->metrics_.MetadataMissing();
  PD_LOG_WARN(
      "decode messenger: request {}: its KV landed but prefill instance {} never wrote its "
      "metadata ({}); the request decoded without it",
      id, peers_[peer].config.name, why);
}

uint32_t DecodeMessenger::Impl::NextImm() { return next_imm_++; }

void DecodeMessenger::Impl::FreeMetaSlot(int slot, uint32_t meta_imm) {
  domain_->imm_counters().Remove(meta_imm);  // a late write can no longer reach this attempt
  free_meta_slots_.push_back(slot);
}

void DecodeMessenger::Impl::CheckDeadlines() {
  const double now = NowSeconds();
  // The domain posts sends in order, so only the oldest pending send can be the one that is
  // stuck (a dead peer); those behind it were merely waiting and get a fresh deadline.
  if (!sends_.empty()) {
    auto oldest = std::min_element(sends_.begin(), sends_.end(),
                                   [](const auto& a, const auto& b) { return a.first < b.first; });
    if (now > oldest->second.deadline) {
      const transfer::TransferId id = oldest->first;
      const PendingSend stuck = oldest->second;
      sends_.erase(oldest);
      for (auto& [other, send] : sends_) send.deadline = now + options_.send_timeout_s;
      domain_->Cancel(id);  // unblocks the queue behind it
      if (stuck.generation == peers_[stuck.peer].generation) {
        MarkDown(stuck.peer, DeadlineExceeded("a control message was not delivered within " +
                                              std::to_string(options_.send_timeout_s) + " s"));
      }
    }
  }
  // A fence past its deadline and fence_grace_s: its prefill instance is alive (an unreachable one
  // was marked down, which lifted it) but never confirmed it stopped writing. Its pages are not
  // handed back on a timer: the instance is marked down, which revokes its keys first.
  std::vector<int> unconfirmed;
  for (const auto& [wire, f] : fences_) {
    if (now > f.deadline &&
        std::find(unconfirmed.begin(), unconfirmed.end(), f.peer) == unconfirmed.end()) {
      unconfirmed.push_back(f.peer);
    }
  }
  for (int peer : unconfirmed) {
    MarkDown(peer, DeadlineExceeded("it did not confirm the end of a transfer within " +
                                    std::to_string(options_.fence_grace_s) +
                                    " s past the transfer's deadline"));
  }
  std::vector<Req*> late;
  for (auto& [id, r] : reqs_) {
    if (r->in_flight && now > r->deadline) late.push_back(r.get());
  }
  for (Req* r : late) {
    FailAttempt(r, DeadlineExceeded("prefill instance " + peers_[r->peer].config.name +
                                    " did not complete the KV transfer within " +
                                    std::to_string(options_.transfer_timeout_ms) + " ms"));
  }
}

Req* DecodeMessenger::Impl::Find(int64_t id) {
  auto it = reqs_.find(id);
  return it == reqs_.end() ? nullptr : it->second.get();
}

void DecodeMessenger::Impl::UpdateActive() {
  int64_t n = 0;
  for (auto& [id, r] : reqs_) n += r->in_flight ? 1 : 0;
  owner_->metrics_.SetActive(n);
}

}  // namespace pd::messenger
