// The prefill messenger over several NICs (--fabric-nics): the extra domains, the decode
// instance's NIC addresses and regions, striping KV writes round-robin over the NICs in rotation,
// and the Reroute of a transfer whose write failed on a NIC. Impl's definition in
// prefill_side_impl.h.
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "messenger/nics.h"
#include "messenger/prefill_side_impl.h"

namespace pd::messenger {

Status PrefillMessenger::Impl::OpenNics() {
  RETURN_IF_ERROR(CheckKvCapabilities(domain_->info()));
  ASSIGN_OR_RETURN(extra_domains_,
                   OpenExtraNics(options_.domain, options_.nics, domain_->shared_imm_counters(),
                                 options_.nic_faults));
  std::vector<std::string> labels;
  const transfer::DomainOptions first =
      options_.nics.empty() ? options_.domain : NicDomainOptions(options_.domain, options_.nics[0]);
  labels.push_back(NicLabel(first, domain_->info()));
  for (size_t i = 1; i < num_nics(); ++i) {
    labels.push_back(NicLabel(NicDomainOptions(options_.domain, options_.nics[i]), Nic(i).info()));
  }
  std::string list;
  for (const std::string& l : labels) list += (list.empty() ? "" : ", ") + l;
  PD_LOG_INFO("prefill messenger: provider {} on {} NIC(s): {}", domain_->info().provider,
              labels.size(), list);
  owner_->metrics_.SetNics(std::move(labels));
  return OkStatus();
}

Status PrefillMessenger::Impl::AddPeerNics(const Hello& hello, DecodePeer* peer) {
  const size_t theirs = 1 + hello.nic_addresses.size();
  peer->nic_addresses = hello.nic_addresses;
  peer->nic_addrs.assign(1, peer->addr);
  peer->nic_down_until.assign(num_nics(), 0.0);
  for (size_t i = 1; i < num_nics(); ++i) {
    const size_t j = i % theirs;
    const std::string& address = j == 0 ? hello.fabric_address : hello.nic_addresses[j - 1];
    auto addr = Nic(i).AddPeer(address);
    if (!addr.ok()) {
      return addr.status().WithContext("our NIC " + std::to_string(i) + " cannot reach its NIC " +
                                       std::to_string(j));
    }
    peer->nic_addrs.push_back(*addr);
  }
  return OkStatus();
}

Status PrefillMessenger::Impl::ParseNicRegions(
    const PrefillRequest& r, const std::vector<std::string>& regions, const DecodePeer& peer,
    const std::vector<transfer::RemoteRegion>& nic0,
    std::vector<std::vector<transfer::RemoteRegion>>* out) {
  const std::string id = "request " + std::to_string(r.request_id);
  const bool draft = &regions != &r.nic_regions;
  const char* field = draft ? "draft_nic_regions" : "nic_regions";
  const size_t tp = nic0.size();
  if (regions.size() != peer.nic_addresses.size() * tp) {
    return InvalidArgument(id + ": " + field + " has " + std::to_string(regions.size()) +
                           " descriptors; its decode instance announced " +
                           std::to_string(peer.nic_addresses.size()) + " further NIC(s) of " +
                           std::to_string(tp) + " rank(s)");
  }
  std::vector<std::vector<transfer::MemoryDescriptor>> theirs(1 + peer.nic_addresses.size());
  for (const transfer::RemoteRegion& d : nic0) theirs[0].push_back(d.descriptor);
  for (size_t k = 0; k < regions.size(); ++k) {
    const size_t nic = 1 + k / tp;
    const std::string name = id + ": NIC " + std::to_string(nic) + " rank " +
                             std::to_string(k % tp) + (draft ? "'s draft KV region" : "'s region");
    ASSIGN_OR_RETURN(transfer::MemoryDescriptor d,
                     transfer::MemoryDescriptor::FromBytes(regions[k]));
    RETURN_IF_ERROR(d.Validate().WithContext(name));
    if (d.fabric_addr != peer.nic_addresses[nic - 1]) {
      return InvalidArgument(name + " is not on the NIC its decode instance announced");
    }
    if (d.length != theirs[0][k % tp].length) {
      return InvalidArgument(name + " differs in size from the same rank's on NIC 0");
    }
    theirs[nic].push_back(std::move(d));
  }
  out->assign(1, nic0);
  for (size_t i = 1; i < num_nics(); ++i) {
    std::vector<transfer::RemoteRegion> dst;
    for (const transfer::MemoryDescriptor& d : theirs[i % theirs.size()]) {
      dst.push_back({d, peer.nic_addrs[i].fi_addr});
    }
    out->push_back(std::move(dst));
  }
  return OkStatus();
}

int PrefillMessenger::Impl::PickNic(const Transfer& t) {
  auto it = peers_.find(t.peer.fabric_addr);
  if (it == peers_.end() || num_nics() == 1) return 0;
  const double now = NowSeconds();
  for (size_t tries = 0; tries < num_nics(); ++tries) {
    const size_t nic = next_nic_++ % num_nics();
    if (it->second.nic_down_until[nic] <= now) return static_cast<int>(nic);
  }
  return -1;
}

Result<uint64_t> PrefillMessenger::Impl::PostKv(Transfer* t, const KvWrite& w, bool count) {
  const int nic = PickNic(*t);
  Result<uint64_t> key = Unavailable("no NIC in rotation reaches the decode instance");
  const uint64_t bytes = uint64_t{w.shape.bytes_per_page} * w.shape.dst_pages.size();
  if (nic >= 0) {
    const size_t n = static_cast<size_t>(nic);
    transfer::PagedWriteRequest req = w.shape;
    req.src = w.draft ? draft_mrs_[n][static_cast<size_t>(w.src_rank)] : KvMr(n, w.src_rank);
    req.dst = (w.draft ? t->draft_nic_dst : t->nic_dst)[n][static_cast<size_t>(w.dst_rank)];
    req.imm = t->imm;
    auto slot = std::make_shared<transfer::TransferId>(0);
    auto id = Nic(n).SubmitPagedWrite(std::move(req), WriteDone(t->request_id, n, slot));
    if (id.ok()) {
      *slot = *id;
      key = InflightKey(n, *id);
      owner_->metrics_.NicBytes(n, bytes);
    } else {
      key = id.status();
    }
  }
  Track(t, key, t->imm, bytes, static_cast<uint32_t>(w.shape.dst_pages.size()), count);
  return key;
}

bool PrefillMessenger::Impl::MaybeReroute(Transfer* t, size_t nic, uint32_t imm,
                                          const Status& status) {
  // NIC 0 carries the control messages and the metadata: its loss is the peer's.
  if (nic == 0 || t->nic_dst.size() < 2) return false;
  auto peer = peers_.find(t->peer.fabric_addr);
  if (peer == peers_.end()) return false;
  if (peer->second.nic_down_until[nic] <= NowSeconds()) {
    PD_LOG_WARN(
        "prefill messenger: NIC {} out of rotation towards the decode instance of request {} "
        "for {} s: {}",
        nic, t->request_id, kNicDownS, status.ToString());
  }
  peer->second.nic_down_until[nic] = NowSeconds() + kNicDownS;
  // A write under an older imm: every KV write was re-posted under t->imm since.
  if (imm != t->imm || t->rerouting) return true;
  t->rerouting = true;
  owner_->metrics_.Rerouted();
  Reroute m{t->request_id, static_cast<uint16_t>(nic)};
  auto sent = domain_->SubmitSend(t->peer, codec_->Encode(m, peer->second.session), nullptr);
  if (!sent.ok()) {
    t->rerouting = false;
    return false;
  }
  return true;
}

int PrefillMessenger::Impl::LiveWrites(const Transfer& t) const {
  int n = 0;
  for (const auto& [key, w] : t.inflight) n += (w.imm == t.imm || w.imm == t.meta_imm) ? 1 : 0;
  return n;
}

void PrefillMessenger::Impl::CheckStalledNics(double now) {
  if (num_nics() == 1) return;
  const double stall_s = 2 * options_.domain.op_timeout_s;
  std::vector<std::pair<uint64_t, size_t>> stalled;  // (request, NIC)
  for (auto& [id, t] : transfers_) {
    if (!t->error.ok() || t->rerouting) continue;
    for (const auto& [key, w] : t->inflight) {
      if (InflightNic(key) != 0 && w.imm == t->imm && now - w.posted_at > stall_s) {
        stalled.push_back({id, InflightNic(key)});
        break;
      }
    }
  }
  for (const auto& [id, nic] : stalled) {
    Transfer* t = Find(id);
    if (t == nullptr) continue;
    const Status stall =
        DeadlineExceeded("a KV write on NIC " + std::to_string(nic) + " has not come back for " +
                         std::to_string(static_cast<int>(stall_s)) + " s");
    if (!MaybeReroute(t, nic, t->imm, stall)) Fail(t, stall.WithContext("KV write"));
  }
}

void PrefillMessenger::Impl::OnRerouteReply(const RerouteReply& reply, const Frame& frame) {
  const std::string* sender = Sender(frame, "RerouteReply", reply.request_id);
  if (sender == nullptr) return;
  Transfer* t = Find(reply.request_id);
  if (t == nullptr || t->peer.fabric_addr != *sender || !t->rerouting) return;
  t->rerouting = false;
  if (t->error.ok() && reply.new_imm != 0) {
    if (reply.new_imm == t->meta_imm || reply.new_imm == t->imm) {
      Fail(t, InvalidArgument("RerouteReply for request " + std::to_string(t->request_id) +
                              " names an imm already in use"));
      return;
    }
    PD_LOG_WARN("prefill messenger: request {}: re-posting its {} KV write(s) on the NICs left",
                t->request_id, t->log.size());
    t->imm = reply.new_imm;
    // A refused post fails t, which may free it: look it up again after each.
    const uint64_t id = t->request_id;
    for (size_t i = 0; i < t->log.size(); ++i) {
      (void)PostKv(t, t->log[i], /*count=*/false);
      t = Find(id);
      if (t == nullptr || !t->error.ok()) return;
    }
    if (t->checksums_posted) {
      Track(t, SubmitChecksums(t), t->imm, ChecksumBytes(static_cast<uint32_t>(num_layers_)), 1,
            /*count=*/false);
      t = Find(id);
      if (t == nullptr || !t->error.ok()) return;
    }
  }
  TryFinish(t);
}

}  // namespace pd::messenger
