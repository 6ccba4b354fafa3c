// Internal to the transfer engine: the thread that owns one domain's libfabric objects. Domain is
// its public face; nothing outside src/transfer includes this header.
//
// Thread safety: Post/Call/num_pending may be called from any thread; every other member runs on
// the worker thread only (the Do* methods are invoked through Post/Call).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_rma.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "transfer/domain.h"
#include "transfer/fabric_util.h"
#include "transfer/fault_injection.h"

namespace pd::transfer {

struct Transfer {
  enum class Kind { kWrite, kSend };
  TransferId id = 0;
  Kind kind = Kind::kWrite;
  PagedWriteRequest write;   // kWrite
  PeerAddr peer;             // kSend
  std::string message;       // kSend
  size_t total = 0;          // operations to post
  size_t next = 0;           // next operation to post
  size_t inflight = 0;       // posted, not completed
  double last_progress = 0;  // submit, or the last post or completion of one of its operations
  bool refused = false;      // a post was refused (-FI_EAGAIN, or its destination's send cap)
  // Failed or cancelled with operations still in flight: nothing more is posted, and `done` runs
  // with `failure` once the last of them has come back.
  bool finishing = false;
  bool warned_stuck = false;  // logged once that its operations are slow to come back
  Status failure;
  Completion done;
  // Fault injection only: the operation index whose fault was decided, and the decision (kept
  // while a refused post is retried).
  size_t fault_op = SIZE_MAX;
  std::optional<FaultRule> fault;

  fi_addr_t dest() const { return kind == Kind::kWrite ? write.dst.fi_addr : peer.fi_addr; }
};

// Per-operation context. fi_ctx comes first: libfabric hands back &fi_ctx as op_context, and
// providers with FI_CONTEXT / FI_CONTEXT2 mode use it as scratch space while the op is in flight.
struct OpContext {
  enum class Kind { kWrite, kSend, kRecv };
  fi_context2 fi_ctx;
  Kind kind = Kind::kWrite;
  Transfer* transfer = nullptr;     // the transfer it belongs to
  uint64_t region_id = 0;           // source region of a write
  uint32_t buffer = 0;              // send or receive buffer index
  fi_addr_t dest = FI_ADDR_UNSPEC;  // where a write or send goes
};

struct RegionState {
  FidPtr<fid_mr> mr;
  void* desc = nullptr;  // fi_mr_desc, passed with local buffers (FI_MR_LOCAL)
  char* data = nullptr;
  uint64_t size = 0;
  uint64_t access = 0;  // fi_mr_reg access flags
  uint64_t users = 0;   // operations in flight using it
};

class DomainWorker {
 public:
  static Result<std::unique_ptr<DomainWorker>> Open(const DomainOptions& options,
                                                    std::shared_ptr<ImmCounterTable> imm,
                                                    DomainInfo* info);
  ~DomainWorker();

  void Post(std::function<void()> command) EXCLUDES(mu_);
  template <typename T>
  T Call(std::function<T()> fn) EXCLUDES(mu_) {
    auto promise = std::make_shared<std::promise<T>>();
    std::future<T> future = promise->get_future();
    Post([promise, fn = std::move(fn)] { promise->set_value(fn()); });
    return future.get();
  }
  size_t num_pending() const { return num_pending_.load(std::memory_order_acquire); }
  void AddPending() { num_pending_.fetch_add(1, std::memory_order_acq_rel); }
  size_t num_inflight_ops() const { return num_inflight_ops_.load(std::memory_order_acquire); }

  // Worker thread only.
  Result<MemoryRegion> DoRegister(void* data, uint64_t size, RegionAccess access);
  Status DoDeregister(uint64_t id);
  Result<fi_addr_t> DoInsertAddress(const std::string& fabric_addr);
  void DoSubmit(std::unique_ptr<Transfer> transfer);
  void DoCancel(TransferId id);

 private:
  explicit DomainWorker(const DomainOptions& options)
      : options_(options), faults_(options.faults) {}
  Status OpenFabric(DomainInfo* info);
  Status OpenBuffers();
  Result<FidPtr<fid_mr>> RegisterRaw(void* data, uint64_t size, uint64_t access);
  // Closes the endpoint (nothing of ours can be written any more), then reports every transfer
  // still open as Cancelled. Destructor only, after the worker thread stopped.
  void CloseEndpointAndFailOpen();
  // Counts (and logs) registered regions whose memory is already freed or unmapped.
  void CheckRegionsStillAllocated();
  Status PostRecv(uint32_t index);

  void Run() EXCLUDES(mu_);
  void RunCommands() EXCLUDES(mu_);
  void PostPending();
  // 0, -FI_EAGAIN, 1 (send buffers exhausted), 2 (the destination holds its share of send
  // buffers) or another -errno.
  ssize_t PostNext(Transfer* t);
  ssize_t PostWrite(Transfer* t);
  // One write operation as fi_writemsg takes it.
  struct WriteOp {
    iovec iov{};
    void* desc = nullptr;
    fi_rma_iov rma{};
    fi_addr_t addr = FI_ADDR_UNSPEC;
    uint64_t data = 0;
    uint64_t flags = 0;
  };
  // Posts `op` as t's next operation (the context out in *posted). 0, or the fi_writemsg error
  // with nothing changed.
  ssize_t IssueWrite(Transfer* t, const WriteOp& op, OpContext** posted = nullptr);
  ssize_t WriteMsg(OpContext* ctx, const WriteOp& op);
  ssize_t PostSend(Transfer* t);
  int PollCq();
  void HandleCompletion(const fi_cq_data_entry& entry);
  void HandleCqError();
  void OnOpDone(OpContext* ctx, const Status& status);
  // Ends `t` with `status`: at once when nothing of it is in flight, else once its in-flight
  // operations have come back (it is then `finishing`).
  void Finish(Transfer* t, const Status& status);
  void Report(Transfer* t, const Status& status);
  void CheckDeadlines();
  void Block(int timeout_ms);
  int naps_since_activity_ = 0;  // worker thread; Block's naps when the CQ has no wait object
  OpContext* NewContext(OpContext::Kind kind, Transfer* t);
  void FreeContext(OpContext* ctx);

  // Fault injection (domain_faults.cc); every call is behind `faults_ != nullptr`.
  ssize_t PostWriteFaulted(Transfer* t, const WriteOp& op);
  ssize_t PostCorruptCopy(Transfer* t, const WriteOp& op);
  void HoldWrite(Transfer* t, const WriteOp& op, const FaultRule& rule);
  void OnImmediateFaulted(uint32_t value);
  // Posts held writes and delivers held immediates that are due (`next_write` / `next_imm`: one
  // was just posted / counted, which releases the reordered ones).
  void ReleaseHeld(bool next_write, bool next_imm);
  bool HoldsFaults() const {
    return faults_ != nullptr && (!held_writes_.empty() || !held_imms_.empty());
  }
  void DoneFaultScratch(OpContext* ctx) { fault_scratch_.erase(ctx); }

  DomainOptions options_;
  std::shared_ptr<ImmCounterTable> imm_;
  FiInfoPtr fi_;
  uint64_t mr_mode_ = 0;
  // FI_RX_CQ_DATA: remote CQ data consumes a posted receive, whose context the event carries.
  // Without it the event's op_context is not ours (shm leaves it undefined, not null).
  bool rx_cq_data_ = false;
  uint64_t max_msg_size_ = 0;
  std::string address_;

  // Declared in the order they are opened; ~DomainWorker closes them explicitly in the order
  // libfabric requires (endpoint, then completion queue, regions, address vector, domain, fabric).
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
  FidPtr<fid_cq> cq_;
  FidPtr<fid_av> av_;
  FidPtr<fid_ep> ep_;
  int cq_fd_ = -1;  // the CQ's wait fd, -1 without one
  int wake_fd_ = -1;

  std::unordered_map<uint64_t, RegionState> regions_;
  uint64_t next_region_id_ = 1;
  std::unordered_map<std::string, fi_addr_t> addresses_;

  FidPtr<fid_mr> recv_mr_, send_mr_;
  std::vector<char> recv_slab_, send_slab_;  // (num_buffers, message_bytes)
  std::vector<OpContext> recv_ctx_;
  std::vector<uint32_t> free_send_;

  std::unordered_map<TransferId, std::unique_ptr<Transfer>> transfers_;
  std::deque<TransferId> pending_;  // transfers with operations left to post
  std::unordered_set<OpContext*> inflight_;
  std::vector<std::unique_ptr<OpContext>> free_ctx_;
  // In-flight operations counted against max_inflight: those of finishing transfers are not, so a
  // stalled peer holding them does not stall the writes to everyone else.
  size_t live_inflight_ = 0;
  double next_deadline_check_ = 0;
  double last_completion_ = 0;  // any write or send of this domain completed
  // Per destination: the last completion of a write or send to it, and the send buffers its
  // sends hold (at most half of them, so a dead peer cannot take every buffer).
  std::unordered_map<fi_addr_t, double> dest_completion_;
  std::unordered_map<fi_addr_t, uint32_t> dest_sends_;

  // Fault injection state (worker thread).
  std::shared_ptr<FaultInjector> faults_;  // options_.faults
  struct HeldWrite {
    OpContext* ctx;  // counted in flight for its transfer; null transfer: dropped on release
    WriteOp op;
    double release_at;
    bool until_next;  // reorder: released by the next write posted
  };
  struct HeldImm {
    uint32_t value;
    double release_at;
    bool until_next;  // reorder: released by the next immediate counted
  };
  struct FaultScratch {  // a corrupted copy of a write's source bytes, registered for it
    std::vector<char> bytes;
    FidPtr<fid_mr> mr;
  };
  std::vector<HeldWrite> held_writes_;
  std::vector<HeldImm> held_imms_;
  std::unordered_map<OpContext*, std::unique_ptr<FaultScratch>> fault_scratch_;
  std::unordered_set<OpContext*> failed_by_fault_;  // FaultKind::kFail writes in flight

  Mutex mu_;
  std::vector<std::function<void()>> commands_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::atomic<size_t> num_pending_{0};
  std::atomic<size_t> num_inflight_ops_{0};
  std::thread thread_;
};

}  // namespace pd::transfer
