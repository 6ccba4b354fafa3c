// Counters of one messenger side, exported on /metrics: transfers, bytes, failures and a KV
// transfer time histogram. Thread safety: every method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pd::messenger {

class TransferMetrics {
 public:
  static constexpr std::array<double, 12> kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                      0.1,   0.25,   0.5,   1.0,  2.5,   5.0};
  void Started() { started_.fetch_add(1, std::memory_order_relaxed); }
  void Succeeded(double seconds, uint64_t bytes, uint64_t writes);
  void Failed() { failed_.fetch_add(1, std::memory_order_relaxed); }
  void Retried() { retried_.fetch_add(1, std::memory_order_relaxed); }
  // Decode side: a request that found no prefill instance to go to and waited for one.
  void Waited() { waited_.fetch_add(1, std::memory_order_relaxed); }
  // A control message refused before it could act: bad frame, MAC, replay or unknown sender.
  void Rejected() { rejected_.fetch_add(1, std::memory_order_relaxed); }
  // A control message refused as a replay: meant for another instance or an earlier session, a
  // stale session of its sender, or a sequence number seen already. Counted in rejected too.
  void Replayed() {
    Rejected();
    replayed_.fetch_add(1, std::memory_order_relaxed);
  }
  // A control message dropped because too many already waited for the messenger's thread.
  void QueueFull() { queue_full_.fetch_add(1, std::memory_order_relaxed); }
  // A transfer dropped because its decode peer fell silent (prefill side).
  void DroppedSilentPeer() { dropped_silent_.fetch_add(1, std::memory_order_relaxed); }
  // A failed transfer set aside while the fabric still held some of its writes (prefill side).
  void SetAside() { set_aside_.fetch_add(1, std::memory_order_relaxed); }
  void SetActive(int64_t n) { active_.store(n, std::memory_order_relaxed); }
  // Decode side: a request whose KV had landed (so it decodes) but whose metadata write never
  // landed before its slot was released (PrefillDone, peer lost or deadline + grace), or landed
  // still holding the canary (written elsewhere). Neither fails the request.
  void MetadataMissing() { metadata_missing_.fetch_add(1, std::memory_order_relaxed); }
  void MetadataBad() { metadata_bad_.fetch_add(1, std::memory_order_relaxed); }
  // Decode side (--kv-checksum): an attempt whose KV landed but did not match its checksums.
  void ChecksumMismatch() { checksum_mismatch_.fetch_add(1, std::memory_order_relaxed); }
  // Decode side: metadata slots (and pages) held out of use until a late write can no longer land.
  void SetFenced(int64_t n) { fenced_.store(n, std::memory_order_relaxed); }
  // Decode side: pages of ended attempts quarantined until their prefill instance confirmed it
  // stopped writing (PrefillDone), or its keys were revoked (unreachable, or no confirmation
  // within fence_grace_s past the attempt's deadline).
  void SetQuarantinedPages(int64_t n) { quarantined_pages_.store(n, std::memory_order_relaxed); }
  // Decode side: times a prefill instance's keys were revoked (its regions registered anew).
  void KeysRevoked() { keys_revoked_.fetch_add(1, std::memory_order_relaxed); }
  // The domain's count of writes whose immediate nobody claimed in time (ImmCounterTable's
  // expired_arrivals: late writes of abandoned attempts), copied by the messenger thread.
  void SetUnclaimedExpired(uint64_t n) { unclaimed_expired_.store(n, std::memory_order_relaxed); }
  // A completed transfer's KV (metadata excluded): `kv_bytes` over every destination rank (an MLA
  // latent is written whole to each), for `tokens` prompt tokens. kv_bytes / tokens is the bytes
  // per token on the wire (whole pages move, so a partly filled last page counts whole).
  void KvMoved(uint64_t kv_bytes, uint64_t tokens) {
    kv_bytes_.fetch_add(kv_bytes, std::memory_order_relaxed);
    tokens_.fetch_add(tokens, std::memory_order_relaxed);
  }
  // Prefix caching across the split. A completed transfer's pages written (prefill side: posted;
  // decode side: landed), and (decode side) the prompt pages of remote-KV requests found in the
  // decode instance's own prefix cache, which no transfer carried; requests whose uncached part
  // the decode instance computed itself (--local-prefill-max-tokens), no prefill instance involved.
  void PagesTransferred(uint64_t n) { pages_transferred_.fetch_add(n, std::memory_order_relaxed); }
  void PagesCached(uint64_t n) { pages_cached_.fetch_add(n, std::memory_order_relaxed); }
  void LocalPrefill() { local_prefills_.fetch_add(1, std::memory_order_relaxed); }
  // The bytes one token's KV takes over every layer in one whole copy (every KV head once, or one
  // latent row): what one destination replica receives per token.
  void SetBytesPerToken(uint64_t n) { bytes_per_token_.store(n, std::memory_order_relaxed); }
  // Writes posted by (prefill side) local rank `rank`, for ranks below `num_ranks` (SetNumRanks).
  void SetNumRanks(int n) { num_ranks_.store(n, std::memory_order_relaxed); }
  void RankWrites(int rank, uint64_t writes) {
    if (rank >= 0 && static_cast<size_t>(rank) < rank_writes_.size())
      rank_writes_[static_cast<size_t>(rank)].fetch_add(writes, std::memory_order_relaxed);
  }

  // Several NICs (--fabric-nics, prefill side): each NIC's label, set once before the metrics are
  // read; the KV bytes posted on each (re-posted ones included); transfers moved off a failed NIC.
  void SetNics(std::vector<std::string> labels) { nic_labels_ = std::move(labels); }
  void NicBytes(size_t nic, uint64_t bytes) {
    if (nic < nic_bytes_.size()) nic_bytes_[nic].fetch_add(bytes, std::memory_order_relaxed);
  }
  void Rerouted() { rerouted_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t nic_bytes(size_t nic) const { return nic_bytes_.at(nic).load(); }
  uint64_t rerouted() const { return rerouted_.load(); }

  uint64_t started() const { return started_.load(); }
  uint64_t succeeded() const { return succeeded_.load(); }
  uint64_t failed() const { return failed_.load(); }
  uint64_t retried() const { return retried_.load(); }
  uint64_t waited() const { return waited_.load(); }
  uint64_t rejected() const { return rejected_.load(); }
  uint64_t replayed() const { return replayed_.load(); }
  uint64_t queue_full() const { return queue_full_.load(); }
  uint64_t dropped_silent() const { return dropped_silent_.load(); }
  uint64_t set_aside() const { return set_aside_.load(); }
  uint64_t bytes() const { return bytes_.load(); }
  int64_t active() const { return active_.load(); }
  uint64_t metadata_missing() const { return metadata_missing_.load(); }
  uint64_t metadata_bad() const { return metadata_bad_.load(); }
  uint64_t checksum_mismatch() const { return checksum_mismatch_.load(); }
  int64_t fenced() const { return fenced_.load(); }
  int64_t quarantined_pages() const { return quarantined_pages_.load(); }
  uint64_t keys_revoked() const { return keys_revoked_.load(); }
  uint64_t unclaimed_expired() const { return unclaimed_expired_.load(); }
  uint64_t kv_bytes() const { return kv_bytes_.load(); }
  uint64_t tokens() const { return tokens_.load(); }
  uint64_t bytes_per_token() const { return bytes_per_token_.load(); }
  uint64_t pages_transferred() const { return pages_transferred_.load(); }
  uint64_t pages_cached() const { return pages_cached_.load(); }
  uint64_t local_prefills() const { return local_prefills_.load(); }
  uint64_t rank_writes(int rank) const { return rank_writes_.at(static_cast<size_t>(rank)).load(); }

  // Prometheus text with metric names "pdserve:kv_transfer_*" and label role="<role>".
  std::string PrometheusText(const std::string& role) const;

 private:
  std::atomic<uint64_t> started_{0}, succeeded_{0}, failed_{0}, retried_{0}, rejected_{0};
  std::atomic<uint64_t> waited_{0};
  std::atomic<uint64_t> dropped_silent_{0}, replayed_{0}, queue_full_{0}, set_aside_{0};
  std::atomic<uint64_t> metadata_missing_{0}, metadata_bad_{0};
  std::atomic<uint64_t> checksum_mismatch_{0};
  std::atomic<int64_t> fenced_{0};
  std::atomic<int64_t> quarantined_pages_{0};
  std::atomic<uint64_t> keys_revoked_{0};
  std::atomic<uint64_t> unclaimed_expired_{0};
  std::atomic<uint64_t> bytes_{0}, writes_{0};
  std::atomic<int64_t> active_{0};
  std::atomic<uint64_t> kv_bytes_{0}, tokens_{0}, bytes_per_token_{0};
  std::atomic<uint64_t> pages_transferred_{0}, pages_cached_{0}, local_prefills_{0};
  std::atomic<int> num_ranks_{0};
  std::array<std::atomic<uint64_t>, 64> rank_writes_{};                     // kMaxRanks
  std::array<std::atomic<uint64_t>, kBuckets.size() + 1> bucket_counts_{};  // last: +Inf
  std::atomic<uint64_t> sum_us_{0};
  std::vector<std::string> nic_labels_;                // set before any reader
  std::array<std::atomic<uint64_t>, 16> nic_bytes_{};  // kMaxNics
  std::atomic<uint64_t> rerouted_{0};
};

}  // namespace pd::messenger
