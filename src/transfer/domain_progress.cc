// DomainWorker's progress loop: run commands, post what the window allows, read the completion
// queue, fail what is overdue, and block on the CQ's wait fd when there is nothing to do.
#include <poll.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sched.h>
#include <unistd.h>
#include <algorithm>

#include "common/check.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/thread_util.h"
#include "transfer/domain_worker.h"
#include "transfer/poll_policy.h"

namespace pd::transfer {
namespace {

constexpr int kCqBatch = 32;
constexpr int kSpinPolls = 64;  // empty CQ reads before blocking
constexpr double kDeadlineScanS = 0.005;

double Now() { return SystemClock::Get().NowSeconds(); }

}  // namespace

void DomainWorker::Run() {
  SetCurrentThreadName("pd-fabric");
  int idle = 0;
  while (true) {
    RunCommands();
    {
      MutexLock lock(&mu_);
      if (stop_) break;
    }
    PostPending();
    int n = PollCq();
    CheckDeadlines();
    if (n > 0) {
      idle = 0;
      naps_since_activity_ = 0;
      continue;
    }
    if (++idle < kSpinPolls) continue;
    idle = 0;
    Block(transfers_.empty() && !HoldsFaults() ? 200 : 10);  // short naps while deadlines run
  }
  // Transfers still open are reported once the endpoint is closed (~DomainWorker): until then
  // their operations could still be written.
}

void DomainWorker::RunCommands() {
  std::vector<std::function<void()>> commands;
  {
    MutexLock lock(&mu_);
    commands.swap(commands_);
  }
  for (auto& command : commands) command();
}

void DomainWorker::Block(int timeout_ms) {
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {cq_fd_, POLLIN, 0}};
  int nfds = 1;
  if (cq_fd_ >= 0) {
    fid* cq_fid = &cq_->fid;
    if (fi_trywait(fabric_.get(), &cq_fid, 1) != FI_SUCCESS) return;  // progress needed first
    nfds = 2;
  } else {  // no wait object: nap briefly (NoWaitObjectPoll), then poll again
    const int us = std::min(NoWaitObjectPoll::NapUs(naps_since_activity_++), timeout_ms * 1000);
    if (us == 0) {
      sched_yield();
      return;
    }
    timespec ts{0, us * 1000L};
    if (ppoll(fds, 1, &ts, nullptr) > 0 && (fds[0].revents & POLLIN)) {
      uint64_t value;
      ssize_t n = read(wake_fd_, &value, sizeof(value));
      (void)n;
      naps_since_activity_ = 0;  // a command: a posted op's completion may follow soon
    }
    return;
  }
  if (poll(fds, nfds, timeout_ms) > 0 && (fds[0].revents & POLLIN)) {
    uint64_t value;
    ssize_t n = read(wake_fd_, &value, sizeof(value));
    (void)n;
  }
}

void DomainWorker::DoSubmit(std::unique_ptr<Transfer> transfer) {
  Transfer* t = transfer.get();
  t->last_progress = Now();
  transfers_.emplace(t->id, std::move(transfer));
  pending_.push_back(t->id);
}

void DomainWorker::DoCancel(TransferId id) {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return;
  Finish(it->second.get(), Cancelled("transfer " + std::to_string(id) + " cancelled"));
}

// Posts in submission order per destination: a transfer whose post is refused (-FI_EAGAIN: its
// peer's connection is not up, or the provider's queue is full; or its destination holds its
// share of send buffers) holds back only the transfers behind it to the same destination, so a
// dead or silent peer does not stall the writes and messages to every other peer.
void DomainWorker::PostPending() {
  std::vector<fi_addr_t> blocked;  // destinations refused in this pass
  bool no_send_buffers = false;
  if (faults_ != nullptr) ReleaseHeld(false, false);
  auto it = pending_.begin();
  while (it != pending_.end() && live_inflight_ < options_.max_inflight) {
    auto found = transfers_.find(*it);
    if (found == transfers_.end() || found->second->next == found->second->total) {
      it = pending_.erase(it);  // finished, failed or cancelled meanwhile
      continue;
    }
    Transfer* t = found->second.get();
    const fi_addr_t dest = t->dest();
    if (std::find(blocked.begin(), blocked.end(), dest) != blocked.end() ||
        (no_send_buffers && t->kind == Transfer::Kind::kSend)) {
      ++it;
      continue;
    }
    ssize_t rc = PostNext(t);
    if (rc == 0) continue;                         // the same transfer's next operation, if any
    if (rc == -FI_EAGAIN || rc == 1 || rc == 2) {  // read the CQ, then retry
      t->refused = true;
      blocked.push_back(dest);
      if (rc == 1) no_send_buffers = true;
      ++it;
      continue;
    }
    Finish(t, FabricError(t->kind == Transfer::Kind::kWrite ? "fi_writemsg" : "fi_sendmsg", rc));
  }
}

ssize_t DomainWorker::PostNext(Transfer* t) {
  return t->kind == Transfer::Kind::kWrite ? PostWrite(t) : PostSend(t);
}

ssize_t DomainWorker::PostWrite(Transfer* t) {
  const PagedWriteRequest& r = t->write;
  auto region = regions_.find(r.src.id);
  if (region == regions_.end()) {
    Finish(t, FailedPrecondition("source region " + std::to_string(r.src.id) +
                                 " was deregistered before the write was posted"));
    return 0;
  }
  if ((region->second.access & FI_WRITE) == 0) {
    Finish(t, FailedPrecondition("source region " + std::to_string(r.src.id) +
                                 " was registered as a remote-write target only"));
    return 0;
  }
  const size_t k = t->next;
  WriteOp op;
  op.iov = {region->second.data + r.src_offset + uint64_t{r.src_pages[k]} * r.src_stride,
            r.bytes_per_page};
  op.desc = region->second.desc;
  op.rma = {r.dst.descriptor.addr + r.dst_offset + uint64_t{r.dst_pages[k]} * r.dst_stride,
            r.bytes_per_page, r.dst.descriptor.rkey};
  op.addr = r.dst.fi_addr;
  op.data = r.imm.value_or(0);
  op.flags = FI_COMPLETION | (r.imm ? FI_REMOTE_CQ_DATA : 0) |
             (options_.delivery_complete ? FI_DELIVERY_COMPLETE : 0);
  if (faults_ != nullptr) return PostWriteFaulted(t, op);  // tests only (fault_injection.h)
  return IssueWrite(t, op);
}

ssize_t DomainWorker::IssueWrite(Transfer* t, const WriteOp& op, OpContext** posted) {
  OpContext* ctx = NewContext(OpContext::Kind::kWrite, t);
  ctx->region_id = t->write.src.id;
  ctx->dest = op.addr;
  ssize_t rc = WriteMsg(ctx, op);
  if (rc != 0) {
    FreeContext(ctx);
    return rc;
  }
  ++regions_.at(ctx->region_id).users;
  t->last_progress = Now();
  inflight_.insert(ctx);
  num_inflight_ops_.fetch_add(1, std::memory_order_acq_rel);
  ++live_inflight_;
  ++t->inflight;
  ++t->next;
  if (posted != nullptr) *posted = ctx;
  return 0;
}

ssize_t DomainWorker::WriteMsg(OpContext* ctx, const WriteOp& op) {
  void* desc = op.desc;
  fi_msg_rma msg{};
  msg.msg_iov = &op.iov;
  msg.desc = &desc;
  msg.iov_count = 1;
  msg.addr = op.addr;
  msg.rma_iov = &op.rma;
  msg.rma_iov_count = 1;
  msg.context = &ctx->fi_ctx;
  msg.data = op.data;
  return fi_writemsg(ep_.get(), &msg, op.flags);
}

ssize_t DomainWorker::PostSend(Transfer* t) {
  if (free_send_.empty()) return 1;
  uint32_t& held = dest_sends_[t->peer.fi_addr];
  if (held >= std::max<uint32_t>(1, options_.num_send_buffers / 2)) return 2;
  uint32_t index = free_send_.back();
  char* buf = send_slab_.data() + size_t{index} * options_.message_bytes;
  std::copy(t->message.begin(), t->message.end(), buf);
  OpContext* ctx = NewContext(OpContext::Kind::kSend, t);
  ctx->buffer = index;
  iovec iov{buf, t->message.size()};
  void* desc = fi_mr_desc(send_mr_.get());
  fi_msg msg{};
  msg.msg_iov = &iov;
  msg.desc = &desc;
  msg.iov_count = 1;
  msg.addr = t->peer.fi_addr;
  msg.context = &ctx->fi_ctx;
  ssize_t rc = fi_sendmsg(ep_.get(), &msg, FI_COMPLETION);
  if (rc != 0) {
    FreeContext(ctx);
    return rc;
  }
  free_send_.pop_back();
  ++held;
  ctx->dest = t->peer.fi_addr;
  t->last_progress = Now();
  inflight_.insert(ctx);
  num_inflight_ops_.fetch_add(1, std::memory_order_acq_rel);
  ++live_inflight_;
  ++t->inflight;
  ++t->next;
  return 0;
}

int DomainWorker::PollCq() {
  fi_cq_data_entry entries[kCqBatch];
  ssize_t n = fi_cq_read(cq_.get(), entries, kCqBatch);
  if (n == -FI_EAVAIL) {
    HandleCqError();
    return 1;
  }
  if (n <= 0) {
    if (n != -FI_EAGAIN) PD_LOG_WARN("{}", FabricError("fi_cq_read", n).ToString());
    return 0;
  }
  for (ssize_t i = 0; i < n; ++i) HandleCompletion(entries[i]);
  return static_cast<int>(n);
}

void DomainWorker::HandleCompletion(const fi_cq_data_entry& e) {
  auto* ctx = static_cast<OpContext*>(e.op_context);
  if (e.flags & FI_REMOTE_CQ_DATA) {
    // A write carrying an immediate landed. With FI_RX_CQ_DATA it consumed a posted receive (the
    // event's context); without it the context is none of ours and must not be read.
    if (faults_ != nullptr) {
      OnImmediateFaulted(static_cast<uint32_t>(e.data));  // tests only (fault_injection.h)
    } else {
      imm_->OnArrival(static_cast<uint32_t>(e.data));
    }
    if (rx_cq_data_ && ctx != nullptr && ctx->kind == OpContext::Kind::kRecv) {
      Status s = PostRecv(ctx->buffer);
      if (!s.ok()) PD_LOG_ERROR("reposting receive: {}", s.ToString());
    }
    return;
  }
  if (ctx == nullptr) return;  // a remote write without data, on providers that report those
  if (ctx->kind == OpContext::Kind::kRecv) {
    if (options_.on_message) {
      const char* buf = recv_slab_.data() + size_t{ctx->buffer} * options_.message_bytes;
      options_.on_message(std::string_view(buf, e.len));
    }
    Status s = PostRecv(ctx->buffer);
    if (!s.ok()) PD_LOG_ERROR("reposting receive: {}", s.ToString());
    return;
  }
  OnOpDone(ctx, OkStatus());
}

void DomainWorker::HandleCqError() {
  fi_cq_err_entry err{};
  ssize_t rc = fi_cq_readerr(cq_.get(), &err, 0);
  if (rc < 0) return;
  auto* ctx = static_cast<OpContext*>(err.op_context);
  const char* prov = fi_cq_strerror(cq_.get(), err.prov_errno, err.err_data, nullptr, 0);
  std::string text = std::string(fi_strerror(err.err)) + " (provider: " + (prov ? prov : "") + ")";
  if (ctx == nullptr || ctx->kind == OpContext::Kind::kRecv) {
    PD_LOG_WARN("receive completion error: {}", text);
    if (ctx != nullptr && err.err != FI_ECANCELED) {
      Status s = PostRecv(ctx->buffer);
      if (!s.ok()) PD_LOG_ERROR("reposting receive: {}", s.ToString());
    }
    return;
  }
  const char* call = ctx->kind == OpContext::Kind::kWrite ? "fi_writemsg" : "fi_sendmsg";
  OnOpDone(ctx, Status(FabricErrorCode(err.err), std::string(call) + " completion: -" +
                                                     std::to_string(err.err) + " " + text));
}

void DomainWorker::OnOpDone(OpContext* ctx, const Status& reported) {
  Status status = reported;
  if (faults_ != nullptr) {
    DoneFaultScratch(ctx);
    if (failed_by_fault_.erase(ctx) != 0 && status.ok()) {
      status = IoError("fi_writemsg completion: an error injected after the write landed");
    }
  }
  inflight_.erase(ctx);
  num_inflight_ops_.fetch_sub(1, std::memory_order_acq_rel);
  if (ctx->kind == OpContext::Kind::kWrite) {
    auto region = regions_.find(ctx->region_id);
    if (region != regions_.end()) --region->second.users;
  } else {
    free_send_.push_back(ctx->buffer);
    if (auto held = dest_sends_.find(ctx->dest); held != dest_sends_.end() && held->second > 0) {
      --held->second;
    }
  }
  Transfer* t = ctx->transfer;
  last_completion_ = Now();
  dest_completion_[ctx->dest] = last_completion_;
  FreeContext(ctx);
  PD_CHECK(t != nullptr) << "an operation came back without its transfer";
  t->last_progress = last_completion_;
  --t->inflight;
  if (t->finishing) {  // failed or cancelled: report once the last operation is back
    if (t->inflight == 0) Report(t, t->failure);
    return;
  }
  --live_inflight_;
  if (!status.ok()) {
    Finish(t, status);
  } else if (t->next == t->total && t->inflight == 0) {
    Finish(t, OkStatus());
  }
}

// A failed or cancelled transfer with operations in flight posts nothing more and asks the
// provider to cancel them (fi_cancel: honoured by providers that can still withdraw a posted
// operation, a no-op elsewhere); it is reported when the last one comes back, completed, failed
// or flushed, never while one could still be written.
void DomainWorker::Finish(Transfer* t, const Status& status) {
  if (t->finishing) return;
  t->next = t->total;
  if (t->inflight == 0) {
    Report(t, status);
    return;
  }
  t->finishing = true;
  t->failure = status.ok() ? Internal("transfer finished with operations in flight") : status;
  live_inflight_ -= t->inflight;
  for (OpContext* ctx : inflight_) {
    if (ctx->transfer != t) continue;
    ssize_t rc = fi_cancel(&ep_->fid, &ctx->fi_ctx);
    if (rc != 0 && rc != -FI_ENOENT && rc != -FI_ENOSYS && rc != -FI_EOPNOTSUPP) {
      PD_LOG_DEBUG("{}", FabricError("fi_cancel", rc).ToString());
    }
  }
}

void DomainWorker::Report(Transfer* t, const Status& status) {
  auto owned = std::move(transfers_.at(t->id));
  transfers_.erase(t->id);
  num_pending_.fetch_sub(1, std::memory_order_acq_rel);
  if (owned->done) owned->done(status);
}

// A transfer fails with DeadlineExceeded when it has made no progress for op_timeout_s: none of
// its operations was posted or completed. One that has not started yet is only stuck when the
// whole domain is (no completion of anything for that long), so a long transfer ahead of it in
// the queue does not time it out; or, once its own post was refused, when nothing to its
// destination completed for that long (other peers' traffic does not keep it alive).
void DomainWorker::CheckDeadlines() {
  double now = Now();
  if (now < next_deadline_check_ || transfers_.empty()) return;
  next_deadline_check_ = now + kDeadlineScanS;
  std::vector<TransferId> overdue;
  for (auto& [id, t] : transfers_) {
    if (t->finishing) {  // its status is decided; only its operations are still out
      if (!t->warned_stuck && now - t->last_progress > options_.op_timeout_s) {
        t->warned_stuck = true;
        PD_LOG_WARN(
            "transfer {} ended ({}) but {} of its operations are still held by the provider "
            "after {} s (stalled peer?); it is reported once they come back or the domain closes",
            id, t->failure.ToString(), t->inflight, options_.op_timeout_s);
      }
      continue;
    }
    const bool started = t->next > 0;
    double since = t->last_progress;
    if (!started) {
      double other = last_completion_;
      if (t->refused) {
        auto d = dest_completion_.find(t->dest());
        other = d == dest_completion_.end() ? 0.0 : d->second;
      }
      since = std::max(since, other);
    }
    if (now - since > options_.op_timeout_s) overdue.push_back(id);
  }
  for (TransferId id : overdue) {
    auto it = transfers_.find(id);
    if (it == transfers_.end()) continue;  // a callback failed it meanwhile
    Finish(it->second.get(),
           DeadlineExceeded("transfer " + std::to_string(id) + ": no progress for " +
                            std::to_string(options_.op_timeout_s) + " s (peer gone?)"));
  }
}

OpContext* DomainWorker::NewContext(OpContext::Kind kind, Transfer* t) {
  std::unique_ptr<OpContext> ctx;
  if (free_ctx_.empty()) {
    ctx = std::make_unique<OpContext>();
  } else {
    ctx = std::move(free_ctx_.back());
    free_ctx_.pop_back();
  }
  *ctx = OpContext{};
  ctx->kind = kind;
  ctx->transfer = t;
  return ctx.release();
}

void DomainWorker::FreeContext(OpContext* ctx) { free_ctx_.emplace_back(ctx); }

}  // namespace pd::transfer
