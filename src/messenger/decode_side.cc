// The decode messenger's lifecycle (Init, Loop, Stop), its prefill peers (greeting, control
// message sends and their timeouts, marking a peer down, the Hello handshake, WaitForPeers,
// picking a peer) and the public DecodeMessenger class. The per-request transfer flow is in
// decode_side_transfer.cc; Impl's definition in decode_side_impl.h.
#include "messenger/decode_side.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/log.h"
#include "common/thread_util.h"
#include "messenger/decode_side_impl.h"
#include "messenger/nics.h"

namespace pd::messenger {

Status DecodeMessenger::Impl::Init() {
  ControlInbox inbox;
  inbox.codec = codec_;
  inbox.queue = queue_;
  inbox.on_frame = [this](Frame f) { OnFrame(std::move(f)); };
  inbox.metrics = &owner_->metrics_;
  inbox.side = "decode messenger";
  inbox.max_queued = options_.max_queued_messages;
  transfer::DomainOptions first =
      options_.nics.empty() ? options_.domain : NicDomainOptions(options_.domain, options_.nics[0]);
  ASSIGN_OR_RETURN(domain_, OpenMessengerDomain(first, options_.max_message_bytes, inbox));
  RETURN_IF_ERROR(CheckKvCapabilities(domain_->info()));
  // Writes landing on any NIC count in NIC 0's imm table.
  ASSIGN_OR_RETURN(extra_domains_,
                   OpenExtraNics(options_.domain, options_.nics, domain_->shared_imm_counters()));
  std::string nics = NicLabel(first, domain_->info());
  for (size_t i = 1; i < options_.nics.size(); ++i) nics += ", " + options_.nics[i];
  PD_LOG_INFO("decode messenger: provider {} on {} NIC(s): {}", domain_->info().provider,
              1 + extra_domains_.size(), nics);
  const int slots = std::max(1, options_.max_transfers);
  ASSIGN_OR_RETURN(meta_buffer_,
                   transfer::HostBuffer::Allocate(static_cast<size_t>(slots) * slot_bytes_));
  for (size_t i = 0; i < peers_.size(); ++i) RETURN_IF_ERROR(RegisterPeerRegions(i));
  PD_LOG_INFO(
      "decode messenger: {} rank KV region(s) registered for each of {} prefill peer(s) "
      "(tp_size {}, {}){}",
      runner_.num_ranks(), peers_.size(), scheme_.tp_size, DescribeKvCache(format_, scheme_),
      dp_size_ > 1
          ? "; one region per data-parallel rank, a request's KV written to its rank's alone"
          : "");
  for (int i = slots - 1; i >= 0; --i) free_meta_slots_.push_back(i);
  TellPeers();  // before the messenger thread, which owns peers_ from now on
  thread_ = std::thread([this] { Loop(); });
  if (options_.resolve_address) resolver_ = std::thread([this] { ResolveLoop(); });
  return OkStatus();
}

Status DecodeMessenger::Impl::RegisterPeerRegions(int peer) {
  Peer& p = peers_[peer];
  ASSIGN_OR_RETURN(p.kv_mrs,
                   RegisterRankRegions(*domain_, runner_, transfer::RegionAccess::kRemoteWrite));
  ASSIGN_OR_RETURN(p.meta_mr, domain_->RegisterMemory(meta_buffer_.data(), meta_buffer_.size(),
                                                      transfer::RegionAccess::kRemoteWrite));
  p.nic_kv_mrs.clear();
  for (auto& d : extra_domains_) {
    ASSIGN_OR_RETURN(auto mrs,
                     RegisterRankRegions(*d, runner_, transfer::RegionAccess::kRemoteWrite));
    p.nic_kv_mrs.push_back(std::move(mrs));
  }
  return OkStatus();
}

void DecodeMessenger::Impl::RevokeKeys(int peer, const Status& why) {
  Peer& p = peers_[peer];
  for (const transfer::MemoryRegion& mr : p.kv_mrs) (void)domain_->Deregister(mr);
  (void)domain_->Deregister(p.meta_mr);
  for (size_t i = 0; i < p.nic_kv_mrs.size() && i < extra_domains_.size(); ++i) {
    for (const transfer::MemoryRegion& mr : p.nic_kv_mrs[i])
      (void)extra_domains_[i]->Deregister(mr);
  }
  p.nic_kv_mrs.clear();
  p.kv_mrs.clear();
  p.meta_mr = {};
  owner_->metrics_.KeysRevoked();
  PD_LOG_WARN(
      "decode messenger: revoked prefill instance {}'s keys ({}): none of its late writes "
      "can land",
      p.config.name, why.ToString());
  if (Status s = RegisterPeerRegions(peer); !s.ok()) {
    PD_LOG_ERROR("decode messenger: prefill instance {} refused: {}", p.config.name, s.ToString());
    p.state = PeerStatus::State::kRefused;
    p.reason = "prefill instance " + p.config.name +
               ": registering the KV regions anew failed: " + s.ToString();
    PublishPeer(peer);
  }
}

void DecodeMessenger::Impl::Loop() {
  SetCurrentThreadName("pd-decode-kv");
  (void)SetCurrentThreadLatencySensitive();  // best effort: on every request's path
  if (options_.tracer != nullptr) options_.tracer->SetThreadName("decode messenger");
  do {
    Greet();
    Heartbeat();
    CheckDeadlines();
    StartWaiting();
    owner_->metrics_.SetUnclaimedExpired(domain_->imm_counters().expired_arrivals());
  } while (queue_->RunFor(std::chrono::milliseconds(20)));
}

void DecodeMessenger::Impl::Stop() {
  if (stopped_.exchange(true)) return;
  StopResolver();  // before the queue it posts to
  queue_->Stop();
  if (thread_.joinable()) thread_.join();
  for (auto& [id, r] : reqs_) {
    if (!r->in_flight) continue;
    domain_->imm_counters().Remove(r->imm);
    if (Serving(peers_[r->peer])) {
      (void)domain_->SubmitSend(peers_[r->peer].addr,
                                codec_->Encode(Cancel{r->wire_id}, peers_[r->peer].session),
                                nullptr);
    }
  }
  for (auto& [id, r] : reqs_) ReleaseHold(r.get());
  for (auto& [wire, f] : fences_) {
    if (!f.pages.empty()) owner_->inner_->ReleasePages(std::move(f.pages));
  }
  fences_.clear();
  reqs_.clear();
}

// ------------------------------------------------------------------ peers

void DecodeMessenger::Impl::Greet() {
  const double now = NowSeconds();
  for (size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    // A draining peer is asked again too: its HelloReply counts only from a new session (it
    // restarted at the same address).
    const bool down = p.state == PeerStatus::State::kDown ||
                      (p.state == PeerStatus::State::kDraining && p.outstanding == 0);
    if (p.removed || (p.state != PeerStatus::State::kWaiting && !down) ||
        now - p.last_hello < std::max(options_.hello_retry_s, p.hello_interval)) {
      continue;
    }
    p.last_hello = now;
    if (!p.have_addr) {
      auto addr = domain_->AddPeer(p.config.fabric_address);
      if (!addr.ok()) {
        PD_LOG_WARN("decode messenger: prefill peer {}: {}", p.config.name,
                    addr.status().ToString());
        continue;
      }
      p.addr = *addr;
      p.have_addr = true;
    }
    if (Status s = Send(static_cast<int>(i), MakeHello(static_cast<int>(i))); !s.ok()) {
      PD_LOG_WARN("decode messenger: cannot greet prefill instance {}: {}", p.config.name,
                  s.ToString());
    }
  }
}

// A prefill instance killed mid-transfer writes nothing more and says nothing: only a send to it
// can tell (it fails, or is not delivered within send_timeout_s; either marks the peer down,
// which retries its attempts elsewhere). A live instance answers with a HelloReply that changes
// nothing.
void DecodeMessenger::Impl::Heartbeat() {
  if (options_.heartbeat_s <= 0) return;
  const double now = NowSeconds();
  for (size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    if (!Serving(p) || p.outstanding == 0 || now - p.last_heartbeat < options_.heartbeat_s) {
      continue;
    }
    p.last_heartbeat = now;
    (void)Send(static_cast<int>(i), MakeHello(static_cast<int>(i)));  // a local error: next time
  }
}

Hello DecodeMessenger::Impl::MakeHello(int peer) const {
  Hello hello;
  hello.instance_name = options_.instance_name;
  hello.format = format_;
  hello.scheme = scheme_;
  hello.fabric_address = address();
  hello.recipient_address = peers_[peer].config.fabric_address;
  hello.max_message_bytes = options_.max_message_bytes;
  for (const auto& d : extra_domains_) hello.nic_addresses.push_back(d->info().address);
  hello.dp_size = static_cast<uint16_t>(dp_size_);
  return hello;
}

Status DecodeMessenger::Impl::Send(int peer, const Message& m) {
  if (options_.send_fault) RETURN_IF_ERROR(options_.send_fault(m));
  // A Hello names no session: the peer's may have changed (a restart) since we last heard it.
  const uint64_t to = std::holds_alternative<Hello>(m) ? 0 : peers_[peer].session;
  std::weak_ptr<TaskQueue> weak = queue_;
  auto slot = std::make_shared<transfer::TransferId>(0);
  auto id = domain_->SubmitSend(peers_[peer].addr, codec_->Encode(m, to),
                                [this, weak, slot](const Status& s) {
                                  if (auto q = weak.lock()) {
                                    q->Post([this, slot, s] { OnSendDone(*slot, s); });
                                  }
                                });
  if (!id.ok()) return id.status().WithContext("sending to " + peers_[peer].config.name);
  *slot = *id;
  sends_[*id] = {peer, NowSeconds() + options_.send_timeout_s, peers_[peer].generation};
  return OkStatus();
}

void DecodeMessenger::Impl::OnSendDone(transfer::TransferId id, const Status& status) {
  auto it = sends_.find(id);
  if (it == sends_.end()) return;  // timed out and handled already
  const PendingSend send = it->second;
  sends_.erase(it);
  // A send to the address a restarted peer had says nothing about the new one.
  if (!status.ok() && send.generation == peers_[send.peer].generation) MarkDown(send.peer, status);
}

// The peer cannot be reached, or did not confirm the end of a transfer in time: revoke its keys
// if it may still be writing, fail its transfers now (they retry elsewhere), lift its fences and
// greet it again with back-off.
void DecodeMessenger::Impl::MarkDown(int peer, const Status& why) {
  Peer& p = peers_[peer];
  if (p.state == PeerStatus::State::kRefused) return;
  if (p.state != PeerStatus::State::kDown) {
    PD_LOG_WARN("decode messenger: prefill instance {} marked down: {}", p.config.name,
                why.ToString());
  }
  // Whatever it still has queued must not land in pages we are about to reuse: a peer found
  // unreachable may only be stalled (SIGSTOP, a partition) and resume later.
  const bool writing = std::any_of(fences_.begin(), fences_.end(),
                                   [&](const auto& f) { return f.second.peer == peer; }) ||
                       std::any_of(reqs_.begin(), reqs_.end(), [&](const auto& r) {
                         return r.second->in_flight && r.second->peer == peer;
                       });
  if (writing) RevokeKeys(peer, why);  // may refuse it for good
  if (p.state == PeerStatus::State::kAccepted || p.state == PeerStatus::State::kDown ||
      p.state == PeerStatus::State::kDraining) {
    p.state = PeerStatus::State::kDown;
  }
  p.hello_interval = std::min(30.0, std::max(2.0, 2 * p.hello_interval));
  PublishPeer(peer);
  std::vector<Req*> affected;
  for (auto& [id, r] : reqs_) {
    if (r->in_flight && r->peer == peer) affected.push_back(r.get());
  }
  for (Req* r : affected) {
    FailAttempt(r, Unavailable("prefill instance " + p.config.name + " is unreachable (" +
                               why.message() + ")"));
  }
  // Its keys are revoked (above): none of its writes can land any more.
  std::vector<uint64_t> released;
  for (const auto& [wire, f] : fences_) {
    if (f.peer == peer) released.push_back(wire);
  }
  for (uint64_t wire : released) ReleaseFence(wire, "the instance's keys were revoked");
}

void DecodeMessenger::Impl::OnFrame(Frame frame) {
  if (auto* reply = std::get_if<HelloReply>(&frame.message)) {
    OnHelloReply(*reply, frame);
  } else if (auto* done = std::get_if<PrefillDone>(&frame.message)) {
    OnPrefillDone(*done, frame);
  } else if (auto* reroute = std::get_if<Reroute>(&frame.message)) {
    OnReroute(*reroute, frame);
  } else {
    owner_->metrics_.Rejected();
    PD_LOG_WARN_LIMITED(warnings_, "type", "decode messenger: unexpected message type {}",
                        frame.message.index() + 1);
  }
}

bool DecodeMessenger::Impl::FromPeer(int peer, const Frame& frame) {
  Status s =
      frame.sender_session == peers_[peer].session
          ? replay_.Check(std::to_string(frame.sender_session), frame.sender_seq)
          : FailedPrecondition("a frame from session " + std::to_string(frame.sender_session) +
                               " of " + peers_[peer].config.name + ", whose session is " +
                               std::to_string(peers_[peer].session) + " (replayed?)");
  if (s.ok()) return true;
  owner_->metrics_.Replayed();
  PD_LOG_WARN_LIMITED(warnings_, "replay", "decode messenger: dropped a control message: {}",
                      s.ToString());
  return false;
}

void DecodeMessenger::Impl::OnHelloReply(const HelloReply& reply, const Frame& frame) {
  auto it = std::find_if(peers_.begin(), peers_.end(), [&](const Peer& p) {
    return p.config.fabric_address == reply.fabric_address;
  });
  if (it == peers_.end()) {
    owner_->metrics_.Rejected();
    PD_LOG_WARN("decode messenger: HelloReply from unknown instance '{}'", reply.instance_name);
    return;
  }
  const int peer = static_cast<int>(it - peers_.begin());
  if (Status s = hello_replay_.Check(reply.fabric_address, frame.sender_seq); !s.ok()) {
    owner_->metrics_.Replayed();
    return;
  }
  if (it->session != frame.sender_session) {
    if (it->session != 0) {  // it restarted: nothing of its previous run can write any more
      MarkDown(peer, Unavailable("it restarted (a new session)"));
      replay_.Forget(std::to_string(it->session));
      ForgetTried(peer);
    }
    it->session = frame.sender_session;
  }
  it->max_message_bytes = reply.max_message_bytes;
  std::string reason;
  if (!reply.accepted) {
    reason = "prefill instance " + it->config.name + " refused the handshake: " + reply.reason;
  } else if (Status ok = CheckCompatible(format_, reply.format); !ok.ok()) {
    reason = "prefill instance " + it->config.name + ": " + ok.message();
  } else if (Status plan = PlanTransfer(reply.scheme, scheme_, format_, 0).status(); !plan.ok()) {
    reason = "prefill instance " + it->config.name + ": " + plan.message();
  } else if (Status dp = CheckDataParallel(reply.dp_size, reply.scheme,
                                           static_cast<uint16_t>(dp_size_), scheme_);
             !dp.ok()) {
    reason = "prefill instance " + it->config.name + ": " + dp.message();
  }
  if (it->state != PeerStatus::State::kWaiting && it->state != PeerStatus::State::kDown) {
    return;  // a heartbeat's answer, or a late duplicate
  }
  it->state = reason.empty() ? PeerStatus::State::kAccepted : PeerStatus::State::kRefused;
  it->hello_interval = 0.0;
  it->reason = reason;
  it->scheme = reply.scheme;
  it->was_accepted = it->was_accepted || reason.empty();
  PublishPeer(peer);
  if (reason.empty()) {
    PD_LOG_INFO("decode messenger: prefill instance {} ('{}') accepted us", it->config.name,
                reply.instance_name);
  } else {
    PD_LOG_ERROR("decode messenger: {}", reason);
  }
}

void DecodeMessenger::Impl::PublishPeer(int peer) {
  const Peer& p = peers_[peer];
  {
    MutexLock lock(&peers_mu_);
    peer_status_[peer] = {p.config.name, p.state,   p.reason,
                          p.outstanding, p.removed, p.was_accepted};
  }
  peers_cv_.SignalAll();
}

Status DecodeMessenger::Impl::WaitForPeers(double timeout_s) {
  MutexLock lock(&peers_mu_);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::ceil<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
  while (std::any_of(peer_status_.begin(), peer_status_.end(),
                     [](const PeerStatus& p) { return p.state == PeerStatus::State::kWaiting; })) {
    if (!peers_cv_.WaitUntil(&peers_mu_, deadline)) break;
  }
  std::string refusals, silent;
  int accepted = 0;
  for (const PeerStatus& p : peer_status_) {
    if (p.state == PeerStatus::State::kAccepted) ++accepted;
    if (p.state == PeerStatus::State::kRefused)
      refusals += (refusals.empty() ? "" : "; ") + p.reason;
    if (p.state == PeerStatus::State::kDown) {
      silent += (silent.empty() ? "" : ", ") + p.name + " (unreachable)";
    }
    if (p.state == PeerStatus::State::kWaiting) silent += (silent.empty() ? "" : ", ") + p.name;
  }
  if (!refusals.empty()) return FailedPrecondition(refusals);
  if (accepted == 0) {
    return Unavailable("no prefill instance answered the handshake within " +
                       std::to_string(timeout_s) + " s (" + silent +
                       "): not running, unreachable, or a different cluster secret");
  }
  if (!silent.empty()) PD_LOG_WARN("decode messenger: no answer yet from {}", silent);
  return OkStatus();
}

std::vector<PeerStatus> DecodeMessenger::Impl::Peers() const {
  MutexLock lock(&peers_mu_);
  return peer_status_;
}

std::vector<int> DecodeMessenger::Impl::Eligible(const Req& r) const {
  std::vector<int> out;
  for (size_t i = 0; i < peers_.size(); ++i) {
    const Peer& p = peers_[i];
    if (p.state != PeerStatus::State::kAccepted || p.removed) continue;
    if (std::find(r.tried.begin(), r.tried.end(), static_cast<int>(i)) != r.tried.end()) continue;
    out.push_back(static_cast<int>(i));
  }
  return out;
}

int DecodeMessenger::Impl::PickPeer(const Req& r) const {
  const std::vector<int> eligible = Eligible(r);
  if (eligible.empty()) return -1;
  if (options_.choose_prefill) {
    std::vector<PrefillCandidate> candidates;
    for (int i : eligible) candidates.push_back({peers_[i].config.name, peers_[i].outstanding});
    const int k = options_.choose_prefill(r.info->prefill_tokens, candidates);
    if (k >= 0 && k < static_cast<int>(eligible.size())) return eligible[k];
  }
  int best = eligible[0];
  for (int i : eligible)
    if (peers_[i].outstanding < peers_[best].outstanding) best = i;
  return best;
}

void DecodeMessenger::Impl::TellPeers() const {
  if (!options_.on_peers) return;
  std::vector<std::string> names;
  for (const Peer& p : peers_)
    if (!p.removed) names.push_back(p.config.name);
  options_.on_peers(names);
}

// ------------------------------------------------------------------ public

Result<std::unique_ptr<DecodeMessenger>> DecodeMessenger::Create(
    const DecodeMessengerOptions& options, engine::ModelRunner& runner,
    std::unique_ptr<engine::AsyncEngine> inner) {
  if (inner == nullptr) return InvalidArgument("DecodeMessenger needs an engine");
  if (options.peers.empty() && !options.dynamic_peers) {
    return InvalidArgument("DecodeMessenger needs prefill peers");
  }
  std::unique_ptr<DecodeMessenger> m(new DecodeMessenger());
  m->inner_ = std::move(inner);
  m->impl_ = std::make_unique<Impl>(m.get(), options, runner);
  m->metrics_.SetBytesPerToken(
      KvBytesPerToken(MakeKvFormat(options.model_hash, runner.region().spec()),
                      MakeShardScheme(runner.config(), TensorParallelRanks(runner))));
  RETURN_IF_ERROR(m->impl_->Init());
  return m;
}

DecodeMessenger::~DecodeMessenger() { Shutdown(); }

std::string PeersPrometheusText(const std::vector<PeerStatus>& peers) {
  const char* kNames[] = {"waiting", "accepted", "refused", "down", "draining", "removed"};
  int counts[6] = {0, 0, 0, 0, 0, 0};
  for (const PeerStatus& p : peers) ++counts[p.removed ? 5 : static_cast<int>(p.state)];
  std::string out = "# TYPE pdserve:kv_prefill_peers gauge\n";
  for (int i = 0; i < 6; ++i) {
    out += std::string("pdserve:kv_prefill_peers{state=\"") + kNames[i] + "\"} " +
           std::to_string(counts[i]) + "\n";
  }
  return out;
}

Status DecodeMessenger::WaitForPeers(double timeout_s) { return impl_->WaitForPeers(timeout_s); }
std::vector<PeerStatus> DecodeMessenger::peers() const { return impl_->Peers(); }
void DecodeMessenger::SetPeers(const std::vector<PrefillPeer>& peers) { impl_->SetPeers(peers); }

Result<int64_t> DecodeMessenger::Submit(std::vector<int32_t> prompt_ids,
                                        const engine::SamplingParams& sampling,
                                        engine::OutputCallback on_output) {
  return impl_->Submit(std::move(prompt_ids), sampling, std::move(on_output));
}

void DecodeMessenger::Abort(int64_t request_id) { inner_->Abort(request_id); }
engine::EngineStats DecodeMessenger::stats() const { return inner_->stats(); }
const model::ModelConfig& DecodeMessenger::config() const { return inner_->config(); }

void DecodeMessenger::Shutdown() {
  if (impl_) impl_->Stop();
  if (inner_) inner_->Shutdown();
}

const std::string& DecodeMessenger::fabric_address() const { return impl_->address(); }

}  // namespace pd::messenger
