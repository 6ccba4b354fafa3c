// Fault injection for tests: a FaultInjector handed to a Domain (DomainOptions::faults) makes its
// worker drop, duplicate, corrupt, delay or reorder chosen operations, so that the layers above
// can be tested against a fabric that misbehaves. Without one (the default, null) the worker pays
// one pointer check per operation.
//
// Two sites:
// - kWrite, where the initiator posts a one-sided write (one page of a paged write is one
//   operation). Drop: the write is never posted but completes OK locally (data and immediate
//   never arrive). Duplicate: posted twice (the copy's completion is swallowed). Corrupt: a copy of
//   the source bytes with one byte flipped (in a scratch buffer registered for it: the source
//   memory is never changed) is sent instead. Delay: posted `delay_ms` later, other operations
//   going ahead meanwhile. Reorder: posted right after the next write this domain posts (or after
//   `delay_ms` if none follows). A held write whose transfer failed or was cancelled meanwhile is
//   never posted. Fail: posted (its bytes and immediate land), but its completion reports an
//   error: a completion lost after delivery, as when a NIC or link fails under a write.
// - kImmediate, where the target's completion queue reports a write's immediate data (the write's
//   bytes have landed). Drop: not counted. Duplicate: counted twice. Corrupt: counted under the
//   value XOR `imm_xor`. Delay: counted `delay_ms` later. Reorder: counted right after the next
//   immediate that arrives (or after `delay_ms`). Fail applies to writes only.
//
// A rule matches the operations of its site that carry `imm` (any when unset), counted from when it
// was armed: it applies to the `nth` to the `nth + count - 1`th of them.
//
//   auto faults = std::make_shared<FaultInjector>();
//   options.faults = faults;                              // before Domain::Create
//   FaultRule rule;
//   rule.kind = FaultKind::kCorrupt;  // of the third write posted from now
//   rule.nth = 3;
//   faults->Arm(rule);
//   ... run the transfer ...; EXPECT_EQ(faults->num_applied(), 1u);
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"

namespace pd::transfer {

enum class FaultSite : uint8_t { kWrite, kImmediate };
enum class FaultKind : uint8_t { kDrop, kDuplicate, kCorrupt, kDelay, kReorder, kFail };

struct FaultRule {
  FaultSite site = FaultSite::kWrite;
  FaultKind kind = FaultKind::kDrop;
  uint64_t nth = 1;                // 1: the first matching operation after Arm
  uint64_t count = 1;              // consecutive matching operations faulted from the nth
  std::optional<uint32_t> imm;     // only operations carrying this immediate; unset: any
  uint32_t delay_ms = 50;          // kDelay: the delay; kReorder: the longest wait for a successor
  uint32_t imm_xor = 0x40000000u;  // kCorrupt of an immediate: XORed into the value
};

std::string_view FaultSiteName(FaultSite site);
std::string_view FaultKindName(FaultKind kind);
std::string FaultRuleToString(const FaultRule& rule);

// Parses a comma-separated list of rules "SITE:KIND:NTH[:DELAY_MS]", SITE one of write, imm and
// KIND one of drop, dup, corrupt, delay, reorder, fail (writes only); e.g.
// "write:corrupt:5,imm:delay:2:800". InvalidArgument naming the part that is wrong.
Result<std::vector<FaultRule>> ParseFaultRules(std::string_view spec);

class FaultInjector {
 public:
  // Adds a rule; its count of matching operations starts now.
  void Arm(const FaultRule& rule) EXCLUDES(mu_);
  // Removes every rule (operations already held are still released as their rule said).
  void Disarm() EXCLUDES(mu_);
  // Operations faulted since construction, all rules together.
  uint64_t num_applied() const EXCLUDES(mu_);

  // The domain worker, for each operation at `site` carrying `imm` (unset: none): the first rule
  // that applies to it, or nullopt to leave the operation alone. Counts the operation for every
  // armed rule of the site that matches it.
  std::optional<FaultRule> Decide(FaultSite site, std::optional<uint32_t> imm) EXCLUDES(mu_);

 private:
  struct Armed {
    FaultRule rule;
    uint64_t seen = 0;  // matching operations since Arm
  };
  mutable Mutex mu_;
  std::vector<Armed> rules_ GUARDED_BY(mu_);
  uint64_t applied_ GUARDED_BY(mu_) = 0;
};

}  // namespace pd::transfer
