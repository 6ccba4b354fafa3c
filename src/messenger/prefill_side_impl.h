// Private to the prefill messenger: PrefillMessenger::Impl's definition and the per-transfer state
// it keeps, shared by prefill_side.cc (lifecycle, control messages and the handshake, the public
// class) and prefill_side_transfer.cc (engine events, layer posting, transfer tracking). Not for
// other users.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/rate_limited_log.h"
#include "engine/dp_engine.h"
#include "messenger/channel.h"
#include "messenger/handshake.h"
#include "messenger/kv_checksum.h"
#include "messenger/prefill_side.h"
#include "messenger/shard_writes.h"
#include "transfer/host_buffer.h"

namespace pd::messenger {
namespace prefill_internal {

// Pages [first_page, end_page) of one request, computed by runner step `runner_step`: layer l of
// them may be written once progress >= runner_step * num_layers + l + 1.
struct LayerWork {
  uint64_t request_id = 0;
  uint64_t runner_step = 0;
  int first_page = 0;
  int end_page = 0;
  int next_layer = 0;
  bool is_last = false;
  int dp_rank = 0;  // the data-parallel rank that computes them: its progress counts (else 0)
};

// One KV paged write of a transfer, kept so that it can be re-posted on another NIC: its shape
// (pages, sizes, strides, offsets) and the ranks it goes between; src, dst and imm are set when it
// is posted.
struct KvWrite {
  int src_rank = 0;
  int dst_rank = 0;
  bool draft = false;  // between the draft KV regions (else the target's)
  transfer::PagedWriteRequest shape;
};

// A write in flight is known by InflightKey(nic, id): transfer ids are per domain.
inline uint64_t InflightKey(size_t nic, transfer::TransferId id) { return id * kMaxNics + nic; }
inline size_t InflightNic(uint64_t key) { return key % kMaxNics; }
inline transfer::TransferId InflightId(uint64_t key) { return key / kMaxNics; }

// How long a NIC whose write failed stays out of rotation towards that decode instance.
inline constexpr double kNicDownS = 30.0;

// A write posted and not yet come back.
struct InflightWrite {
  uint32_t imm = 0;  // the imm it carries: not the transfer's any more once a Reroute moved it
  double posted_at = 0.0;  // NowSeconds()
};

struct Transfer {
  uint64_t request_id = 0;  // the decode side's id (unique per decode instance, random prefix)
  transfer::PeerAddr peer;
  uint32_t imm = 0;       // every KV page write's
  uint32_t meta_imm = 0;  // the metadata write's (counted apart on the decode side)
  int64_t engine_id = -1;
  int num_tokens = 0;
  ShardPlan plan;                           // seeded with request_id
  std::vector<transfer::RemoteRegion> dst;  // per decode rank (NIC 0's)
  // [our NIC][decode rank]: the decode region our NIC writes into (the decode instance's NIC
  // nic % its NICs), with that NIC's address in our NIC's AV. [0] == dst.
  std::vector<std::vector<transfer::RemoteRegion>> nic_dst;
  std::vector<KvWrite> log;  // every KV write posted so far, for a Reroute
  // With a draft KV region: its plan, and per our NIC and decode rank the draft region written
  // (as nic_dst); pages in one layer of a decode rank's draft region.
  ShardPlan draft_plan;
  std::vector<std::vector<transfer::RemoteRegion>> draft_nic_dst;
  uint64_t draft_dst_num_pages = 0;
  bool rerouting = false;      // a Reroute was sent; its reply has not come
  uint64_t dst_num_pages = 0;  // pages in one layer of every decode rank's region
  std::vector<int32_t> dst_pages;
  int first_page = 0;  // pages before it are in the decode side's prefix cache: not written
  transfer::RemoteRegion meta;
  uint64_t meta_offset = 0;
  int meta_slot = -1;
  double start_time = 0.0;
  double deadline = 0.0;

  std::vector<int32_t> src_pages;   // the engine's page table (from the step observer)
  int pages_scheduled = 0;          // pages handed to LayerWork so far
  bool kv_posted = false;           // every layer of every page posted
  bool draft_posted = false;        // the draft KV region's writes posted (or none to post)
  bool engine_done = false;         // the engine's final output arrived
  std::vector<int32_t> kept_pages;  // referenced for us until we release them
  std::vector<float> last_hidden;
  bool meta_posted = false;
  int outstanding = 0;                                   // submitted writes not yet completed
  std::unordered_map<uint64_t, InflightWrite> inflight;  // by InflightKey
  uint32_t num_writes = 0;
  uint64_t bytes = 0;
  uint64_t kv_bytes = 0;  // of `bytes`, the KV pages' (metadata and checksums excluded)
  Status error;
  std::vector<uint32_t> layer_crcs;  // --kv-checksum: each layer's CRC over the pages posted so far
  bool checksums_posted = false;
  double failed_at = 0.0;  // NowSeconds() when `error` was set
};

// A failed transfer set aside (SetAside) with writes still held by the fabric: its PrefillDone
// goes out once they have all come back.
struct SetAsideTransfer {
  transfer::PeerAddr peer;
  int outstanding = 0;
  uint32_t num_writes = 0;
  Status error;
};

// A decode instance that passed the handshake.
struct DecodePeer {
  transfer::PeerAddr addr;
  uint64_t session = 0;                       // its process's; frames from any other are refused
  std::vector<std::string> nic_addresses;     // its further NICs' (from its Hello)
  std::vector<transfer::PeerAddr> nic_addrs;  // per our NIC: its NIC we write to; [0] == addr
  std::vector<double> nic_down_until;         // per our NIC: out of rotation until (NowSeconds)
  uint16_t dp_size = 1;  // its data-parallel ranks (its Hello's): a request's dp_rank is below
};

// Ranges [begin, end) of ids received so far; refuses one that overlaps another.
class RangeSet {
 public:
  bool Insert(uint32_t begin, uint32_t end);
  uint64_t covered() const { return covered_; }

 private:
  std::map<uint32_t, uint32_t> ranges_;  // begin -> end
  uint64_t covered_ = 0;
};

// A PrefillRequest whose ids are still arriving in PromptChunks (either may come first).
struct PartialPrompt {
  std::string peer_address;  // its sender
  bool have_header = false;
  PrefillRequest request;          // token_ids / dst_pages sized to the totals once known
  std::vector<PromptChunk> early;  // chunks that came before the PrefillRequest
  RangeSet tokens, pages;          // what has landed in request.token_ids / dst_pages
  uint64_t bytes = 0;              // counted in Impl::partial_bytes_
  double deadline = 0.0;           // the whole prompt must have arrived by then
};

}  // namespace prefill_internal

using prefill_internal::DecodePeer;
using prefill_internal::InflightId;
using prefill_internal::InflightKey;
using prefill_internal::InflightNic;
using prefill_internal::InflightWrite;
using prefill_internal::kNicDownS;
using prefill_internal::KvWrite;
using prefill_internal::LayerWork;
using prefill_internal::PartialPrompt;
using prefill_internal::SetAsideTransfer;
using prefill_internal::Transfer;

class PrefillMessenger::Impl {
 public:
  Impl(PrefillMessenger* owner, const PrefillMessengerOptions& options, engine::ModelRunner& runner)
      : owner_(owner),
        options_(options),
        runner_(runner),
        spec_(runner.region().spec()),
        // DP ranks: a request's latent is on its rank alone, sent as from a TP 1 instance.
        scheme_(MakeShardScheme(runner.config(),
                                engine::DataParallelSize(runner) > 1 ? 1 : runner.num_ranks())),
        dp_size_(static_cast<uint16_t>(engine::DataParallelSize(runner))),
        num_layers_(spec_.num_layers),
        meta_bytes_(static_cast<uint32_t>(runner.config().hidden_size) * 4),
        codec_(std::make_shared<FrameCodec>(options.cluster_secret)),
        queue_(std::make_shared<TaskQueue>()) {}

  Status Init();
  void Start(engine::AsyncEngine* engine);
  void Stop();
  void BeginDrain() { draining_ = true; }
  engine::StepObserver Observer();
  const std::string& address() const { return address_; }
  size_t num_nics() const { return 1 + extra_domains_.size(); }

 private:
  void Loop();
  void OnFrame(Frame frame);
  void OnHello(const Hello& hello, const Frame& frame);
  // A decode peer that came back with a new session (it restarted): what it had here is dropped.
  void PeerRestarted(const std::string& address, uint64_t old_session);
  // The accepted peer a frame comes from (by its session), or null after counting the refusal.
  const std::string* Sender(const Frame& frame, const char* what, uint64_t request_id);
  void OnPrefillRequest(PrefillRequest request, const Frame& frame);
  void OnPromptChunk(PromptChunk chunk, const Frame& frame);
  // Puts `chunk` into `p`: InvalidArgument naming what was wrong when it does not fit the
  // request's totals or overlaps ids already received.
  Status AddChunk(PartialPrompt* p, PromptChunk chunk);
  // Admits p's request once every id and page arrived.
  void MaybeBegin(uint64_t request_id);
  // Drops a partial prompt; `why` (not OK) goes to its sender as PrefillDone when it is known.
  void DropPartial(uint64_t request_id, const Status& why);
  void CheckPartials(double now);
  // A rate-limited warning (at most one per key every 10 s): what a peer can provoke at will.
  void Warn(const std::string& key, const std::string& what);
  // Admits a whole request from `peer_address` and submits it to the engine.
  void Begin(const PrefillRequest& request, const std::string& peer_address);
  Status Admit(const PrefillRequest& request, const DecodePeer& peer, Transfer* t);
  // `regions`: r.rank_regions (or the draft's), each of whole pages of `layer_bytes` (all layers).
  Status ParseRankRegions(const PrefillRequest& r, const std::vector<std::string>& regions,
                          uint64_t layer_bytes, std::vector<transfer::MemoryDescriptor>* out);
  void OnCancel(const Cancel& cancel, const Frame& frame);
  // Several NICs (prefill_side_nics.cc).
  Status OpenNics();
  transfer::Domain& Nic(size_t nic) { return nic == 0 ? *domain_ : *extra_domains_[nic - 1]; }
  const transfer::MemoryRegion& KvMr(size_t nic, int rank) const {
    return nic == 0 ? kv_mrs_[static_cast<size_t>(rank)]
                    : extra_kv_mrs_[nic - 1][static_cast<size_t>(rank)];
  }
  bool has_draft_kv() const { return options_.draft_kv != nullptr; }
  // The draft region's descriptors of request r (as ParseRankRegions and ParseNicRegions), its
  // plan and page count, into t (after those of the target's region).
  Status AdmitDraft(const PrefillRequest& r, const DecodePeer& peer, Transfer* t);
  // Every layer's writes of the draft KV of t's pages [first_page, end), once the engine's
  // final output came (the drafter caught up on the prompt before it) and the target's writes
  // are all posted: from MaybePostMetadata, before the metadata. A refused post fails t, which
  // may free it.
  void PostDraftKv(Transfer* t);
  // Inserts a new peer's NIC addresses into our NICs' AVs.
  Status AddPeerNics(const Hello& hello, DecodePeer* peer);
  // The request's descriptors on the decode instance's further NICs, into t->nic_dst.
  // `regions`: r.nic_regions (or the draft's); `nic0`: the rank regions on NIC 0 (t->dst, or the
  // draft's); into *out, [our NIC][decode rank].
  Status ParseNicRegions(const PrefillRequest& r, const std::vector<std::string>& regions,
                         const DecodePeer& peer, const std::vector<transfer::RemoteRegion>& nic0,
                         std::vector<std::vector<transfer::RemoteRegion>>* out);
  // The next NIC in rotation towards t's decode instance; -1 when none is.
  int PickNic(const Transfer& t);
  // Posts `w` under t->imm on the next NIC in rotation and tracks it (a failure fails t);
  // `count`: a first post (not a re-post). Returns the write's InflightKey.
  Result<uint64_t> PostKv(Transfer* t, const KvWrite& w, bool count);
  // A write of t carrying `imm` failed on `nic`: true when that is handled by a Reroute (the NIC
  // is taken out of rotation towards t's peer), false when t must fail.
  bool MaybeReroute(Transfer* t, size_t nic, uint32_t imm, const Status& status);
  void OnRerouteReply(const RerouteReply& reply, const Frame& frame);
  // A KV write on NIC k >= 1 out for longer than nic_stall_s (a link that went down holds its
  // writes without failing them) is handled as a failed one: MaybeReroute.
  void CheckStalledNics(double now);
  // Writes of t still to be waited for: those under its current imm and the metadata write. One
  // under an imm a Reroute replaced cannot land any more (the decode instance revoked the keys it
  // targets before answering) and does not hold the transfer.
  int LiveWrites(const Transfer& t) const;
  void OnStep(const engine::StepInfo& info);
  void OnEngineDone(const engine::RequestOutput& out);
  void OnWriteDone(uint64_t request_id, uint64_t key, const Status& status);
  void TracePosted(Result<uint64_t> key, uint64_t request_id, int layer, int64_t begin_ns,
                   TraceArgs args);
  void PostReady(const std::vector<uint64_t>& progress);  // [DP rank] its progress value
  const engine::LayerProgress& RankProgress(int dp_rank) const {
    return engine::DpRankProgress(runner_, dp_rank);
  }
  // Rank `dp_rank`'s local ids of `pages` (DpPageIds) into *local; InvalidArgument when one lies
  // on another rank. Without DP ranks: the ids as they are.
  Status LocalPages(const std::vector<int32_t>& pages, int dp_rank,
                    std::vector<int32_t>* local) const;
  void PostLayer(Transfer* t, const LayerWork& w, int layer);
  void MaybePostMetadata(Transfer* t);
  // --kv-checksum (prefill_side_checksum.cc).
  Status InitChecksums();
  void ChecksumLayer(Transfer* t, const LayerWork& w, int layer);
  void PostChecksums(Transfer* t);
  Result<uint64_t> SubmitChecksums(Transfer* t);
  // `key`: the write's InflightKey; `count`: a first post (a re-post adds no writes or bytes).
  void Track(Transfer* t, Result<uint64_t> key, uint32_t imm, uint64_t bytes, uint32_t writes,
             bool count = true);
  void Fail(Transfer* t, const Status& status);
  void TryFinish(Transfer* t);
  // Frees a failed transfer's pages and slot although some of its writes are still out
  // (drain_timeout_s); its PrefillDone waits in set_aside_ for them.
  void SetAside(Transfer* t);
  void CheckDeadlines();
  void Heard(const std::string& fabric_address);
  bool Silent(const Transfer& t, double now) const;
  void SendDone(const transfer::PeerAddr& peer, uint64_t request_id, const Status& status,
                uint32_t num_writes);
  Transfer* Find(uint64_t request_id);
  // `nic`: the domain the write goes on (its id, known once Submit returns, is put in `id`).
  transfer::Completion WriteDone(uint64_t request_id, size_t nic,
                                 std::shared_ptr<transfer::TransferId> id);

  PrefillMessenger* const owner_;
  const PrefillMessengerOptions options_;
  engine::ModelRunner& runner_;
  const engine::KvCacheSpec spec_;  // rank 0's
  const ShardScheme scheme_;
  // Ours, in every HelloReply. Above 1 (engine/dp_engine.h): the step observer's page ids are
  // DpPageIds, each request's pages lie on one rank, whose region its writes read and whose
  // progress says when a layer is final.
  const uint16_t dp_size_;
  const int num_layers_;
  const uint32_t meta_bytes_;
  std::shared_ptr<FrameCodec> codec_;  // shared with the fabric worker's inbox
  std::shared_ptr<TaskQueue> queue_;   // shared with callbacks that may outlive us
  // --kv-checksum: (max_transfers, ChecksumBytes(num_layers)) checksum write sources, by meta
  // slot. Declared before domain_ so that it outlives the domain (and any write from it).
  transfer::HostBuffer crc_staging_;
  // Registered memory is declared before the domain so it is freed after it (Stop closes the
  // domain first anyway); the KV regions belong to the runner, which outlives Stop.
  transfer::HostBuffer meta_staging_;         // (max_transfers, meta_bytes): metadata write sources
  std::unique_ptr<transfer::Domain> domain_;  // NIC 0: control messages, metadata, checksums
  std::vector<std::unique_ptr<transfer::Domain>> extra_domains_;  // NICs 1.. (--fabric-nics)
  std::string address_;                         // the domain's, kept once it is closed
  std::vector<transfer::MemoryRegion> kv_mrs_;  // per rank, in NIC 0's domain
  std::vector<std::vector<transfer::MemoryRegion>> extra_kv_mrs_;  // [NIC - 1][rank]
  std::vector<std::vector<transfer::MemoryRegion>> draft_mrs_;     // [NIC][rank]: draft regions
  size_t next_nic_ = 0;                                            // round-robin over NICs
  transfer::MemoryRegion meta_mr_;
  transfer::MemoryRegion crc_mr_;  // crc_staging_'s registration
  std::vector<RankKv> src_kv_;     // per rank, for the checksums
  engine::AsyncEngine* engine_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> draining_{false};  // new PrefillRequests are refused (kDrainingMessage)

  // Messenger thread only.
  ReplayGuard replay_;        // by sender session
  ReplayGuard hello_replay_;  // Hellos, by sender address (their seqs grow across restarts)
  std::unordered_map<std::string, DecodePeer> peers_;     // accepted, by fabric address
  std::unordered_map<uint64_t, std::string> by_session_;  // accepted peers' sessions
  std::unordered_set<uint64_t> retired_sessions_;         // of peers that restarted
  std::unordered_map<uint64_t, PartialPrompt> partials_;  // by request id
  uint64_t partial_bytes_ = 0;
  static constexpr size_t kMaxRetiredSessions = 1024;
  RateLimitedLog warnings_{10.0};
  std::unordered_map<std::string, double> last_heard_;  // NowSeconds(), by address
  std::unordered_map<uint64_t, std::unique_ptr<Transfer>> transfers_;
  std::unordered_map<uint64_t, SetAsideTransfer> set_aside_;  // by request id
  std::unordered_map<int64_t, uint64_t> by_engine_id_;
  std::vector<int> free_meta_slots_;
  std::vector<LayerWork> work_;
  struct TracedWrite {
    uint64_t request_id;
    int layer;  // -1: metadata
    int64_t posted_ns;
  };
  std::unordered_map<uint64_t, TracedWrite> traced_;  // by InflightKey, only when tracing
};

}  // namespace pd::messenger
