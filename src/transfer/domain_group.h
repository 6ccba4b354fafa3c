// Several fabric domains (one per NIC) used as one: a region is registered on every domain, a
// paged write is split over the domains round-robin or by outstanding bytes, and the receiving
// side's domains share one imm counter table so a transfer spread over NICs counts as one.
//
// Thread safety: all methods are thread-safe; completions run on a domain worker thread.
#pragma once

#include <atomic>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "transfer/domain.h"

namespace pd::transfer {

enum class SpreadPolicy {
  kRoundRobin,  // page k goes to domain k % n
  kByBytes,     // each page goes to the domain with the fewest bytes outstanding
};

struct DomainGroupOptions {
  std::vector<DomainOptions>
      domains;  // one per NIC; their imm_counters are replaced by a shared one
  SpreadPolicy policy = SpreadPolicy::kByBytes;
};

// One region registered on every domain of a group.
struct GroupRegion {
  std::vector<MemoryRegion> regions;  // per domain
  GroupDescriptor descriptor;         // give this (as bytes) to peers
};

// A peer group's region as seen by each of our domains: ours[i] writes to the peer's domain
// i % (peer domains).
struct GroupRemote {
  std::vector<RemoteRegion> remotes;  // per our domain
};

class DomainGroup {
 public:
  static Result<std::unique_ptr<DomainGroup>> Create(const DomainGroupOptions& options);

  size_t size() const { return domains_.size(); }
  Domain& domain(size_t i) { return *domains_[i]; }
  ImmCounterTable& imm_counters() { return *imm_; }

  Result<GroupRegion> RegisterMemory(void* data, uint64_t size,
                                     RegionAccess access = RegionAccess::kSourceAndTarget);
  Status Deregister(const GroupRegion& region);
  Result<GroupRemote> AddRemote(const GroupDescriptor& descriptor);

  // `shape` gives the pages, sizes, strides, offsets and imm; its src and dst are ignored. Every
  // page write carries the imm, whichever domain posts it. `done` runs once, with the first error.
  Result<TransferId> SubmitPagedWrite(const GroupRegion& src, const GroupRemote& dst,
                                      const PagedWriteRequest& shape, Completion done)
      EXCLUDES(mu_);
  void Cancel(TransferId id) EXCLUDES(mu_);

  // Bytes submitted to domain i over the group's life (for tests and the bench).
  uint64_t bytes_submitted(size_t i) const { return stats_[i]->submitted.load(); }

 private:
  struct Stats {
    std::atomic<uint64_t> submitted{0};
    std::atomic<uint64_t> outstanding{0};
  };
  DomainGroup() = default;
  std::vector<size_t> Assign(const PagedWriteRequest& shape);

  SpreadPolicy policy_ = SpreadPolicy::kByBytes;
  std::shared_ptr<ImmCounterTable> imm_;
  std::vector<std::unique_ptr<Domain>> domains_;
  std::vector<std::unique_ptr<Stats>> stats_;
  std::atomic<TransferId> next_id_{1};
  Mutex mu_;
  // group transfer -> (domain, transfer) parts still running
  std::unordered_map<TransferId, std::vector<std::pair<size_t, TransferId>>> parts_ GUARDED_BY(mu_);
};

}  // namespace pd::transfer
