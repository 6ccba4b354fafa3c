// Private to the decode messenger: DecodeMessenger::Impl's definition and the per-request and
// per-peer state it keeps, shared by decode_side.cc (lifecycle, peers, handshake, the public
// class) and decode_side_transfer.cc (the per-request transfer flow). Not for other users.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/rate_limited_log.h"
#include "engine/dp_engine.h"
#include "messenger/channel.h"
#include "messenger/decode_side.h"
#include "messenger/handshake.h"
#include "messenger/kv_checksum.h"
#include "transfer/host_buffer.h"

namespace pd::messenger {
namespace decode_internal {

// Shared by a request's engine callbacks and the messenger thread.
struct RequestInfo {
  std::vector<int32_t> prefill_tokens;  // the prompt without its last token
  Mutex mu;
  Status failure GUARDED_BY(mu);  // set before the messenger aborts the request
};

struct Req {
  int64_t id = 0;
  uint64_t wire_id = 0;  // the current attempt's (each attempt has its own)
  std::shared_ptr<RequestInfo> info;
  std::vector<int32_t> pages;  // the reserved page table (whole prompt)
  int first_page = 0;          // pages before it came from our prefix cache: not transferred
  bool holding = false;        // the messenger's own reference on `pages` (RetainPages)
  bool done_received = false;  // the current attempt's PrefillDone (ok) arrived
  int attempts = 0;
  std::vector<int> tried;  // peer indices (a peer that restarts is taken out)
  bool in_flight = false;
  // Waiting for a prefill instance (none eligible, one may come back): until when, and the error
  // it fails with then. 0: not waiting.
  double wait_until = 0.0;
  Status wait_error;
  int peer = -1;
  uint32_t imm = 0;          // the KV page writes' (a Reroute replaces it)
  uint64_t expected = 0;     // KV writes the attempt's counter expects
  uint32_t meta_imm = 0;     // the metadata write's (counted apart)
  bool meta_landed = false;  // the current attempt's metadata write landed (and was handled)
  int meta_slot = -1;
  double start = 0.0;
  double deadline = 0.0;
  int64_t attempt_ns = 0;  // when the current attempt's PrefillRequest went out (trace only)
};

struct Peer {
  PrefillPeer config;
  transfer::PeerAddr addr;
  bool have_addr = false;
  PeerStatus::State state = PeerStatus::State::kWaiting;
  std::string reason;
  ShardScheme scheme;
  int outstanding = 0;
  double last_hello = -1e9;
  double hello_interval = 0.0;  // grows while the peer is down
  double last_heartbeat = -1e9;
  uint64_t session = 0;  // its process's, from its HelloReply; 0: not known yet
  uint32_t max_message_bytes = kMinMessageBytes;  // the largest control message it receives
  uint32_t generation = 0;  // bumped when its address changes (a restart): older sends don't count
  bool removed = false;     // left out by SetPeers: not picked, not greeted
  bool was_accepted = false;  // it accepted us once
  // Our regions as this peer may write them: registered for it alone, so its keys can be revoked
  // (RevokeKeys) without touching any other peer's.
  std::vector<transfer::MemoryRegion> kv_mrs;                   // per rank (NIC 0)
  std::vector<std::vector<transfer::MemoryRegion>> nic_kv_mrs;  // [NIC - 1][rank]
  // The same for the draft KV region (DecodeMessengerOptions::draft_kv); empty without one.
  std::vector<transfer::MemoryRegion> draft_mrs;
  std::vector<std::vector<transfer::MemoryRegion>> nic_draft_mrs;
  transfer::MemoryRegion meta_mr;
};

// Whether a peer may still be working for us (accepted, or draining its transfers in flight):
// such a peer is sent heartbeats and Cancels.
inline bool Serving(const Peer& p) {
  return p.state == PeerStatus::State::kAccepted || p.state == PeerStatus::State::kDraining;
}

struct PendingSend {
  int peer = -1;
  double deadline = 0.0;
  uint32_t generation = 0;  // the peer's when sent
};

// An attempt that ended while its prefill instance may still write: its pages (a reference of
// their own) and metadata slot stay out of use until that instance answers PrefillDone (it does so
// once every write it posted has completed), is found unreachable, or the deadline passes.
// A successful attempt whose KV landed before its metadata leaves only its slot here (no pages,
// kv_landed): the metadata landing lifts it too, and the request decodes meanwhile.
struct Fence {
  int peer = -1;
  int meta_slot = -1;
  uint32_t meta_imm = 0;       // its counter lives as long as the slot is held
  std::vector<int32_t> pages;  // empty: no page reference held
  double deadline = 0.0;
  bool kv_landed = false;    // every KV write landed: only the metadata is still to come
  bool meta_landed = false;  // the metadata write landed
  int64_t request_id = -1;   // for on_metadata (the request may have ended)
};

// The tensor-parallel ranks a transfer into `runner`'s instance spans: its ranks, or with data-
// parallel ranks (engine::DataParallelSize) one, since each DP rank holds its own requests' KV.
inline int TensorParallelRanks(const engine::ModelRunner& runner) {
  return runner.num_ranks() / engine::DataParallelSize(runner);
}

}  // namespace decode_internal

using decode_internal::Fence;
using decode_internal::Peer;
using decode_internal::PendingSend;
using decode_internal::Req;
using decode_internal::RequestInfo;
using decode_internal::Serving;
using decode_internal::TensorParallelRanks;

class DecodeMessenger::Impl {
 public:
  Impl(DecodeMessenger* owner, const DecodeMessengerOptions& options, engine::ModelRunner& runner)
      : owner_(owner),
        options_(options),
        spec_(runner.region().spec()),
        runner_(runner),
        meta_bytes_(static_cast<uint32_t>(runner.config().hidden_size) * 4),
        format_(MakeKvFormat(options.model_hash, spec_, options.kv_checksum, options.speculative,
                             MakeDraftKvFormat(options.draft_kv))),
        scheme_(MakeShardScheme(runner.config(), TensorParallelRanks(runner))),
        dp_size_(engine::DataParallelSize(runner)),
        pages_per_dp_rank_(runner.region().num_pages()),
        slot_bytes_(meta_bytes_ + (options.kv_checksum ? ChecksumBytes(format_.num_layers) : 0)),
        codec_(std::make_shared<FrameCodec>(options.cluster_secret)),
        queue_(std::make_shared<TaskQueue>()) {
    std::random_device rd;
    wire_prefix_ = (static_cast<uint64_t>(rd()) << 32);
    next_imm_ = rd() | 1u;
    for (const PrefillPeer& p : options.peers) {
      Peer peer;
      peer.config = p;
      peers_.push_back(std::move(peer));
      peer_status_.push_back({p.name, PeerStatus::State::kWaiting, "", 0});
    }
  }

  Status Init();
  void Stop();
  Status WaitForPeers(double timeout_s) EXCLUDES(peers_mu_);
  std::vector<PeerStatus> Peers() const EXCLUDES(peers_mu_);
  void SetPeers(std::vector<PrefillPeer> peers);  // posts to the messenger thread
  Result<int64_t> Submit(std::vector<int32_t> prompt, const engine::SamplingParams& sampling,
                         engine::OutputCallback on_output) EXCLUDES(peers_mu_);
  const std::string& address() const { return domain_->info().address; }

 private:
  void Loop();
  void Greet();
  void Heartbeat();
  Hello MakeHello(int peer) const;
  void OnFrame(Frame frame);
  void OnHelloReply(const HelloReply& reply, const Frame& frame);
  void OnPrefillDone(const PrefillDone& done, const Frame& frame);
  // A prefill instance lost a NIC under an attempt: a fresh imm for its writes unless its KV has
  // landed already (decode_side_transfer.cc).
  void OnReroute(const Reroute& reroute, const Frame& frame);
  // Deregisters peers_[peer]'s KV regions on our NIC `nic` >= 1 and registers them anew: no write
  // of that peer still held on the way to that NIC can land any more.
  Status RevokeNicKeys(int peer, size_t nic);
  // False (and counted) unless `frame` comes from peers_[peer]'s current session and is new.
  bool FromPeer(int peer, const Frame& frame);
  void OnReserved(const engine::KvReservation& reservation, std::shared_ptr<RequestInfo> info);
  void StartAttempt(Req* r, const Status& last_error);
  Status ExpectWrites(Req* r, uint64_t expected);
  // The attempt's PrefillRequest and as many PromptChunks as its ids need. A local failure
  // (encoding, size, the domain refusing it) is returned: it fails the attempt, not the peer;
  // `sent_any` says whether the PrefillRequest itself had left.
  Status SendPrefillRequest(Req* r, uint32_t num_pages, uint64_t expected, bool* sent_any);
  void OnKvArrived(int64_t id, uint32_t imm);
  // --kv-checksum: the landed KV of r's attempt against the checksum record the prefill wrote.
  Status CheckKvChecksums(const Req& r) const;
  // The regions r's transfer writes (every rank's, or its DP rank's alone) as the peer may write
  // them, and its pages as those regions number them.
  std::vector<const transfer::MemoryRegion*> TargetRegions(const Req& r) const;
  std::vector<int32_t> TargetPages(const Req& r, uint32_t num_pages) const;
  int TargetRank(const Req& r, size_t k) const;  // the rank of TargetRegions(r)[k]
  // The metadata write of attempt `wire_id` landed: check the canary, hand it to on_metadata and
  // lift the slot's fence if the KV had landed already.
  void OnMetaArrived(uint64_t wire_id, uint32_t meta_imm);
  void DeliverMetadata(int64_t id, int peer, int meta_slot);
  uint32_t NextImm();
  void FreeMetaSlot(int slot, uint32_t meta_imm);
  void FailAttempt(Req* r, const Status& status);
  // No peer is eligible for r's next attempt: whether it waits for one (prefill_wait_s; a peer
  // that accepted us once may come back) instead of failing with `why`.
  bool Wait(Req* r, const Status& why);
  // Starts the waiting requests' attempts once a peer is eligible; fails those whose wait ended.
  void StartWaiting();
  // peers_[peer] restarted: the requests that tried its old process may try the new one.
  void ForgetTried(int peer);
  // Whether a peer that accepted us once and is down or draining may serve again (not removed,
  // not refused).
  bool MayComeBack() const;
  // Ends the current attempt; with `fence` its pages and metadata slot wait in fences_ for the
  // prefill instance to stop writing, else the slot is free at once.
  void EndAttempt(Req* r, bool fence);
  void ReleaseHold(Req* r);
  // `why` says, should the fence wait for a metadata that never landed, what ended the wait.
  void ReleaseFence(uint64_t wire_id, const char* why);
  void MetadataNeverLanded(int64_t id, int peer, const char* why);
  void Fail(Req* r, const Status& status);
  void OnEnded(int64_t id);
  void CheckDeadlines();
  // The peers r's next attempt may go to (accepted, not removed, not tried), and the one it goes
  // to (options_.choose_prefill, else the fewest attempts in flight); -1 when there is none.
  std::vector<int> Eligible(const Req& r) const;
  int PickPeer(const Req& r) const;
  // options_.on_peers with the names of the peers not removed.
  void TellPeers() const;
  // Copies peers_[peer]'s name, state, reason and outstanding to peer_status_ and wakes
  // WaitForPeers: call after changing any of them.
  void PublishPeer(int peer) EXCLUDES(peers_mu_);
  Req* Find(int64_t id);
  void UpdateActive();
  // Sends a control message to peers_[peer]. An error returned is local (the message never left:
  // too large, refused by the domain) and says nothing about the peer; a send that fails on its
  // way or misses send_timeout_s marks the peer down.
  Status Send(int peer, const Message& m);
  void OnSendDone(transfer::TransferId id, const Status& status);
  void MarkDown(int peer, const Status& why);
  // The resolver thread (options_.resolve_address): every resolve_interval_s until Stop, each
  // peer's address; a changed one goes to Readdress on the messenger thread.
  void ResolveLoop() EXCLUDES(resolve_mu_);
  void StopResolver() EXCLUDES(resolve_mu_);
  void Readdress(int peer, const std::string& fabric_address);
  void ApplyPeers(const std::vector<PrefillPeer>& peers) EXCLUDES(peers_mu_);
  // Registers our KV regions and metadata buffer for peers_[peer] (fresh keys).
  Status RegisterPeerRegions(int peer);
  // Deregisters peers_[peer]'s regions and registers them anew: once this returns, no write of
  // that peer with the keys it was given can land (the provider rejects the old keys), whatever
  // it still has queued. A peer whose regions cannot be registered again is refused.
  void RevokeKeys(int peer, const Status& why);
  void PublishFences();

  DecodeMessenger* const owner_;
  const DecodeMessengerOptions options_;
  const engine::KvCacheSpec spec_;
  engine::ModelRunner& runner_;
  const uint32_t meta_bytes_;
  const KvFormat format_;
  // Per data-parallel rank when dp_size_ > 1 (engine/dp_engine.h): each request's pages (named by
  // engine::DpPageId) lie in one DP rank's region, the only one its transfer writes.
  const ShardScheme scheme_;
  const int dp_size_;
  const int32_t pages_per_dp_rank_;
  // One metadata slot: the metadata, then (--kv-checksum) the checksum record (kv_checksum.h).
  const uint64_t slot_bytes_;
  std::shared_ptr<FrameCodec> codec_;  // shared with the fabric worker's inbox
  std::shared_ptr<TaskQueue> queue_;
  // Declared before the domain so it is freed after it: peers may write here until it closes.
  transfer::HostBuffer meta_buffer_;  // (max_transfers, slot_bytes): where prefill writes metadata
  std::unique_ptr<transfer::Domain> domain_;  // NIC 0: control messages, metadata, KV
  std::vector<std::unique_ptr<transfer::Domain>> extra_domains_;  // NICs 1.. (KV only)
  std::thread thread_;
  std::atomic<bool> stopped_{false};
  std::thread resolver_;
  Mutex resolve_mu_;
  CondVar resolve_cv_;
  bool resolve_stop_ GUARDED_BY(resolve_mu_) = false;
  uint64_t wire_prefix_ = 0;

  // What other threads (WaitForPeers, Peers, Submit) see of peers_, one entry per peer.
  mutable Mutex peers_mu_;
  CondVar peers_cv_;
  std::vector<PeerStatus> peer_status_ GUARDED_BY(peers_mu_);

  // Messenger thread only (Stop reads them after joining that thread).
  std::vector<Peer> peers_;
  ReplayGuard replay_;        // by sender session
  ReplayGuard hello_replay_;  // HelloReplies, by sender address (seqs grow across restarts)
  std::unordered_map<int64_t, std::unique_ptr<Req>> reqs_;
  std::unordered_map<uint64_t, int64_t> by_wire_;
  std::unordered_map<transfer::TransferId, PendingSend> sends_;
  std::vector<int> free_meta_slots_;
  std::unordered_map<uint64_t, Fence> fences_;  // by attempt wire id
  uint32_t next_imm_ = 1;
  uint32_t next_wire_ = 1;
  RateLimitedLog warnings_{10.0};  // what a peer can provoke at will, per reason
};

}  // namespace pd::messenger
