// The KV-aware choice of an instance for a prompt, shared by the router (which decode or
// colocated instance) and the decode instance (which prefill instance): for each candidate, the
// prompt's page keys in its format (root and page size, from its GET /v1/kv_events stream), how
// many of them from the first on it holds (kv_index.h) and its load, weighed by ChooseKvAware.
//
// KvPeerChooser is the decode instance's: it owns the index of its prefill instances' keys and the
// feed that keeps it (kv_feed.h), and chooses among the candidates the messenger offers.
//
// Thread safety: KvCandidatesFor as the index; every KvPeerChooser method from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/kv_feed.h"
#include "server/kv_index.h"

namespace pd::server {

// One instance a prompt may go to: its name in the KvIndex (its base URL) and its load.
struct KvPeerLoad {
  std::string_view name;
  int load = 0;
};

// The candidates ChooseKvAware weighs, one per peer, in order. `tokens` is the prompt the instance
// runs: it computes the last token whatever it holds, so the keys cover the full pages before it.
// A peer the index has not synced gets cached_pages -1 and its prompt pages in a synced peer's
// page size (16 when none is synced).
std::vector<KvCandidate> KvCandidatesFor(const KvIndex& index, std::span<const int32_t> tokens,
                                         std::span<const KvPeerLoad> peers);

struct KvPeerChooserOptions {
  KvFeedOptions feed;
  double compute_weight = 1.0;  // per prompt page the instance lacks
  double load_weight = 4.0;     // per request in flight on the instance
};

class KvPeerChooser {
 public:
  explicit KvPeerChooser(const KvPeerChooserOptions& options);
  ~KvPeerChooser();
  KvPeerChooser(const KvPeerChooser&) = delete;
  KvPeerChooser& operator=(const KvPeerChooser&) = delete;

  // Streams the keys of exactly these instances (base URLs) from now on.
  void SetPeers(const std::vector<std::string>& urls);
  // The index into `peers` of the cheapest (ties go round); -1 when `peers` is empty.
  int Choose(std::span<const int32_t> tokens, std::span<const KvPeerLoad> peers);
  // Prometheus text, names prefixed with `prefix` ("pdserve:prefill_kv"): _synced{peer} and
  // _indexed_pages{peer} gauges, _prompt_pages_total and _cached_pages_total (the chosen
  // instance's pages of each prompt, and those the index showed cached there) and
  // _feed_failures_total.
  std::string MetricsText(std::string_view prefix) const;
  const KvIndex& index() const { return index_; }

 private:
  const KvPeerChooserOptions options_;
  KvIndex index_;
  KvEventFeed feed_;  // after index_: stops before it goes
  std::atomic<uint64_t> round_{0};
  std::atomic<uint64_t> prompt_pages_{0};
  std::atomic<uint64_t> cached_pages_{0};
};

}  // namespace pd::server
