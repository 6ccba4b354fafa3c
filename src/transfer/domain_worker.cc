// DomainWorker: opening and closing the libfabric objects, memory registration, addresses.
// The progress loop (posting, completions, deadlines) is in domain_progress.cc.
#include "transfer/domain_worker.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/log.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PD_HAS_ASAN 1
#endif
#endif
#if !defined(PD_HAS_ASAN) && defined(__SANITIZE_ADDRESS__)
#define PD_HAS_ASAN 1
#endif
#ifndef PD_HAS_ASAN
#define PD_HAS_ASAN 0
#endif
#if PD_HAS_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace pd::transfer {
namespace {

uint64_t AccessFlags(RegionAccess access) {
  switch (access) {
    case RegionAccess::kRemoteWrite:
      return FI_REMOTE_WRITE;
    case RegionAccess::kLocalSource:
      return FI_WRITE;
    case RegionAccess::kSourceAndTarget:
      return FI_WRITE | FI_REMOTE_WRITE;
  }
  return 0;
}

std::atomic<uint64_t> g_regions_freed_while_registered{0};

char* Dup(const std::string& s) { return s.empty() ? nullptr : strdup(s.c_str()); }

// What the protocol needs of the provider (see domain.h, "Ordering"): send-after-send for
// control messages and, with delivery_complete, writes whose completion means placement at the
// target. Write-after-write, send-after-write and completion order are not needed.
constexpr uint64_t kMsgOrder = FI_ORDER_SAS;

Result<FiInfoPtr> GetInfoWith(const DomainOptions& options, uint64_t mr_mode) {
  FiInfoPtr hints(fi_allocinfo());
  if (!hints) return ResourceExhausted("fi_allocinfo failed");
  hints->caps = FI_MSG | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
  // Modes we can honour: every op carries an fi_context2, and remote CQ data landing in a posted
  // receive is understood.
  hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = static_cast<int>(mr_mode);
  hints->domain_attr->threading = FI_THREAD_DOMAIN;  // only the worker touches the domain
  hints->tx_attr->msg_order = kMsgOrder;
  hints->rx_attr->msg_order = kMsgOrder;
  hints->tx_attr->comp_order = FI_ORDER_NONE;
  if (options.delivery_complete) hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  hints->fabric_attr->prov_name = Dup(options.provider);
  hints->domain_attr->name = Dup(options.domain_name);
  fi_info* info = nullptr;
  const char* node = options.node.empty() ? nullptr : options.node.c_str();
  int rc = fi_getinfo(FI_VERSION(1, 17), node, nullptr, node ? FI_SOURCE : 0, hints.get(), &info);
  if (rc != 0) {
    Status s =
        FabricError("fi_getinfo(provider '" + options.provider + "', domain '" +
                        options.domain_name + "', node '" + options.node + "')",
                    rc)
            .WithContext(
                "no matching fabric interface (the transfer engine needs an FI_EP_RDM "
                "endpoint with RMA writes, send-after-send ordering (FI_ORDER_SAS)" +
                std::string(options.delivery_complete ? " and FI_DELIVERY_COMPLETE" : "") + ")");
    // FI_ENODATA: no such provider here, or none that offers what we asked for.
    return rc == -FI_ENODATA ? NotFound(s.message()) : s;
  }
  return FiInfoPtr(info);
}

// Prefers keys we choose (random, see RegisterRaw): FI_MR_PROV_KEY is offered only to providers
// that cannot work without it.
Result<FiInfoPtr> GetInfo(const DomainOptions& options) {
  const uint64_t offered = options.offered_mr_mode;
  if (offered & FI_MR_PROV_KEY) {
    auto own_keys = GetInfoWith(options, offered & ~uint64_t{FI_MR_PROV_KEY});
    if (own_keys.ok()) return own_keys;
  }
  return GetInfoWith(options, offered);
}

// Refuses a provider that granted less than we asked for (some ignore hints they cannot meet).
Status CheckGranted(const fi_info& info) {
  const std::string prov = info.fabric_attr->prov_name ? info.fabric_attr->prov_name : "?";
  if ((info.tx_attr->msg_order & kMsgOrder) != kMsgOrder ||
      (info.rx_attr->msg_order & kMsgOrder) != kMsgOrder) {
    return FailedPrecondition("provider " + prov +
                              " does not order sends after sends (FI_ORDER_SAS), which the "
                              "control messages need");
  }
  if ((info.caps & (FI_RMA | FI_REMOTE_WRITE)) != (FI_RMA | FI_REMOTE_WRITE)) {
    return FailedPrecondition("provider " + prov + " offers no remote writes (FI_RMA)");
  }
  return OkStatus();
}

// What the provider granted (`info`), as DomainInfo's fields (all but the address).
void FillDomainInfo(const fi_info& info, DomainInfo* out) {
  out->provider = info.fabric_attr->prov_name ? info.fabric_attr->prov_name : "";
  out->fabric = info.fabric_attr->name ? info.fabric_attr->name : "";
  out->domain = info.domain_attr->name ? info.domain_attr->name : "";
  out->mode = info.mode;
  out->mr_mode = static_cast<uint64_t>(info.domain_attr->mr_mode);
  out->cq_data_size = info.domain_attr->cq_data_size;
  out->inject_size = info.tx_attr->inject_size;
  out->max_msg_size = info.ep_attr->max_msg_size;
  out->rma_iov_limit = info.tx_attr->rma_iov_limit;
}

}  // namespace

Result<std::unique_ptr<DomainWorker>> DomainWorker::Open(const DomainOptions& options,
                                                         std::shared_ptr<ImmCounterTable> imm,
                                                         DomainInfo* info) {
  if (options.max_inflight == 0 || options.num_recv_buffers == 0 || options.num_send_buffers == 0 ||
      options.message_bytes == 0) {
    return InvalidArgument("DomainOptions: max_inflight and buffer counts/sizes must be positive");
  }
  std::unique_ptr<DomainWorker> w(new DomainWorker(options));
  w->imm_ = std::move(imm);
  RETURN_IF_ERROR(w->OpenFabric(info));
  RETURN_IF_ERROR(w->OpenBuffers());
  w->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (w->wake_fd_ < 0) return Internal(std::string("eventfd: ") + strerror(errno));
  w->thread_ = std::thread([p = w.get()] { p->Run(); });
  return w;
}

Status DomainWorker::OpenFabric(DomainInfo* out) {
  ASSIGN_OR_RETURN(fi_, GetInfo(options_));
  fi_info* info = fi_.get();
  RETURN_IF_ERROR(CheckGranted(*info));
  fid_fabric* fabric = nullptr;
  int rc = fi_fabric(info->fabric_attr, &fabric, nullptr);
  if (rc != 0) return FabricError("fi_fabric", rc);
  fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  rc = fi_domain(fabric_.get(), info, &domain, nullptr);
  if (rc != 0) return FabricError("fi_domain", rc);
  domain_.reset(domain);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.size = std::max<size_t>(1024, 2 * (options_.max_inflight + options_.num_recv_buffers));
  cq_attr.wait_obj = FI_WAIT_FD;
  fid_cq* cq = nullptr;
  rc = fi_cq_open(domain_.get(), &cq_attr, &cq, nullptr);
  if (rc != 0) {  // no wait fd: the worker polls and naps instead of blocking on the CQ
    cq_attr.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(domain_.get(), &cq_attr, &cq, nullptr);
    if (rc != 0) return FabricError("fi_cq_open", rc);
  }
  cq_.reset(cq);
  if (cq_attr.wait_obj == FI_WAIT_FD && fi_control(&cq_->fid, FI_GETWAIT, &cq_fd_) != 0) {
    cq_fd_ = -1;
  }

  fi_av_attr av_attr{};
  av_attr.type =
      info->domain_attr->av_type == FI_AV_UNSPEC ? FI_AV_MAP : info->domain_attr->av_type;
  fid_av* av = nullptr;
  rc = fi_av_open(domain_.get(), &av_attr, &av, nullptr);
  if (rc != 0) return FabricError("fi_av_open", rc);
  av_.reset(av);

  fid_ep* ep = nullptr;
  rc = fi_endpoint(domain_.get(), info, &ep, nullptr);
  if (rc != 0) return FabricError("fi_endpoint", rc);
  ep_.reset(ep);
  if ((rc = fi_ep_bind(ep_.get(), &cq_->fid, FI_TRANSMIT | FI_RECV)) != 0) {
    return FabricError("fi_ep_bind(cq)", rc);
  }
  if ((rc = fi_ep_bind(ep_.get(), &av_->fid, 0)) != 0) return FabricError("fi_ep_bind(av)", rc);
  if ((rc = fi_enable(ep_.get())) != 0) return FabricError("fi_enable", rc);

  char name[256];
  size_t name_len = sizeof(name);
  if ((rc = fi_getname(&ep_->fid, name, &name_len)) != 0) return FabricError("fi_getname", rc);
  address_.assign(name, name_len);

  mr_mode_ = static_cast<uint64_t>(info->domain_attr->mr_mode);
  rx_cq_data_ = (info->mode & FI_RX_CQ_DATA) != 0;
  max_msg_size_ = info->ep_attr->max_msg_size;
  FillDomainInfo(*info, out);
  out->address = address_;
  PD_LOG_DEBUG("fabric domain {} ({}): mode {} mr_mode {} cq_data_size {} wait_fd {}", out->domain,
               out->provider, ModeToString(out->mode), MrModeToString(out->mr_mode),
               out->cq_data_size, cq_fd_ >= 0);
  return OkStatus();
}

// With FI_MR_PROV_KEY the provider picks the key; otherwise it is a random 64-bit value, drawn
// again should the provider refuse it (taken already).
Result<FidPtr<fid_mr>> DomainWorker::RegisterRaw(void* data, uint64_t size, uint64_t access) {
  fid_mr* mr = nullptr;
  int rc = 0;
  for (int attempt = 0; attempt < 4; ++attempt) {
    uint64_t requested_key = 0;
    if ((mr_mode_ & FI_MR_PROV_KEY) == 0 &&
        getrandom(&requested_key, sizeof(requested_key), 0) != sizeof(requested_key)) {
      return Internal(std::string("getrandom (memory registration key): ") + strerror(errno));
    }
    rc = fi_mr_reg(domain_.get(), data, size, access, 0, requested_key, 0, &mr, nullptr);
    if (rc != -FI_ENOKEY && rc != -FI_EKEYREJECTED) break;
    if (mr_mode_ & FI_MR_PROV_KEY) break;
  }
  if (rc != 0) return FabricError("fi_mr_reg(" + std::to_string(size) + " bytes)", rc);
  FidPtr<fid_mr> owned(mr);
  if (mr_mode_ & FI_MR_ENDPOINT) {
    if ((rc = fi_mr_bind(mr, &ep_->fid, 0)) != 0) return FabricError("fi_mr_bind", rc);
    if ((rc = fi_mr_enable(mr)) != 0) return FabricError("fi_mr_enable", rc);
  }
  return owned;
}

Status DomainWorker::OpenBuffers() {
  const size_t bytes = options_.message_bytes;
  recv_slab_.assign(bytes * options_.num_recv_buffers, 0);
  send_slab_.assign(bytes * options_.num_send_buffers, 0);
  ASSIGN_OR_RETURN(recv_mr_, RegisterRaw(recv_slab_.data(), recv_slab_.size(), FI_RECV));
  ASSIGN_OR_RETURN(send_mr_, RegisterRaw(send_slab_.data(), send_slab_.size(), FI_SEND));
  recv_ctx_.resize(options_.num_recv_buffers);
  for (uint32_t i = 0; i < options_.num_recv_buffers; ++i) {
    recv_ctx_[i].kind = OpContext::Kind::kRecv;
    recv_ctx_[i].buffer = i;
    RETURN_IF_ERROR(PostRecv(i));
  }
  for (uint32_t i = 0; i < options_.num_send_buffers; ++i) free_send_.push_back(i);
  return OkStatus();
}

Status DomainWorker::PostRecv(uint32_t index) {
  char* buf = recv_slab_.data() + size_t{index} * options_.message_bytes;
  void* desc = fi_mr_desc(recv_mr_.get());
  while (true) {
    ssize_t rc = fi_recv(ep_.get(), buf, options_.message_bytes, desc, FI_ADDR_UNSPEC,
                         &recv_ctx_[index].fi_ctx);
    if (rc == 0) return OkStatus();
    if (rc != -FI_EAGAIN) return FabricError("fi_recv", rc);
    fi_cq_data_entry entries[8];  // drive progress, then retry
    ssize_t n = fi_cq_read(cq_.get(), entries, 8);
    for (ssize_t i = 0; i < n; ++i) HandleCompletion(entries[i]);
  }
}

Result<MemoryRegion> DomainWorker::DoRegister(void* data, uint64_t size, RegionAccess access) {
  if (data == nullptr || size == 0) return InvalidArgument("RegisterMemory: empty region");
  const uint64_t flags = AccessFlags(access);
  ASSIGN_OR_RETURN(FidPtr<fid_mr> mr, RegisterRaw(data, size, flags));
  MemoryRegion region;
  region.id = next_region_id_++;
  region.data = static_cast<char*>(data);
  region.size = size;
  region.descriptor.addr = (mr_mode_ & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(data) : 0;
  region.descriptor.length = size;
  region.descriptor.rkey = fi_mr_key(mr.get());
  region.descriptor.has_key = true;
  region.descriptor.fabric_addr = address_;
  RegionState state;
  state.desc = fi_mr_desc(mr.get());
  state.mr = std::move(mr);
  state.data = region.data;
  state.size = size;
  state.access = flags;
  regions_.emplace(region.id, std::move(state));
  return region;
}

Status DomainWorker::DoDeregister(uint64_t id) {
  auto it = regions_.find(id);
  if (it == regions_.end()) return NotFound("region " + std::to_string(id) + " is not registered");
  if (it->second.users != 0) {
    return FailedPrecondition("region " + std::to_string(id) + " still has " +
                              std::to_string(it->second.users) + " operations in flight");
  }
  regions_.erase(it);  // closes the fid_mr: later writes with its key are rejected
  return OkStatus();
}

Result<fi_addr_t> DomainWorker::DoInsertAddress(const std::string& fabric_addr) {
  auto it = addresses_.find(fabric_addr);
  if (it != addresses_.end()) return it->second;
  if (fabric_addr.size() != address_.size()) {
    return InvalidArgument("fabric address of " + std::to_string(fabric_addr.size()) +
                           " bytes; this provider's addresses have " +
                           std::to_string(address_.size()));
  }
  fi_addr_t fi_addr = FI_ADDR_UNSPEC;
  int rc = fi_av_insert(av_.get(), fabric_addr.data(), 1, &fi_addr, 0, nullptr);
  if (rc != 1)
    return FabricError("fi_av_insert(" + HexBytes(fabric_addr) + ")", rc < 0 ? rc : -FI_EINVAL);
  addresses_.emplace(fabric_addr, fi_addr);
  return fi_addr;
}

void DomainWorker::Post(std::function<void()> command) {
  {
    MutexLock lock(&mu_);
    commands_.push_back(std::move(command));
  }
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;  // a full eventfd counter still wakes the worker
}

DomainWorker::~DomainWorker() {
  if (thread_.joinable()) {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    Post([] {});
    thread_.join();
  }
  // Commands posted after the worker's last pass (a submission racing the stop) still run, so a
  // submitted transfer is reported (below) rather than leaked with its callback never called.
  RunCommands();
  CloseEndpointAndFailOpen();
  for (OpContext* ctx : inflight_) delete ctx;  // flushed with the endpoint
  inflight_.clear();
  // Close order: endpoint (above), its CQ, then memory, AV, domain, fabric.
  cq_.reset();
  CheckRegionsStillAllocated();
  fault_scratch_.clear();
  regions_.clear();
  recv_mr_.reset();
  send_mr_.reset();
  av_.reset();
  domain_.reset();
  fabric_.reset();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void DomainWorker::CloseEndpointAndFailOpen() {
  ep_.reset();  // no operation of ours can be written or completed any more
  std::vector<Transfer*> open;
  for (auto& [id, t] : transfers_) open.push_back(t.get());
  for (Transfer* t : open) {
    Report(t, t->finishing ? t->failure : Cancelled("fabric domain closed"));
  }
}

void DomainWorker::CheckRegionsStillAllocated() {
  const long page = sysconf(_SC_PAGESIZE);
  for (const auto& [id, r] : regions_) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(r.data) & ~uintptr_t(page - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(r.data) + r.size;
    std::vector<unsigned char> resident((end - begin + page - 1) / page);
    bool freed = mincore(reinterpret_cast<void*>(begin), end - begin, resident.data()) != 0 &&
                 errno == ENOMEM;  // part of it is no longer mapped
#if PD_HAS_ASAN
    freed = freed || __asan_region_is_poisoned(r.data, r.size) != nullptr;
#endif
    if (!freed) continue;
    g_regions_freed_while_registered.fetch_add(1);
    PD_LOG_ERROR(
        "fabric domain closing: registered region {} ({} bytes at {}) was freed while still "
        "registered; free registered memory only after its domain is closed",
        id, r.size, static_cast<const void*>(r.data));
  }
}

uint64_t NumRegionsFreedWhileRegistered() { return g_regions_freed_while_registered.load(); }

}  // namespace pd::transfer
