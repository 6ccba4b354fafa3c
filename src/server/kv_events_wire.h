// GET /v1/kv_events: an instance's prefix-cache keys for KV-aware routing (engine/kv_events.h),
// as a long poll. Query: epoch and after (the last batch's; absent or 0: a snapshot), wait_ms (how
// long to wait for an event, at most kMaxKvEventsWaitMs) and max_events. Answer (JSON):
//   {"epoch": E, "root": R, "page_size": P, "tokenizer": T, "snapshot": true|false, "seq": S,
//    "keys": [K, ...],                        (snapshot: every key held after event S)
//    "events": [[seq, 1 stored | 0 removed, K], ...]}   (otherwise: the events after `after`)
// Keys, roots and fingerprints are unsigned 64-bit integers; T is TokenizerFingerprint
// (prompt_tokens.h), so a router can check it tokenizes as the instance does. The endpoint needs
// the API key like /v1/* does.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "engine/kv_events.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace pd::server {

inline constexpr int kMaxKvEventsWaitMs = 5000;

struct KvEventsReply {
  engine::KvEventBatch batch;
  uint64_t tokenizer = 0;
};

std::string KvEventsJson(const KvEventsReply& reply);
// InvalidArgument naming what is missing or malformed.
Result<KvEventsReply> ParseKvEventsJson(const std::string& body);

// Answers one GET /v1/kv_events from `log` (the HTTP thread waits in the poll).
void HandleKvEvents(engine::KvEventLog* log, uint64_t tokenizer_fingerprint,
                    const httplib::Request& req, httplib::Response& res);

}  // namespace pd::server
