// The router's view of where prompts' KV pages are cached: for every backend (decode or colocated
// instance, by URL) the prefix-cache page keys it holds, kept up to date by its
// GET /v1/kv_events stream (kv_feed.h), and the KV-aware choice of a backend.
//
// A backend is synced once a snapshot arrived; events then apply in sequence. An event batch that
// does not follow on (another epoch, a sequence gap) drops the backend's keys and marks it
// unsynced, as does a stream that fails: an unsynced backend is routed by load only until its
// next snapshot.
//
// Thread safety: every method locks mu_.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "engine/kv_events.h"

namespace pd::server {

struct KvBackendState {
  bool synced = false;
  uint64_t epoch = 0;
  uint64_t seq = 0;   // the last event applied
  uint64_t root = 0;  // PrefixCacheRoot of its keys
  int page_size = 0;
  size_t num_keys = 0;
  uint64_t snapshots = 0;    // snapshots applied so far (the first one and every resnapshot)
  std::string why_unsynced;  // the last reason it was marked unsynced
};

class KvIndex {
 public:
  // Replaces the backend's keys with the snapshot's; it is synced from now on.
  void ApplySnapshot(const std::string& backend, const engine::KvEventBatch& snapshot)
      EXCLUDES(mu_);
  // Applies events that follow the backend's last one. FailedPrecondition (and the backend is
  // unsynced, its keys dropped) when it is not synced, the epoch differs or a number is skipped.
  Status ApplyEvents(const std::string& backend, const engine::KvEventBatch& batch) EXCLUDES(mu_);
  // Drops the backend's keys until its next snapshot; `why` is kept for the metrics and logs.
  void MarkUnsynced(const std::string& backend, const std::string& why) EXCLUDES(mu_);
  // Forgets the backend (it left the deployment).
  void Remove(const std::string& backend) EXCLUDES(mu_);

  // How many of `keys` (a prompt's page keys, in order) the backend holds from the first on;
  // -1 when it is not synced.
  int CachedPages(const std::string& backend, std::span<const uint64_t> keys) const EXCLUDES(mu_);
  KvBackendState State(const std::string& backend) const EXCLUDES(mu_);
  std::vector<std::string> Backends() const EXCLUDES(mu_);

 private:
  struct Entry {
    KvBackendState state;
    std::unordered_set<uint64_t> keys;
  };
  mutable Mutex mu_;
  std::map<std::string, Entry> backends_ GUARDED_BY(mu_);
};

// One backend as the KV-aware choice sees it.
struct KvCandidate {
  int prompt_pages = 0;   // the prompt's full pages in the backend's page size
  int cached_pages = -1;  // of them, held there; -1: unknown (not synced)
  int load = 0;           // requests in flight there
};

// The candidate minimising compute_weight * (prompt pages not cached) + load_weight * load. An
// unknown cache counts as the best known one's, so that an unsynced backend is chosen by load
// alone (neither favoured nor penalised for what it may hold). Ties go to the first candidate from
// `start` on (round). -1 when there is none.
int ChooseKvAware(std::span<const KvCandidate> candidates, double compute_weight,
                  double load_weight, size_t start);

}  // namespace pd::server
