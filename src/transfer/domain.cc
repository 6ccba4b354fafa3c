#include "transfer/domain.h"

#include <atomic>

#include "transfer/domain_worker.h"

namespace pd::transfer {
namespace {

std::atomic<TransferId> g_next_transfer_id{1};

std::string PageText(size_t k, uint32_t page) {
  return "page " + std::to_string(k) + " (index " + std::to_string(page) + ")";
}

// OK when [offset + page * stride, + bytes) lies inside [0, size), with overflow checks.
bool PageInside(uint64_t offset, uint64_t page, uint64_t stride, uint64_t bytes, uint64_t size) {
  if (stride != 0 && page > (UINT64_MAX - offset) / stride) return false;
  uint64_t start = offset + page * stride;
  return start <= size && bytes <= size - start;
}

}  // namespace

Status ValidatePagedWrite(const PagedWriteRequest& r, uint64_t max_msg_size) {
  if (r.src_pages.size() != r.dst_pages.size()) {
    return InvalidArgument("paged write: " + std::to_string(r.src_pages.size()) +
                           " source pages but " + std::to_string(r.dst_pages.size()) +
                           " destination pages");
  }
  if (r.src_pages.empty()) return InvalidArgument("paged write: no pages");
  if (r.bytes_per_page == 0) return InvalidArgument("paged write: bytes_per_page is 0");
  if (r.bytes_per_page > max_msg_size) {
    return InvalidArgument("paged write: " + std::to_string(r.bytes_per_page) +
                           " bytes per page exceed the provider's max_msg_size " +
                           std::to_string(max_msg_size));
  }
  if (r.src.data == nullptr || r.src.id == 0) {
    return InvalidArgument("paged write: source is not a registered region");
  }
  RETURN_IF_ERROR(r.dst.descriptor.Validate());
  if (r.dst.fi_addr == FI_ADDR_UNSPEC) {
    return InvalidArgument("paged write: destination was not added with AddRemote");
  }
  for (size_t k = 0; k < r.src_pages.size(); ++k) {
    if (!PageInside(r.src_offset, r.src_pages[k], r.src_stride, r.bytes_per_page, r.src.size)) {
      return OutOfRange("paged write: source " + PageText(k, r.src_pages[k]) +
                        " lies outside the local region of " + std::to_string(r.src.size) +
                        " bytes");
    }
    if (!PageInside(r.dst_offset, r.dst_pages[k], r.dst_stride, r.bytes_per_page,
                    r.dst.descriptor.length)) {
      return OutOfRange("paged write: destination " + PageText(k, r.dst_pages[k]) +
                        " lies outside the remote region of " +
                        std::to_string(r.dst.descriptor.length) + " bytes");
    }
  }
  return OkStatus();
}

Result<std::unique_ptr<Domain>> Domain::Create(const DomainOptions& options) {
  std::unique_ptr<Domain> d(new Domain());
  d->options_ = options;
  d->imm_counters_ =
      options.imm_counters ? options.imm_counters : std::make_shared<ImmCounterTable>();
  ASSIGN_OR_RETURN(d->worker_, DomainWorker::Open(options, d->imm_counters_, &d->info_));
  return d;
}

Domain::~Domain() = default;

Result<MemoryRegion> Domain::RegisterMemory(void* data, uint64_t size, RegionAccess access) {
  return worker_->Call<Result<MemoryRegion>>(
      [&] { return worker_->DoRegister(data, size, access); });
}

Status Domain::Deregister(const MemoryRegion& region) {
  return worker_->Call<Status>([&] { return worker_->DoDeregister(region.id); });
}

Result<PeerAddr> Domain::AddPeer(std::string_view fabric_addr) {
  PeerAddr peer;
  peer.fabric_addr = std::string(fabric_addr);
  ASSIGN_OR_RETURN(peer.fi_addr, worker_->Call<Result<fi_addr_t>>(
                                     [&] { return worker_->DoInsertAddress(peer.fabric_addr); }));
  return peer;
}

Result<RemoteRegion> Domain::AddRemote(const MemoryDescriptor& descriptor) {
  RETURN_IF_ERROR(descriptor.Validate());
  ASSIGN_OR_RETURN(PeerAddr peer, AddPeer(descriptor.fabric_addr));
  RemoteRegion remote;
  remote.descriptor = descriptor;
  remote.fi_addr = peer.fi_addr;
  return remote;
}

Result<TransferId> Domain::SubmitWrite(const WriteRequest& w, Completion done) {
  PagedWriteRequest r;
  r.src = w.src;
  r.dst = w.dst;
  r.src_pages = {0};
  r.dst_pages = {0};
  r.bytes_per_page = w.length;
  r.src_offset = w.src_offset;
  r.dst_offset = w.dst_offset;
  r.imm = w.imm;
  return SubmitPagedWrite(std::move(r), std::move(done));
}

Result<TransferId> Domain::SubmitPagedWrite(PagedWriteRequest request, Completion done) {
  RETURN_IF_ERROR(ValidatePagedWrite(request, info_.max_msg_size));
  if (request.imm && info_.cq_data_size < 4) {
    return Unimplemented("provider " + info_.provider + " carries " +
                         std::to_string(info_.cq_data_size) + " bytes of CQ data; need 4");
  }
  auto t = std::make_unique<Transfer>();
  t->id = g_next_transfer_id.fetch_add(1);
  t->kind = Transfer::Kind::kWrite;
  t->total = request.src_pages.size();
  t->write = std::move(request);
  t->done = std::move(done);
  TransferId id = t->id;
  worker_->AddPending();
  worker_->Post(
      [w = worker_.get(), raw = t.release()] { w->DoSubmit(std::unique_ptr<Transfer>(raw)); });
  return id;
}

Result<TransferId> Domain::SubmitSend(const PeerAddr& peer, std::string message, Completion done) {
  if (message.empty() || message.size() > options_.message_bytes) {
    return InvalidArgument("control message of " + std::to_string(message.size()) +
                           " bytes; allowed 1.." + std::to_string(options_.message_bytes));
  }
  if (peer.fi_addr == FI_ADDR_UNSPEC) return InvalidArgument("send to a peer not added");
  auto t = std::make_unique<Transfer>();
  t->id = g_next_transfer_id.fetch_add(1);
  t->kind = Transfer::Kind::kSend;
  t->total = 1;
  t->peer = peer;
  t->message = std::move(message);
  t->done = std::move(done);
  TransferId id = t->id;
  worker_->AddPending();
  worker_->Post(
      [w = worker_.get(), raw = t.release()] { w->DoSubmit(std::unique_ptr<Transfer>(raw)); });
  return id;
}

void Domain::Cancel(TransferId id) {
  worker_->Post([w = worker_.get(), id] { w->DoCancel(id); });
}

size_t Domain::num_pending() const { return worker_->num_pending(); }
size_t Domain::num_inflight_ops() const { return worker_->num_inflight_ops(); }

}  // namespace pd::transfer
