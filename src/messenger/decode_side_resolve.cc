// The decode messenger's peer resolver: a prefill instance that restarted listens on a new fabric
// endpoint under the same bootstrap URL. A thread of its own (lookups may block) asks
// options.resolve_address for each peer's address; the messenger thread fails over the attempts
// in flight on a peer whose address changed (its old process is gone) and greets the new one.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/thread_util.h"
#include "messenger/decode_side_impl.h"

namespace pd::messenger {

void DecodeMessenger::Impl::ResolveLoop() {
  SetCurrentThreadName("pd-kv-resolve");
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.resolve_interval_s));
  for (;;) {
    {
      MutexLock lock(&resolve_mu_);
      const auto until = std::chrono::steady_clock::now() + interval;
      while (!resolve_stop_ && resolve_cv_.WaitUntil(&resolve_mu_, until)) {
      }
      if (resolve_stop_) return;
    }
    const std::vector<PeerStatus> peers = Peers();
    for (size_t i = 0; i < peers.size(); ++i) {
      if (peers[i].state == PeerStatus::State::kRefused || peers[i].removed) continue;
      Result<std::string> addr = options_.resolve_address(PrefillPeer{peers[i].name, ""});
      if (!addr.ok()) continue;  // down or not back yet: asked again next round
      queue_->Post([this, i, a = std::move(addr).value()] { Readdress(static_cast<int>(i), a); });
    }
  }
}

void DecodeMessenger::Impl::StopResolver() {
  {
    MutexLock lock(&resolve_mu_);
    resolve_stop_ = true;
  }
  resolve_cv_.SignalAll();
  if (resolver_.joinable()) resolver_.join();
}

void DecodeMessenger::Impl::Readdress(int peer, const std::string& fabric_address) {
  Peer& p = peers_[peer];
  if (p.config.fabric_address == fabric_address || p.state == PeerStatus::State::kRefused) return;
  PD_LOG_INFO(
      "decode messenger: prefill instance {} has a new fabric endpoint (restarted): "
      "greeting it there",
      p.config.name);
  // The old process is gone: its attempts fail over now, its fences lift.
  MarkDown(peer, Unavailable("it restarted at a new fabric endpoint"));
  if (p.session != 0) replay_.Forget(std::to_string(p.session));
  ForgetTried(peer);
  p.session = 0;  // the new process's comes with its HelloReply
  p.config.fabric_address = fabric_address;
  p.have_addr = false;
  ++p.generation;
  p.state = PeerStatus::State::kDown;
  p.hello_interval = 0.0;
  p.last_hello = -1e9;
  PublishPeer(peer);
}

}  // namespace pd::messenger

namespace pd::messenger {

void DecodeMessenger::Impl::SetPeers(std::vector<PrefillPeer> peers) {
  queue_->Post([this, peers = std::move(peers)] { ApplyPeers(peers); });
}

void DecodeMessenger::Impl::ApplyPeers(const std::vector<PrefillPeer>& wanted) {
  std::vector<bool> keep(peers_.size(), false);
  for (const PrefillPeer& w : wanted) {
    auto it = std::find_if(peers_.begin(), peers_.end(),
                           [&](const Peer& p) { return p.config.name == w.name; });
    if (it == peers_.end()) {  // a new member
      PD_LOG_INFO("decode messenger: prefill instance {} joined: greeting it", w.name);
      Peer peer;
      peer.config = w;
      peers_.push_back(std::move(peer));
      keep.push_back(true);
      {
        MutexLock lock(&peers_mu_);
        peer_status_.push_back({w.name, PeerStatus::State::kWaiting, "", 0, false, false});
      }
      const int added = static_cast<int>(peers_.size()) - 1;
      if (Status s = RegisterPeerRegions(added); !s.ok()) {
        peers_[added].state = PeerStatus::State::kRefused;
        peers_[added].reason = "cannot register our KV regions for it: " + s.ToString();
        PD_LOG_ERROR("decode messenger: prefill instance {}: {}", w.name, peers_[added].reason);
        PublishPeer(added);
      }
      continue;
    }
    const int i = static_cast<int>(it - peers_.begin());
    keep[i] = true;
    if (it->removed) {
      PD_LOG_INFO("decode messenger: prefill instance {} is back", w.name);
      it->removed = false;
      if (it->state == PeerStatus::State::kDraining) it->state = PeerStatus::State::kDown;
      it->hello_interval = 0.0;
      it->last_hello = -1e9;
      PublishPeer(i);
    }
    if (!w.fabric_address.empty()) Readdress(i, w.fabric_address);
  }
  for (size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    if (keep[i] || p.removed) continue;
    PD_LOG_INFO(
        "decode messenger: prefill instance {} left the cluster: nothing new goes to it ({} "
        "transfers in flight)",
        p.config.name, p.outstanding);
    p.removed = true;
    PublishPeer(static_cast<int>(i));
  }
  TellPeers();
}

}  // namespace pd::messenger
