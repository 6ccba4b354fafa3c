// Private to the prefill messenger: PrefillMessenger::Impl's definition and the per-transfer state
// it keeps, shared by prefill_side.cc (lifecycle, control messages and the handshake, the public
// class) and prefill_side_transfer.cc (engine events, layer posting, transfer tracking). Not for
// other users.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "messenger/channel.h"
#include "messenger/handshake.h"
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
};

struct Transfer {
  uint64_t request_id = 0;  // the decode side's id (unique per decode instance, random prefix)
  transfer::PeerAddr peer;
  uint32_t imm = 0;       // every KV page write's
  uint32_t meta_imm = 0;  // the metadata write's (counted apart on the decode side)
  int64_t engine_id = -1;
  int num_tokens = 0;
  ShardPlan plan;                           // seeded with request_id
  std::vector<transfer::RemoteRegion> dst;  // per decode rank
  uint64_t dst_num_pages = 0;               // pages in one layer of every decode rank's region
  std::vector<int32_t> dst_pages;
  transfer::RemoteRegion meta;
  uint64_t meta_offset = 0;
  int meta_slot = -1;
  double start_time = 0.0;
  double deadline = 0.0;

  std::vector<int32_t> src_pages;   // the engine's page table (from the step observer)
  int pages_scheduled = 0;          // pages handed to LayerWork so far
  bool kv_posted = false;           // every layer of every page posted
  bool engine_done = false;         // the engine's final output arrived
  std::vector<int32_t> kept_pages;  // referenced for us until we release them
  std::vector<float> last_hidden;
  bool meta_posted = false;
  int outstanding = 0;  // submitted writes not yet completed
  std::unordered_set<transfer::TransferId> inflight;
  uint32_t num_writes = 0;
  uint64_t bytes = 0;
  Status error;
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

}  // namespace prefill_internal

using prefill_internal::LayerWork;
using prefill_internal::SetAsideTransfer;
using prefill_internal::Transfer;

class PrefillMessenger::Impl {
 public:
  Impl(PrefillMessenger* owner, const PrefillMessengerOptions& options, engine::ModelRunner& runner)
      : owner_(owner),
        options_(options),
        runner_(runner),
        spec_(runner.region().spec()),
        scheme_(MakeShardScheme(runner.config(), runner.num_ranks())),
        num_layers_(spec_.num_layers),
        meta_bytes_(static_cast<uint32_t>(runner.config().hidden_size) * 4),
        codec_(options.cluster_secret),
        queue_(std::make_shared<TaskQueue>()) {}

  Status Init();
  void Start(engine::AsyncEngine* engine);
  void Stop();
  engine::StepObserver Observer();
  const std::string& address() const { return address_; }

 private:
  void Loop();
  void OnMessage(const std::string& bytes);
  void OnHello(const Hello& hello, uint64_t seq);
  void OnPrefillRequest(const PrefillRequest& request, uint64_t seq);
  Status Admit(const PrefillRequest& request, Transfer* t);
  Status ParseRankRegions(const PrefillRequest& r, uint64_t layer_bytes,
                          std::vector<transfer::MemoryDescriptor>* out);
  void OnCancel(const Cancel& cancel, uint64_t seq);
  void OnStep(const engine::StepInfo& info);
  void OnEngineDone(const engine::RequestOutput& out);
  void OnWriteDone(uint64_t request_id, transfer::TransferId id, const Status& status);
  void TracePosted(Result<transfer::TransferId> id, uint64_t request_id, int layer,
                   int64_t begin_ns, TraceArgs args);
  void PostReady(uint64_t progress);
  void PostLayer(Transfer* t, const LayerWork& w, int layer);
  void MaybePostMetadata(Transfer* t);
  void Track(Transfer* t, Result<transfer::TransferId> id, uint64_t bytes, uint32_t writes);
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
  transfer::Completion WriteDone(uint64_t request_id, std::shared_ptr<transfer::TransferId> id);

  PrefillMessenger* const owner_;
  const PrefillMessengerOptions options_;
  engine::ModelRunner& runner_;
  const engine::KvCacheSpec spec_;  // rank 0's
  const ShardScheme scheme_;
  const int num_layers_;
  const uint32_t meta_bytes_;
  FrameCodec codec_;
  std::shared_ptr<TaskQueue> queue_;  // shared with callbacks that may outlive us
  // Registered memory is declared before the domain so it is freed after it (Stop closes the
  // domain first anyway); the KV regions belong to the runner, which outlives Stop.
  transfer::HostBuffer meta_staging_;  // (max_transfers, meta_bytes): metadata write sources
  std::unique_ptr<transfer::Domain> domain_;
  std::string address_;                         // the domain's, kept once it is closed
  std::vector<transfer::MemoryRegion> kv_mrs_;  // per rank, all in the one domain
  transfer::MemoryRegion meta_mr_;
  engine::AsyncEngine* engine_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  // Messenger thread only.
  ReplayGuard replay_;
  std::unordered_map<std::string, transfer::PeerAddr> peers_;  // accepted, by fabric address
  std::unordered_map<std::string, double> last_heard_;         // NowSeconds(), by address
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
  std::unordered_map<transfer::TransferId, TracedWrite> traced_;  // only when tracing
};

}  // namespace pd::messenger
