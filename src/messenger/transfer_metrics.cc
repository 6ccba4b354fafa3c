#include "messenger/transfer_metrics.h"

#include <cstdio>

namespace pd::messenger {

void TransferMetrics::Succeeded(double seconds, uint64_t bytes, uint64_t writes) {
  succeeded_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  writes_.fetch_add(writes, std::memory_order_relaxed);
  sum_us_.fetch_add(static_cast<uint64_t>(seconds * 1e6), std::memory_order_relaxed);
  size_t b = 0;
  while (b < kBuckets.size() && seconds > kBuckets[b]) ++b;
  bucket_counts_[b].fetch_add(1, std::memory_order_relaxed);
}

std::string TransferMetrics::PrometheusText(const std::string& role) const {
  const std::string l = "{role=\"" + role + "\"}";
  std::string out;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += std::string("# HELP pdserve:") + name + " " + help + "\n# TYPE pdserve:" + name +
           " counter\npdserve:" + name + l + " " + std::to_string(v) + "\n";
  };
  counter("kv_transfers_total", "KV transfers that completed.", succeeded());
  counter("kv_transfer_failures_total", "KV transfers that failed.", failed());
  counter("kv_transfer_retries_total", "KV transfers retried on another prefill instance.",
          retried());
  counter("kv_transfer_waits_total",
          "Requests that found no prefill instance to go to and waited for one "
          "(--kv-prefill-wait-s).",
          waited());
  counter("kv_transfer_bytes_total", "Bytes of KV and metadata written.", bytes());
  counter("kv_transfer_writes_total", "One-sided writes posted.", writes_.load());
  counter("kv_transfer_kv_bytes_total",
          "Bytes of KV pages written by completed transfers, every destination rank's copy "
          "(metadata excluded); divided by kv_transfer_tokens_total: bytes per token on the wire.",
          kv_bytes());
  counter("kv_transfer_tokens_total", "Prompt tokens whose KV completed transfers moved.",
          tokens());
  counter("kv_transfer_pages_total",
          "KV pages (page ids, every layer) that completed transfers wrote: on the decode side, "
          "the prompt pages its prefix cache lacked.",
          pages_transferred());
  counter("kv_transfer_pages_cached_total",
          "Prompt pages of remote-KV requests found in the decode instance's prefix cache, so no "
          "transfer carried them (decode side).",
          pages_cached());
  counter("kv_local_prefills_total",
          "Requests whose uncached prompt part (at most --local-prefill-max-tokens) the decode "
          "instance computed itself, no prefill instance involved (decode side).",
          local_prefills());
  out +=
      "# HELP pdserve:kv_transfer_bytes_per_token KV bytes of one token over every layer, one "
      "whole copy (every KV head once, or one MLA latent row).\n"
      "# TYPE pdserve:kv_transfer_bytes_per_token gauge\npdserve:kv_transfer_bytes_per_token" +
      l + " " + std::to_string(bytes_per_token()) + "\n";
  if (const int n = num_ranks_.load(); n > 0) {
    out +=
        "# HELP pdserve:kv_transfer_rank_writes_total KV page writes posted from each local "
        "rank.\n# TYPE pdserve:kv_transfer_rank_writes_total counter\n";
    for (int r = 0; r < n && static_cast<size_t>(r) < rank_writes_.size(); ++r) {
      out += "pdserve:kv_transfer_rank_writes_total{role=\"" + role + "\",rank=\"" +
             std::to_string(r) + "\"} " + std::to_string(rank_writes(r)) + "\n";
    }
  }
  if (!nic_labels_.empty()) {
    out +=
        "# HELP pdserve:kv_transfer_nic_bytes_total Bytes of KV posted on each NIC (re-posted "
        "writes included).\n# TYPE pdserve:kv_transfer_nic_bytes_total counter\n";
    for (size_t i = 0; i < nic_labels_.size() && i < nic_bytes_.size(); ++i) {
      out += "pdserve:kv_transfer_nic_bytes_total{role=\"" + role + "\",nic=\"" + nic_labels_[i] +
             "\"} " + std::to_string(nic_bytes(i)) + "\n";
    }
    counter("kv_transfer_nic_reroutes_total",
            "KV transfers moved off a NIC that failed under them (their writes re-posted on the "
            "NICs left).",
            rerouted());
  }
  counter("kv_control_messages_rejected_total",
          "Control messages dropped: malformed, unauthenticated, replayed or from an unknown peer.",
          rejected());
  counter("kv_control_messages_replayed_total",
          "Control messages refused as replays: meant for another instance or session, from a "
          "stale session, or a sequence number seen already (also in the rejected total).",
          replayed());
  counter("kv_control_messages_queue_full_total",
          "Control messages dropped because too many already waited for the messenger thread.",
          queue_full());
  counter("kv_transfers_dropped_silent_peer_total",
          "KV transfers dropped (pages freed) because their decode peer sent nothing for "
          "peer_silence_s.",
          dropped_silent());
  counter("kv_transfer_metadata_missing_total",
          "Requests that decoded (their KV landed) but whose metadata write never landed.",
          metadata_missing());
  counter("kv_transfer_metadata_bad_total",
          "Metadata writes that landed with the slot still holding its canary.", metadata_bad());
  counter("kv_transfer_checksum_mismatch_total",
          "Transfer attempts whose KV landed but failed its per-layer CRC32C (--kv-checksum).",
          checksum_mismatch());
  out +=
      "# HELP pdserve:kv_transfer_fenced_slots Metadata slots held until late writes cannot "
      "land.\n"
      "# TYPE pdserve:kv_transfer_fenced_slots gauge\npdserve:kv_transfer_fenced_slots" +
      l + " " + std::to_string(fenced()) + "\n";
  out +=
      "# HELP pdserve:kv_transfer_quarantined_pages KV pages of ended transfers held until no "
      "late write can land.\n"
      "# TYPE pdserve:kv_transfer_quarantined_pages gauge\npdserve:kv_transfer_quarantined_pages" +
      l + " " + std::to_string(quarantined_pages()) + "\n";
  counter("kv_transfers_set_aside_total",
          "Failed transfers whose pages were freed while the fabric still held their writes.",
          set_aside());
  counter("kv_transfer_keys_revoked_total",
          "Times a prefill instance's remote keys were revoked (unreachable or unconfirmed).",
          keys_revoked());
  counter("kv_unclaimed_writes_expired_total",
          "Writes whose immediate no transfer expected (late writes of abandoned attempts), "
          "dropped after a TTL or beyond the table's bound.",
          unclaimed_expired());
  out +=
      "# HELP pdserve:kv_transfers_active KV transfers in flight.\n"
      "# TYPE pdserve:kv_transfers_active gauge\npdserve:kv_transfers_active" +
      l + " " + std::to_string(active()) + "\n";
  out +=
      "# HELP pdserve:kv_transfer_seconds Time from request to last write.\n"
      "# TYPE pdserve:kv_transfer_seconds histogram\n";
  uint64_t cum = 0;
  char le[32];
  for (size_t b = 0; b <= kBuckets.size(); ++b) {
    cum += bucket_counts_[b].load();
    if (b < kBuckets.size()) {
      std::snprintf(le, sizeof(le), "%g", kBuckets[b]);
    } else {
      std::snprintf(le, sizeof(le), "+Inf");
    }
    out += "pdserve:kv_transfer_seconds_bucket{role=\"" + role + "\",le=\"" + le + "\"} " +
           std::to_string(cum) + "\n";
  }
  char sum[64];
  std::snprintf(sum, sizeof(sum), "%.6f", sum_us_.load() / 1e6);
  out += "pdserve:kv_transfer_seconds_sum" + l + " " + sum + "\n";
  out += "pdserve:kv_transfer_seconds_count" + l + " " + std::to_string(succeeded()) + "\n";
  return out;
}

}  // namespace pd::messenger
