#include "server/kv_index.h"

#include <algorithm>
#include <limits>

namespace pd::server {

void KvIndex::ApplySnapshot(const std::string& backend, const engine::KvEventBatch& snapshot) {
  MutexLock lock(&mu_);
  Entry& e = backends_[backend];
  e.keys.clear();
  e.keys.insert(snapshot.keys.begin(), snapshot.keys.end());
  KvBackendState& s = e.state;
  s.synced = true;
  s.epoch = snapshot.epoch;
  s.seq = snapshot.seq;
  s.root = snapshot.root;
  s.page_size = snapshot.page_size;
  s.num_keys = e.keys.size();
  ++s.snapshots;
}

Status KvIndex::ApplyEvents(const std::string& backend, const engine::KvEventBatch& batch) {
  MutexLock lock(&mu_);
  Entry& e = backends_[backend];
  KvBackendState& s = e.state;
  std::string why;
  if (!s.synced) {
    why = "events before any snapshot";
  } else if (batch.epoch != s.epoch) {
    why = "events of epoch " + std::to_string(batch.epoch) + " after a snapshot of epoch " +
          std::to_string(s.epoch) + " (the instance restarted)";
  }
  uint64_t expect = s.seq + 1;
  for (size_t i = 0; why.empty() && i < batch.events.size(); ++i, ++expect) {
    if (batch.events[i].seq != expect)
      why = "event " + std::to_string(batch.events[i].seq) + " where " + std::to_string(expect) +
            " was due (a gap)";
  }
  if (!why.empty()) {
    e.keys.clear();
    s.synced = false;
    s.num_keys = 0;
    s.why_unsynced = why;
    return FailedPrecondition("kv events of " + backend + ": " + why);
  }
  for (const engine::KvEvent& ev : batch.events) {
    if (ev.stored) {
      e.keys.insert(ev.key);
    } else {
      e.keys.erase(ev.key);
    }
  }
  s.seq = std::max(s.seq, batch.seq);
  s.num_keys = e.keys.size();
  return OkStatus();
}

void KvIndex::MarkUnsynced(const std::string& backend, const std::string& why) {
  MutexLock lock(&mu_);
  Entry& e = backends_[backend];
  e.keys.clear();
  e.state.synced = false;
  e.state.num_keys = 0;
  e.state.why_unsynced = why;
}

void KvIndex::Remove(const std::string& backend) {
  MutexLock lock(&mu_);
  backends_.erase(backend);
}

int KvIndex::CachedPages(const std::string& backend, std::span<const uint64_t> keys) const {
  MutexLock lock(&mu_);
  auto it = backends_.find(backend);
  if (it == backends_.end() || !it->second.state.synced) return -1;
  int n = 0;
  for (uint64_t key : keys) {
    if (it->second.keys.count(key) == 0) break;
    ++n;
  }
  return n;
}

KvBackendState KvIndex::State(const std::string& backend) const {
  MutexLock lock(&mu_);
  auto it = backends_.find(backend);
  return it == backends_.end() ? KvBackendState() : it->second.state;
}

std::vector<std::string> KvIndex::Backends() const {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [url, e] : backends_) out.push_back(url);
  return out;
}

int ChooseKvAware(std::span<const KvCandidate> candidates, double compute_weight,
                  double load_weight, size_t start) {
  const size_t n = candidates.size();
  if (n == 0) return -1;
  // An unknown cache counts as the best known fraction cached.
  double best_known = 0.0;
  for (const KvCandidate& c : candidates) {
    if (c.cached_pages >= 0 && c.prompt_pages > 0)
      best_known = std::max(best_known, double(c.cached_pages) / c.prompt_pages);
  }
  int best = -1;
  double best_cost = std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (start + k) % n;
    const KvCandidate& c = candidates[i];
    const double cached = c.cached_pages >= 0 ? c.cached_pages : best_known * c.prompt_pages;
    const double cost = compute_weight * (c.prompt_pages - cached) + load_weight * c.load;
    if (cost < best_cost) {
      best_cost = cost;
      best = static_cast<int>(i);
    }
  }
  return best;
}

}  // namespace pd::server
