// The prefill messenger's prompt assembly: a PrefillRequest whose ids did not fit in one control
// message is completed by PromptChunks (wire.h), which may arrive before or after it. A partial
// prompt is bounded (its totals by the wire limits, all of them together by
// max_partial_prompt_bytes, each in time by prompt_timeout_s) and dropped on Cancel, on its
// peer's silence or restart, and at Stop. Once every id and page arrived the request is admitted
// as a whole (Begin, prefill_side.cc). Impl's definition in prefill_side_impl.h.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "messenger/prefill_side_impl.h"

namespace pd::messenger {
namespace prefill_internal {

bool RangeSet::Insert(uint32_t begin, uint32_t end) {
  if (begin >= end) return true;
  auto next = ranges_.lower_bound(begin);
  if (next != ranges_.end() && next->first < end) return false;
  if (next != ranges_.begin() && std::prev(next)->second > begin) return false;
  ranges_.emplace(begin, end);
  covered_ += end - begin;
  return true;
}

}  // namespace prefill_internal

namespace {

uint64_t IdBytes(uint64_t num_tokens, uint64_t num_pages) {
  return (num_tokens + num_pages) * sizeof(int32_t);
}

}  // namespace

void PrefillMessenger::Impl::OnPrefillRequest(PrefillRequest request, const Frame& frame) {
  const std::string* sender = Sender(frame, "PrefillRequest", request.request_id);
  if (sender == nullptr) return;
  const uint64_t id = request.request_id;
  auto it = partials_.find(id);
  if (draining_) {  // nothing done for it yet: the decode instance retries elsewhere
    if (it != partials_.end()) DropPartial(id, OkStatus());
    SendDone(peers_.at(*sender).addr, id, Unavailable(kDrainingMessage), 0);
    return;
  }
  const bool whole = request.token_ids.size() == request.num_tokens &&
                     request.dst_pages.size() == request.num_pages;
  if (it == partials_.end() && whole) {
    Begin(request, *sender);
    return;
  }
  const DecodePeer& peer = peers_.at(*sender);
  if (it != partials_.end() && (it->second.have_header || it->second.peer_address != *sender)) {
    SendDone(peer.addr, id,
             AlreadyExists("request " + std::to_string(id) + " is already in flight"), 0);
    return;
  }
  const uint64_t early_bytes = it == partials_.end() ? 0 : it->second.bytes;
  const uint64_t need = IdBytes(request.num_tokens, request.num_pages);
  const bool too_many =
      it == partials_.end() && static_cast<int>(partials_.size()) >= options_.max_transfers;
  if (too_many || partial_bytes_ - early_bytes + need > options_.max_partial_prompt_bytes) {
    if (it != partials_.end()) DropPartial(id, OkStatus());
    SendDone(peer.addr, id,
             ResourceExhausted("prefill instance busy: " + std::to_string(partials_.size()) +
                               " prompts still arriving hold " + std::to_string(partial_bytes_) +
                               " bytes of ids (max " +
                               std::to_string(options_.max_partial_prompt_bytes) + ")"),
             0);
    return;
  }
  if (it == partials_.end()) {
    it = partials_.emplace(id, PartialPrompt{}).first;
    it->second.peer_address = *sender;
    it->second.deadline = NowSeconds() + options_.prompt_timeout_s;
  }
  PartialPrompt& p = it->second;
  partial_bytes_ = partial_bytes_ - p.bytes + need;
  p.bytes = need;
  p.have_header = true;
  // The first ids go where a chunk at offset 0 would.
  PromptChunk first{id, 0, std::move(request.token_ids), 0, std::move(request.dst_pages)};
  p.request = std::move(request);
  p.request.token_ids.assign(p.request.num_tokens, 0);
  p.request.dst_pages.assign(p.request.num_pages, 0);
  std::vector<PromptChunk> chunks = std::move(p.early);
  p.early.clear();
  chunks.insert(chunks.begin(), std::move(first));
  for (PromptChunk& c : chunks) {
    if (Status s = AddChunk(&p, std::move(c)); !s.ok()) {
      DropPartial(id, s);
      return;
    }
  }
  MaybeBegin(id);
}

void PrefillMessenger::Impl::OnPromptChunk(PromptChunk chunk, const Frame& frame) {
  const std::string* sender = Sender(frame, "PromptChunk", chunk.request_id);
  if (sender == nullptr) return;
  const uint64_t id = chunk.request_id;
  auto it = partials_.find(id);
  if (it != partials_.end() && it->second.peer_address != *sender) {
    Warn("chunk", "PromptChunk " + std::to_string(id) + " from another peer than its request's");
    owner_->metrics_.Rejected();
    return;
  }
  if (it != partials_.end() && it->second.have_header) {
    if (Status s = AddChunk(&it->second, std::move(chunk)); !s.ok()) {
      DropPartial(id, s);
      return;
    }
    MaybeBegin(id);
    return;
  }
  // Before its PrefillRequest: kept as it is, within the same byte budget.
  const uint64_t bytes = IdBytes(chunk.token_ids.size(), chunk.dst_pages.size());
  if (partial_bytes_ + bytes > options_.max_partial_prompt_bytes ||
      (it == partials_.end() && static_cast<int>(partials_.size()) >= options_.max_transfers)) {
    Warn("chunk",
         "PromptChunk " + std::to_string(id) + " dropped: too many prompts are still arriving");
    owner_->metrics_.Rejected();
    if (it != partials_.end()) DropPartial(id, OkStatus());
    return;
  }
  if (it == partials_.end()) {
    it = partials_.emplace(id, PartialPrompt{}).first;
    it->second.peer_address = *sender;
    it->second.deadline = NowSeconds() + options_.prompt_timeout_s;
  }
  it->second.bytes += bytes;
  partial_bytes_ += bytes;
  it->second.early.push_back(std::move(chunk));
}

Status PrefillMessenger::Impl::AddChunk(PartialPrompt* p, PromptChunk chunk) {
  PrefillRequest& r = p->request;
  const std::string id = "request " + std::to_string(r.request_id);
  const uint64_t token_end = uint64_t{chunk.token_offset} + chunk.token_ids.size();
  const uint64_t page_end = uint64_t{chunk.page_offset} + chunk.dst_pages.size();
  if (token_end > r.num_tokens || page_end > r.num_pages) {
    return InvalidArgument(id + ": a prompt chunk (tokens " + std::to_string(chunk.token_offset) +
                           ".." + std::to_string(token_end) + ", pages " +
                           std::to_string(chunk.page_offset) + ".." + std::to_string(page_end) +
                           ") beyond its " + std::to_string(r.num_tokens) + " tokens and " +
                           std::to_string(r.num_pages) + " pages");
  }
  if (!p->tokens.Insert(chunk.token_offset, static_cast<uint32_t>(token_end)) ||
      !p->pages.Insert(chunk.page_offset, static_cast<uint32_t>(page_end))) {
    return InvalidArgument(id + ": a prompt chunk overlaps ids already received");
  }
  std::copy(chunk.token_ids.begin(), chunk.token_ids.end(),
            r.token_ids.begin() + chunk.token_offset);
  std::copy(chunk.dst_pages.begin(), chunk.dst_pages.end(),
            r.dst_pages.begin() + chunk.page_offset);
  return OkStatus();
}

void PrefillMessenger::Impl::MaybeBegin(uint64_t request_id) {
  auto it = partials_.find(request_id);
  if (it == partials_.end()) return;
  PartialPrompt& p = it->second;
  if (!p.have_header || p.tokens.covered() != p.request.num_tokens ||
      p.pages.covered() != p.request.num_pages) {
    return;
  }
  PrefillRequest request = std::move(p.request);
  const std::string sender = p.peer_address;
  partial_bytes_ -= p.bytes;
  partials_.erase(it);
  Begin(request, sender);
}

void PrefillMessenger::Impl::DropPartial(uint64_t request_id, const Status& why) {
  auto it = partials_.find(request_id);
  if (it == partials_.end()) return;
  const bool tell = !why.ok() && it->second.have_header;
  const std::string sender = it->second.peer_address;
  partial_bytes_ -= it->second.bytes;
  partials_.erase(it);
  if (!why.ok()) {
    Warn("partial", "PrefillRequest " + std::to_string(request_id) +
                        " dropped before its prompt "
                        "arrived: " +
                        why.ToString());
  }
  if (!tell) return;
  if (auto peer = peers_.find(sender); peer != peers_.end()) {
    SendDone(peer->second.addr, request_id, why, 0);
  }
}

// A prompt that did not arrive in time, or whose sender fell silent, is dropped.
void PrefillMessenger::Impl::CheckPartials(double now) {
  std::vector<std::pair<uint64_t, Status>> dropped;
  for (const auto& [id, p] : partials_) {
    auto heard = last_heard_.find(p.peer_address);
    const bool silent = options_.peer_silence_s > 0 && heard != last_heard_.end() &&
                        now - heard->second > options_.peer_silence_s;
    if (now > p.deadline) {
      dropped.emplace_back(id, DeadlineExceeded("request " + std::to_string(id) +
                                                ": its prompt did not arrive within " +
                                                std::to_string(options_.prompt_timeout_s) + " s"));
    } else if (silent) {
      dropped.emplace_back(id, Unavailable("request " + std::to_string(id) +
                                           " dropped: its decode instance fell silent"));
    }
  }
  for (const auto& [id, why] : dropped) DropPartial(id, why);
}

}  // namespace pd::messenger
