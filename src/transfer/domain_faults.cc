// DomainWorker's fault injection (fault_injection.h): what a rule does to a write as it is posted
// and to an immediate as it arrives, and the release of held ones. Reached only when the domain was
// given a FaultInjector; the progress loop's hooks are one pointer check each.
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

#include "common/clock.h"
#include "common/log.h"
#include "transfer/domain_worker.h"

namespace pd::transfer {
namespace {

double Now() { return SystemClock::Get().NowSeconds(); }

}  // namespace

ssize_t DomainWorker::PostWriteFaulted(Transfer* t, const WriteOp& op) {
  if (t->fault_op != t->next) {  // decided once per operation, also when its post is retried
    t->fault_op = t->next;
    t->fault = faults_->Decide(FaultSite::kWrite, t->write.imm);
    if (t->fault) {
      PD_LOG_INFO("fault injection: {} on write {} of transfer {} (imm {})",
                  FaultRuleToString(*t->fault), t->next, t->id, t->write.imm.value_or(0));
    }
  }
  if (!t->fault) {
    ssize_t rc = IssueWrite(t, op);
    if (rc == 0) ReleaseHeld(/*next_write=*/true, false);
    return rc;
  }
  switch (t->fault->kind) {
    case FaultKind::kDrop:  // never posted, completed OK here: nothing arrives there
      ++t->next;
      t->last_progress = Now();
      if (t->next == t->total && t->inflight == 0) Finish(t, OkStatus());
      return 0;
    case FaultKind::kDuplicate: {
      ssize_t rc = IssueWrite(t, op);
      if (rc != 0) return rc;
      // The copy is one more operation of the transfer (not one more of its writes): the
      // transfer is reported only once the copy, too, came back.
      OpContext* copy = NewContext(OpContext::Kind::kWrite, t);
      copy->region_id = t->write.src.id;
      copy->dest = op.addr;
      if (WriteMsg(copy, op) != 0) {
        FreeContext(copy);
        return 0;
      }
      ++regions_.at(copy->region_id).users;
      inflight_.insert(copy);
      num_inflight_ops_.fetch_add(1, std::memory_order_acq_rel);
      ++live_inflight_;
      ++t->inflight;
      return 0;
    }
    case FaultKind::kCorrupt:
      return PostCorruptCopy(t, op);
    case FaultKind::kFail: {  // lands, but OnOpDone reports its completion as an error
      OpContext* ctx = nullptr;
      ssize_t rc = IssueWrite(t, op, &ctx);
      if (rc == 0) failed_by_fault_.insert(ctx);
      return rc;
    }
    case FaultKind::kDelay:
    case FaultKind::kReorder:
      HoldWrite(t, op, *t->fault);
      return 0;
  }
  return IssueWrite(t, op);
}

// Sends a copy of the source bytes with its middle byte flipped, from a scratch buffer registered
// for it (freed when the write completes): the source memory stays as it was.
ssize_t DomainWorker::PostCorruptCopy(Transfer* t, const WriteOp& op) {
  auto scratch = std::make_unique<FaultScratch>();
  scratch->bytes.assign(static_cast<const char*>(op.iov.iov_base),
                        static_cast<const char*>(op.iov.iov_base) + op.iov.iov_len);
  if (!scratch->bytes.empty()) scratch->bytes[scratch->bytes.size() / 2] ^= 0xFF;
  auto mr = RegisterRaw(scratch->bytes.data(), std::max<size_t>(1, scratch->bytes.size()),
                        FI_READ | FI_WRITE | FI_SEND);
  if (!mr.ok()) {
    PD_LOG_ERROR("fault injection: registering the corrupted copy: {}", mr.status().ToString());
    return -FI_ENOMEM;
  }
  scratch->mr = std::move(mr).value();
  WriteOp corrupted = op;
  corrupted.iov.iov_base = scratch->bytes.data();
  corrupted.desc = fi_mr_desc(scratch->mr.get());
  OpContext* ctx = nullptr;
  ssize_t rc = IssueWrite(t, corrupted, &ctx);
  if (rc == 0) fault_scratch_[ctx] = std::move(scratch);
  return rc;
}

// The operation counts as posted for its transfer (which cannot finish before it completes), but
// goes to the provider only when ReleaseHeld says so.
void DomainWorker::HoldWrite(Transfer* t, const WriteOp& op, const FaultRule& rule) {
  OpContext* ctx = NewContext(OpContext::Kind::kWrite, t);
  ctx->region_id = t->write.src.id;
  ctx->dest = op.addr;
  ++regions_.at(ctx->region_id).users;
  t->last_progress = Now();
  inflight_.insert(ctx);
  num_inflight_ops_.fetch_add(1, std::memory_order_acq_rel);
  ++live_inflight_;
  ++t->inflight;
  ++t->next;
  held_writes_.push_back(
      {ctx, op, Now() + rule.delay_ms / 1000.0, rule.kind == FaultKind::kReorder});
}

void DomainWorker::OnImmediateFaulted(uint32_t value) {
  std::optional<FaultRule> rule = faults_->Decide(FaultSite::kImmediate, value);
  if (!rule) {
    imm_->OnArrival(value);
    ReleaseHeld(false, /*next_imm=*/true);
    return;
  }
  PD_LOG_INFO("fault injection: {} on immediate {}", FaultRuleToString(*rule), value);
  switch (rule->kind) {
    case FaultKind::kDrop:
    case FaultKind::kFail:  // refused for immediates by ParseFaultRules; Arm'd directly: a drop
      return;
    case FaultKind::kDuplicate:
      imm_->OnArrival(value);
      imm_->OnArrival(value);
      return;
    case FaultKind::kCorrupt:
      imm_->OnArrival(value ^ rule->imm_xor);
      return;
    case FaultKind::kDelay:
    case FaultKind::kReorder:
      held_imms_.push_back(
          {value, Now() + rule->delay_ms / 1000.0, rule->kind == FaultKind::kReorder});
      return;
  }
}

void DomainWorker::ReleaseHeld(bool next_write, bool next_imm) {
  if (held_writes_.empty() && held_imms_.empty()) return;
  const double now = Now();
  std::vector<HeldWrite> writes;
  writes.swap(held_writes_);
  for (HeldWrite& h : writes) {
    OpContext* ctx = h.ctx;
    if (ctx->transfer->finishing) {  // its transfer failed or was cancelled: never posted
      OnOpDone(ctx, Cancelled("a write held by fault injection; its transfer ended"));
      continue;
    }
    if (!(now >= h.release_at || (h.until_next && next_write))) {
      held_writes_.push_back(h);
      continue;
    }
    ssize_t rc = WriteMsg(ctx, h.op);
    if (rc == -FI_EAGAIN) {
      held_writes_.push_back(h);
    } else if (rc != 0) {
      OnOpDone(ctx, FabricError("fi_writemsg", rc));
    }
  }
  std::vector<HeldImm> imms;
  imms.swap(held_imms_);
  for (const HeldImm& h : imms) {
    if (now >= h.release_at || (h.until_next && next_imm)) {
      imm_->OnArrival(h.value);
    } else {
      held_imms_.push_back(h);
    }
  }
}

}  // namespace pd::transfer
