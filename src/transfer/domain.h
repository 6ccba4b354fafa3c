// One fabric domain: a libfabric domain on one NIC with one reliable-datagram endpoint (FI_EP_RDM),
// its completion queue and address vector, registered memory, and a worker thread that owns them.
//
// Callers submit work (writes, paged writes, control messages, registrations) from any thread; the
// worker posts it to the endpoint, drives progress by reading the completion queue, and reports
// each transfer exactly once through its Completion. -FI_EAGAIN from a post means "read the CQ,
// then retry". A transfer that makes no progress (no operation posted or completed) for
// `op_timeout_s` fails with DeadlineExceeded, so a dead or silent peer never hangs a caller; a
// completion error fails it with a Status naming the libfabric call and the provider's error text.
// A transfer that fails or is cancelled posts nothing more, but its Completion runs only once
// every operation it posted has come back from the provider (completed, failed, or flushed by
// fi_cancel where the provider supports cancelling it) or the endpoint was closed: until then a
// write may still land, so its caller must not reuse or announce the memory it targets. An
// operation held by a stalled peer therefore holds its transfer's completion until the peer
// moves, dies (its connection breaks) or the domain closes. Neither closing our endpoint nor
// removing the peer from the address vector (whose effect on operations in progress libfabric
// leaves undefined) recalls bytes a kernel or NIC already sent: only the target can refuse late
// writes for sure, by closing the region's registration (the decode messenger revokes keys).
//
// Ordering (checked at Create, see GetInfoWith in domain_worker.cc): every write is posted
// with FI_DELIVERY_COMPLETE, so its completion means the data is placed in the target's memory;
// the protocol never relies on write-after-write (FI_ORDER_WAW), send-after-write (FI_ORDER_SAW)
// or completion order: the target counts immediates, and "done" messages are sent only after
// the writes they announce completed. Control messages ask for send-after-send (FI_ORDER_SAS).
// A provider that cannot grant these is refused with an error naming what is missing.
//
// Regions are registered with the least access their use needs (RegionAccess): targets accept
// remote writes only, sources allow local writes only; no region accepts remote reads. Where the
// provider lets the application choose keys (no FI_MR_PROV_KEY) they are random 64-bit values
// from getrandom, so a key cannot be guessed from another.
//
// The domain honours what the provider asks for: mr_mode bits (FI_MR_LOCAL descriptors,
// FI_MR_VIRT_ADDR vs offset addressing, FI_MR_PROV_KEY keys, FI_MR_ENDPOINT binding), mode bits
// (FI_CONTEXT/FI_CONTEXT2 per-operation contexts, FI_RX_CQ_DATA receive buffers consumed by remote
// CQ data), cq_data_size (immediates need 4 bytes) and max_msg_size. Every operation uses one
// registered iov, so inject_size and rma_iov_limit are reported in DomainInfo but never limit it.
//
// Thread safety: all public methods are thread-safe. Completions, message handlers and imm
// callbacks run on the worker thread and must not block or call blocking Domain methods
// (RegisterMemory, Deregister, AddRemote, AddPeer); Submit*/Cancel are fine. Completions of the
// transfers still open when the domain is destroyed run on the destroying thread, once the
// endpoint is closed.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "transfer/imm_counter.h"
#include "transfer/memory_descriptor.h"

namespace pd::transfer {

class FaultInjector;  // fault_injection.h

using TransferId = uint64_t;
// Runs on the worker thread once per transfer.
using Completion = std::function<void(const Status&)>;
// A control message landed (bytes valid only during the call). Runs on the worker thread.
using MessageHandler = std::function<void(std::string_view message)>;

constexpr uint64_t kOfferedMrModes =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

struct DomainOptions {
  std::string provider = "tcp;ofi_rxm";  // also "verbs;ofi_rxm", "efa", "shm"
  std::string domain_name;               // NIC or interface ("lo", "mlx5_0"); empty: first offered
  std::string node;                      // local address to bind ("127.0.0.1"); empty: any
  uint64_t offered_mr_mode = kOfferedMrModes;  // the mr_mode bits we let the provider ask for
  uint32_t max_inflight = 128;                 // operations posted and not yet completed
  uint32_t num_recv_buffers = 64;              // posted receives for control messages
  uint32_t num_send_buffers = 32;
  uint32_t message_bytes = 4096;  // largest control message
  // Writes complete when the target has placed the data (FI_DELIVERY_COMPLETE) rather than when
  // the source buffer may be reused: a key the target rejects then fails the write on the
  // initiator, also on providers (tcp) that would otherwise report success.
  bool delivery_complete = true;
  double op_timeout_s = 10.0;  // a transfer without progress this long: DeadlineExceeded
  // Shared by the domains of a group so writes spread over NICs count together; null: own table.
  std::shared_ptr<ImmCounterTable> imm_counters;
  MessageHandler on_message;
  // Tests only (fault_injection.h): drops, duplicates, corrupts, delays or reorders chosen writes
  // and immediates. Null (the default): no faults, at the cost of a pointer check.
  std::shared_ptr<FaultInjector> faults;
};

// What the provider answered, after fi_getinfo.
struct DomainInfo {
  std::string provider;
  std::string fabric;
  std::string domain;
  uint64_t mode = 0;
  uint64_t mr_mode = 0;
  uint64_t cq_data_size = 0;
  uint64_t inject_size = 0;
  uint64_t max_msg_size = 0;
  uint64_t rma_iov_limit = 0;
  std::string address;  // our endpoint name (fi_getname bytes), what peers insert in their AV
};

// How a registered region is used, which sets its access flags.
enum class RegionAccess {
  kRemoteWrite,      // peers write into it (KV cache, metadata slots): FI_REMOTE_WRITE only
  kLocalSource,      // the source of our own writes: FI_WRITE only
  kSourceAndTarget,  // both (tests, benches): FI_WRITE | FI_REMOTE_WRITE
};

// A registered local region. A plain handle: the domain owns the fid_mr and closes it on
// Deregister or when the domain closes.
struct MemoryRegion {
  uint64_t id = 0;
  char* data = nullptr;
  uint64_t size = 0;
  MemoryDescriptor descriptor;  // give this (as bytes) to peers that write here
};

// A peer's endpoint inserted in our address vector.
struct PeerAddr {
  std::string fabric_addr;
  fi_addr_t fi_addr = FI_ADDR_UNSPEC;
};

// A peer's region we may write into: its validated descriptor plus its address in our AV.
struct RemoteRegion {
  MemoryDescriptor descriptor;
  fi_addr_t fi_addr = FI_ADDR_UNSPEC;
};

// Page k moves bytes_per_page bytes from
//   src.data + src_offset + src_pages[k] * src_stride
// to remote address
//   dst.addr + dst_offset + dst_pages[k] * dst_stride
// as one write carrying `imm` when set. A head-shard slice of an HND page (heads [h0, h1) of
// (H, T, D) elements of e bytes) is offset = h0*T*D*e, bytes_per_page = (h1-h0)*T*D*e, stride =
// the page's full size on that side.
struct PagedWriteRequest {
  MemoryRegion src;
  RemoteRegion dst;
  std::vector<uint32_t> src_pages;
  std::vector<uint32_t> dst_pages;
  uint64_t bytes_per_page = 0;
  uint64_t src_stride = 0;
  uint64_t src_offset = 0;
  uint64_t dst_stride = 0;
  uint64_t dst_offset = 0;
  std::optional<uint32_t> imm;
};

struct WriteRequest {
  MemoryRegion src;
  uint64_t src_offset = 0;
  uint64_t length = 0;
  RemoteRegion dst;
  uint64_t dst_offset = 0;
  std::optional<uint32_t> imm;
};

// Checks a paged write against both regions before anything is posted: same number of source and
// destination pages, bytes_per_page > 0, every page inside its region (overflow-safe), and pages
// no larger than `max_msg_size`.
Status ValidatePagedWrite(const PagedWriteRequest& request, uint64_t max_msg_size);

class DomainWorker;

// Regions whose memory was found freed or unmapped when their domain closed, in this process: a
// teardown that freed registered memory while the fabric could still write into it. Checked
// with mincore (unmapped mappings) and, under AddressSanitizer, the heap's poisoning.
uint64_t NumRegionsFreedWhileRegistered();

class Domain {
 public:
  static Result<std::unique_ptr<Domain>> Create(const DomainOptions& options);
  ~Domain();  // fails outstanding transfers with Cancelled, stops the worker, closes every fid
  Domain(const Domain&) = delete;
  Domain& operator=(const Domain&) = delete;

  const DomainInfo& info() const { return info_; }
  ImmCounterTable& imm_counters() { return *imm_counters_; }
  // For further domains that count together with this one (DomainOptions::imm_counters).
  std::shared_ptr<ImmCounterTable> shared_imm_counters() const { return imm_counters_; }

  // Registers [data, data + size) for `access`. The memory must stay allocated until the region
  // is deregistered or the domain is destroyed (checked at close: see
  // NumRegionsFreedWhileRegistered).
  Result<MemoryRegion> RegisterMemory(void* data, uint64_t size,
                                      RegionAccess access = RegionAccess::kSourceAndTarget);
  // FailedPrecondition while operations (also those of failed transfers) still use the region.
  Status Deregister(const MemoryRegion& region);

  // Validates a peer's descriptor and inserts its address (cached per address).
  Result<RemoteRegion> AddRemote(const MemoryDescriptor& descriptor);
  Result<PeerAddr> AddPeer(std::string_view fabric_addr);

  // Every Submit validates first (an invalid request returns an error and posts nothing), then
  // returns the id that Cancel takes. `done` runs exactly once.
  Result<TransferId> SubmitWrite(const WriteRequest& request, Completion done);
  Result<TransferId> SubmitPagedWrite(PagedWriteRequest request, Completion done);
  Result<TransferId> SubmitSend(const PeerAddr& peer, std::string message, Completion done);
  // Fails the transfer with Cancelled if it has not completed yet: pages not yet posted are never
  // posted, and its Completion runs once the operations already posted have come back (see the
  // header comment). Unknown or finished ids are ignored.
  void Cancel(TransferId id);

  // Number of transfers submitted and not yet completed.
  size_t num_pending() const;
  // Operations posted to the provider and not yet come back (also those of failed transfers).
  size_t num_inflight_ops() const;

 private:
  Domain() = default;

  DomainInfo info_;
  DomainOptions options_;
  std::shared_ptr<ImmCounterTable> imm_counters_;
  std::unique_ptr<DomainWorker> worker_;
};

}  // namespace pd::transfer
