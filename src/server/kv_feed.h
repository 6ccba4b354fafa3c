// Keeps a KvIndex fed: one thread per backend long-polls its GET /v1/kv_events
// (kv_events_wire.h): a snapshot first, then event batches, each applied to the index as it
// comes. A request that fails, an answer that does not parse or does not follow on, or an
// instance that tokenizes differently from the router (its tokenizer fingerprint differs) marks
// the backend unsynced (routed by load only) and the thread retries after retry_ms with a fresh
// snapshot. A backend left out of SetBackends has its thread stopped and leaves the index.
//
// Thread safety: SetBackends, Stop and the accessors from any thread.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "server/kv_index.h"

namespace httplib {
class Client;
}  // namespace httplib

namespace pd::server {

struct KvFeedOptions {
  std::string api_key;                 // the instances' API key ("": none)
  uint64_t tokenizer_fingerprint = 0;  // the router's (TokenizerFingerprint)
  int wait_ms = 1000;                  // each long poll's wait for an event
  int retry_ms = 500;                  // after a failure
  int timeout_ms = 10000;              // connect and read, beyond wait_ms
  // false: the listener hands the instances token ids, not text (a decode instance choosing its
  // prefill instance), so how they tokenize does not matter.
  bool check_tokenizer = true;
  std::string log_name = "router";  // who says so in the log
};

class KvEventFeed {
 public:
  // index is borrowed and must outlive the feed.
  KvEventFeed(KvIndex* index, const KvFeedOptions& options);
  ~KvEventFeed();
  // Polls exactly these backends from now on.
  void SetBackends(const std::vector<std::string>& urls) EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);
  uint64_t failures() const { return failures_.load(); }

 private:
  struct Poller;
  void Run(Poller* p);
  // One poll: a batch applied, or the reason the backend is unsynced now.
  Status PollOnce(Poller* p, httplib::Client& client);
  static void StopPoller(Poller* p);

  KvIndex* const index_;
  const KvFeedOptions options_;
  Mutex mu_;
  std::map<std::string, std::unique_ptr<Poller>> pollers_ GUARDED_BY(mu_);
  std::atomic<uint64_t> failures_{0};
};

}  // namespace pd::server
