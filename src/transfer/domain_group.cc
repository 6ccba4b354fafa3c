#include "transfer/domain_group.h"

namespace pd::transfer {

Result<std::unique_ptr<DomainGroup>> DomainGroup::Create(const DomainGroupOptions& options) {
  if (options.domains.empty()) return InvalidArgument("DomainGroup: no domains");
  std::unique_ptr<DomainGroup> g(new DomainGroup());
  g->policy_ = options.policy;
  g->imm_ = std::make_shared<ImmCounterTable>();
  for (size_t i = 0; i < options.domains.size(); ++i) {
    DomainOptions o = options.domains[i];
    o.imm_counters = g->imm_;
    auto d = Domain::Create(o);
    if (!d.ok()) return d.status().WithContext("domain " + std::to_string(i) + " of the group");
    g->domains_.push_back(std::move(d).value());
    g->stats_.push_back(std::make_unique<Stats>());
  }
  return g;
}

Result<GroupRegion> DomainGroup::RegisterMemory(void* data, uint64_t size, RegionAccess access) {
  GroupRegion g;
  for (auto& d : domains_) {
    auto r = d->RegisterMemory(data, size, access);
    if (!r.ok()) {
      for (size_t i = 0; i < g.regions.size(); ++i)
        domains_[i]->Deregister(g.regions[i]).IgnoreError();
      return r.status();
    }
    g.descriptor.domains.push_back(r->descriptor);
    g.regions.push_back(std::move(r).value());
  }
  return g;
}

Status DomainGroup::Deregister(const GroupRegion& region) {
  Status first;
  for (size_t i = 0; i < region.regions.size() && i < domains_.size(); ++i) {
    Status s = domains_[i]->Deregister(region.regions[i]);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

Result<GroupRemote> DomainGroup::AddRemote(const GroupDescriptor& descriptor) {
  if (descriptor.domains.empty()) return InvalidArgument("group descriptor has no domains");
  GroupRemote g;
  for (size_t i = 0; i < domains_.size(); ++i) {
    const MemoryDescriptor& peer = descriptor.domains[i % descriptor.domains.size()];
    if (peer.length != descriptor.domains[0].length) {
      return InvalidArgument("group descriptor: domains disagree on the region length");
    }
    ASSIGN_OR_RETURN(RemoteRegion r, domains_[i]->AddRemote(peer));
    g.remotes.push_back(std::move(r));
  }
  return g;
}

std::vector<size_t> DomainGroup::Assign(const PagedWriteRequest& shape) {
  const size_t n = domains_.size(), pages = shape.src_pages.size();
  std::vector<size_t> owner(pages);
  if (policy_ == SpreadPolicy::kRoundRobin) {
    for (size_t k = 0; k < pages; ++k) owner[k] = k % n;
    return owner;
  }
  std::vector<uint64_t> load(n);
  for (size_t i = 0; i < n; ++i) load[i] = stats_[i]->outstanding.load();
  for (size_t k = 0; k < pages; ++k) {
    size_t best = 0;
    for (size_t i = 1; i < n; ++i) best = load[i] < load[best] ? i : best;
    owner[k] = best;
    load[best] += shape.bytes_per_page;
  }
  return owner;
}

namespace {
// Joins the parts of one group transfer: `done` runs once, after the last part, with the first
// error.
struct Join {
  Join(size_t num_parts, Completion done_in, std::function<void()> forget_in)
      : remaining(num_parts), done(std::move(done_in)), forget(std::move(forget_in)) {}

  Mutex mu;
  size_t remaining GUARDED_BY(mu);
  Status first GUARDED_BY(mu);
  const Completion done;
  const std::function<void()> forget;
};
}  // namespace

Result<TransferId> DomainGroup::SubmitPagedWrite(const GroupRegion& src, const GroupRemote& dst,
                                                 const PagedWriteRequest& shape, Completion done) {
  if (src.regions.size() != domains_.size() || dst.remotes.size() != domains_.size()) {
    return InvalidArgument("group write: region or remote not from this group");
  }
  PagedWriteRequest whole = shape;  // validate all of it before posting any part
  whole.src = src.regions[0];
  whole.dst = dst.remotes[0];
  RETURN_IF_ERROR(ValidatePagedWrite(whole, domains_[0]->info().max_msg_size));
  for (auto& d : domains_) {
    if (shape.imm && d->info().cq_data_size < 4) {
      return Unimplemented("domain " + d->info().domain + " cannot carry 4-byte immediates");
    }
    if (shape.bytes_per_page > d->info().max_msg_size) {
      return InvalidArgument("page larger than domain " + d->info().domain + "'s max_msg_size");
    }
  }

  std::vector<size_t> owner = Assign(shape);
  std::vector<PagedWriteRequest> parts(domains_.size());
  for (size_t i = 0; i < domains_.size(); ++i) {
    parts[i] = shape;
    parts[i].src = src.regions[i];
    parts[i].dst = dst.remotes[i];
    parts[i].src_pages.clear();
    parts[i].dst_pages.clear();
  }
  for (size_t k = 0; k < owner.size(); ++k) {
    parts[owner[k]].src_pages.push_back(shape.src_pages[k]);
    parts[owner[k]].dst_pages.push_back(shape.dst_pages[k]);
  }
  TransferId id = next_id_.fetch_add(1);
  size_t num_parts = 0;
  for (auto& p : parts) num_parts += p.src_pages.empty() ? 0 : 1;
  auto join = std::make_shared<Join>(num_parts, std::move(done), [this, id] {
    MutexLock lock(&mu_);
    parts_.erase(id);
  });
  MutexLock lock(&mu_);  // completions wait for the parts list to be complete
  auto& ids = parts_[id];
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].src_pages.empty()) continue;
    uint64_t bytes = parts[i].src_pages.size() * shape.bytes_per_page;
    Stats* stats = stats_[i].get();
    stats->submitted += bytes;
    stats->outstanding += bytes;
    auto sub = domains_[i]->SubmitPagedWrite(parts[i], [join, stats, bytes](const Status& s) {
      stats->outstanding -= bytes;
      MutexLock jl(&join->mu);
      if (join->first.ok() && !s.ok()) join->first = s;
      if (--join->remaining > 0) return;
      const Status first = join->first;
      jl.Unlock();
      join->forget();
      if (join->done) join->done(first);
    });
    PD_CHECK(sub.ok()) << "validated part rejected: " << sub.status().ToString();
    ids.emplace_back(i, *sub);
  }
  return id;
}

void DomainGroup::Cancel(TransferId id) {
  std::vector<std::pair<size_t, TransferId>> ids;
  {
    MutexLock lock(&mu_);
    auto it = parts_.find(id);
    if (it == parts_.end()) return;
    ids = it->second;
  }
  for (auto& [domain, sub] : ids) domains_[domain]->Cancel(sub);
}

}  // namespace pd::transfer
