// The decode messenger's side of a Reroute: a prefill instance lost one of its NICs under an
// attempt and asks for a fresh imm under which it re-posts every KV write of the attempt. Impl's
// definition in decode_side_impl.h.
#include <algorithm>
#include <string>
#include <utility>

#include "common/log.h"
#include "messenger/decode_side_impl.h"

namespace pd::messenger {

// The attempt's counter is removed first: once Remove returned true nothing more counts under the
// old imm, so a write that landed there with its completion lost cannot be counted twice. When
// Remove finds no counter, it fired already (the KV is complete: the request may be decoding into
// its last page, which must not be written again) or the attempt ended: the answer is new_imm 0,
// nothing to re-post. Before a fresh imm is given, the keys of our NIC that the lost NIC writes
// into are revoked for that peer: a write the lost link still holds (a link down keeps writes
// without failing them) can never land later, in pages another request may use by then, so the
// prefill instance need not wait for it. A lost NIC that writes into our NIC 0 (fewer NICs here
// than there) cannot be fenced that way without cutting the control path: the attempt fails and is
// retried as for a lost peer.
void DecodeMessenger::Impl::OnReroute(const Reroute& reroute, const Frame& frame) {
  auto from = std::find_if(peers_.begin(), peers_.end(), [&](const Peer& p) {
    return p.session != 0 && p.session == frame.sender_session;
  });
  if (from == peers_.end()) {
    owner_->metrics_.Rejected();
    PD_LOG_WARN_LIMITED(warnings_, "reroute", "decode messenger: Reroute from an unknown session");
    return;
  }
  const int peer = static_cast<int>(from - peers_.begin());
  if (!FromPeer(peer, frame)) return;
  RerouteReply reply{reroute.request_id, 0};
  auto it = by_wire_.find(reroute.request_id);
  Req* r = it == by_wire_.end() ? nullptr : Find(it->second);
  const size_t ours = reroute.nic % (1 + extra_domains_.size());  // the NIC it writes into here
  if (r != nullptr && r->in_flight && r->peer == peer && ours == 0) {
    FailAttempt(r, Unavailable("prefill instance " + peers_[peer].config.name + " lost its NIC " +
                               std::to_string(reroute.nic) + ", which writes into our first NIC"));
    return;
  }
  if (r != nullptr && r->in_flight && r->peer == peer && domain_->imm_counters().Remove(r->imm)) {
    if (Status s = RevokeNicKeys(peer, ours); !s.ok()) {
      FailAttempt(r, s);
      return;
    }
    const uint32_t old_imm = r->imm;
    uint32_t imm = NextImm();
    if (imm == r->meta_imm || imm == 0) imm = NextImm();
    const int64_t id = r->id;
    std::weak_ptr<TaskQueue> weak = queue_;
    auto kv = domain_->imm_counters().Expect(imm, r->expected, [this, weak, id, imm] {
      if (auto q = weak.lock()) q->Post([this, id, imm] { OnKvArrived(id, imm); });
    });
    if (!kv.ok()) {
      FailAttempt(r, kv.status().WithContext("moving the attempt to a fresh imm"));
      return;  // the attempt's Cancel tells the prefill instance
    }
    r->imm = imm;
    reply.new_imm = imm;
    PD_LOG_WARN(
        "decode messenger: prefill instance {} lost its NIC {} under request {}: its KV writes "
        "move from imm {} to imm {}",
        peers_[peer].config.name, reroute.nic, r->id, old_imm, imm);
  }
  if (Status s = Send(peer, reply); !s.ok()) {
    PD_LOG_WARN("decode messenger: cannot answer a Reroute: {}", s.ToString());
  }
}

Status DecodeMessenger::Impl::RevokeNicKeys(int peer, size_t nic) {
  Peer& p = peers_[peer];
  transfer::Domain& domain = *extra_domains_[nic - 1];
  for (const transfer::MemoryRegion& mr : p.nic_kv_mrs[nic - 1]) (void)domain.Deregister(mr);
  p.nic_kv_mrs[nic - 1].clear();
  if (nic - 1 < p.nic_draft_mrs.size()) {
    for (const transfer::MemoryRegion& mr : p.nic_draft_mrs[nic - 1]) (void)domain.Deregister(mr);
    p.nic_draft_mrs[nic - 1].clear();
  }
  owner_->metrics_.KeysRevoked();
  auto mrs = RegisterRankRegions(domain, runner_, transfer::RegionAccess::kRemoteWrite);
  if (mrs.ok() && options_.draft_kv != nullptr) {
    auto draft =
        RegisterRankRegions(domain, *options_.draft_kv, transfer::RegionAccess::kRemoteWrite);
    if (draft.ok()) {
      p.nic_draft_mrs[nic - 1] = std::move(draft).value();
    } else {
      mrs = draft.status().WithContext("the draft KV region");
    }
  }
  if (!mrs.ok()) {
    p.state = PeerStatus::State::kRefused;
    p.reason = "prefill instance " + p.config.name + ": registering the KV regions anew on NIC " +
               std::to_string(nic) + " failed: " + mrs.status().ToString();
    PublishPeer(peer);
    return FailedPrecondition(p.reason);
  }
  p.nic_kv_mrs[nic - 1] = std::move(mrs).value();
  return OkStatus();
}

}  // namespace pd::messenger
