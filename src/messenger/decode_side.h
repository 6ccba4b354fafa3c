// The decode side of the KV messenger (docs/architecture.md, disaggregated flow, steps 1, 4, 5
// and 7), as an AsyncEngine: the OpenAI server submits to it exactly as to a colocated engine.
//
// For a request with a prompt of n > 1 tokens it first asks the inner engine how much of the
// prompt its prefix cache holds: when the rest (less the last token) is at most
// local_prefill_max_tokens, the request runs here as an ordinary one (conditional
// disaggregation). Otherwise it asks for a remote-KV request (pages for the whole prompt reserved,
// FCFS as pages free up, held out of scheduling; the leading H pages the prefix cache holds are
// shared from it), takes a slot of the registered metadata buffer, expects ExpectedWrites(...) KV
// page writes for pages [H, end) carrying a fresh imm and one metadata write carrying another, and
// sends a PrefillRequest (the prompt without its last token, first_page = H) to the accepted
// prefill instance choose_prefill picks (by default the one with the least outstanding work;
// kv-aware: where the prompt's prefix is cached, weighed against load), which computes the prompt
// (from its own prefix cache where it can) and writes only pages [H, end). When the KV counter
// fires the request is MarkKvReady'd and its last prompt token runs as its first decode step: it
// does not wait for the metadata, which the prefill instance can write only after its step's last
// MLP and final norm. The metadata slot stays fenced until the metadata lands (then on_metadata),
// the instance answers PrefillDone, is unreachable, or fence_grace_s past the attempt's deadline; a
// metadata that never lands is counted (metadata_missing) and fails nothing, and a request that
// ends first frees its pages as usual. A prefill instance that fails, answers PrefillDone with an
// error or misses the transfer deadline is sent a Cancel; the request is retried once on another
// instance (its pages stay reserved and are rewritten; a fresh imm and a fresh wire id make late
// writes and messages of the first attempt uncountable), else it ends with kError and a message
// that says what happened. Aborts cancel the transfer. The messenger holds a page reference of its
// own for every attempt: an attempt that ends before its writes landed leaves that reference and
// its metadata slot in a fence (quarantine) until the prefill instance confirms it stopped writing
// (PrefillDone, sent only once every write it posted came back) or its keys are revoked, so a late
// write never lands in pages or a slot another request uses. Each prefill instance writes through
// regions registered for it alone; revoking its keys deregisters them and registers them anew (the
// next PrefillRequest carries the new keys), after which the provider rejects whatever that
// instance still has queued. Keys are revoked when the instance is marked down (a send failed or
// was not delivered in time) while it may still write, and when a fence outlives the attempt's
// deadline by fence_grace_s: a live instance that never confirms is marked down rather than
// trusted, so no page goes back on a timer alone. One-token prompts need no transfer and run as
// plain requests.
//
// Thread safety: every public method may be called from any thread. One messenger thread owns
// requests and peers; the domain worker and the engine thread post tasks to it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/trace.h"
#include "engine/async_engine.h"
#include "engine/model_runner.h"
#include "messenger/transfer_metrics.h"
#include "messenger/wire.h"
#include "transfer/domain.h"

namespace pd::messenger {

struct PrefillPeer {
  std::string name;            // for messages, e.g. the bootstrap URL
  std::string fabric_address;  // the prefill instance's endpoint name
};

// A prefill instance a request may be sent to, as DecodeMessengerOptions::choose_prefill sees it.
struct PrefillCandidate {
  std::string_view name;  // PrefillPeer::name (its base URL)
  int outstanding = 0;    // attempts in flight there
};

struct DecodeMessengerOptions {
  std::string instance_name = "decode";
  std::string cluster_secret;
  uint64_t model_hash = 0;  // ModelFingerprint(weights)
  transfer::DomainOptions domain;
  // --fabric-nics, resolved (nics.h): one domain per entry with `domain`'s options bound to that
  // NIC, our KV regions registered in each for every peer and announced in the Hello; NIC 0 also
  // carries the control messages and the metadata. Empty: one domain as `domain` says.
  std::vector<std::string> nics;
  std::vector<PrefillPeer> peers;
  // The peers change at run time (SetPeers, e.g. from etcd discovery): `peers` may be empty.
  bool dynamic_peers = false;
  uint32_t transfer_timeout_ms = 30000;  // per attempt: request sent -> every write landed
  double hello_retry_s = 1.0;            // Hello again to peers that have not answered
  // A control message not delivered within this is cancelled and its peer marked down (a send to
  // a dead peer would otherwise hold up the domain's queue until its op timeout).
  double send_timeout_s = 1.0;
  // Every this often a peer with attempts in flight is sent a Hello (answered like the first):
  // one that died mid-transfer is then noticed when the send fails or is not delivered within
  // send_timeout_s, not at the transfer deadline. 0: no heartbeats.
  double heartbeat_s = 0.25;
  int max_attempts = 2;  // the first try and one retry on another instance
  // A request with no prefill instance to go to (none accepted, or every one tried) while one
  // that accepted us may come back (restarting, draining, greeted again after it was lost) waits
  // up to this long for one (counted in waited), its pages held, instead of failing at once; a
  // restarted instance counts as untried. 0: fail at once. serve's --kv-prefill-wait-s defaults
  // to engine::kDefaultPrefillWaitS; the messenger's own is 0, so that a messenger made in code
  // fails a request as soon as nothing can serve it.
  double prefill_wait_s = 0.0;
  // --kv-checksum (kv_checksum.h): check a CRC32C per layer of the KV that landed before the
  // request is ready; a mismatch fails the attempt (counted in checksum_mismatch). Prefill
  // instances must say the same, else the handshake is refused.
  bool kv_checksum = false;
  // --speculative-config as SpeculativeIdentity (handshake.h) says it; "": none. Prefill instances
  // must say the same, else the handshake is refused naming speculative_config.
  std::string speculative;
  // Metadata slots: transfers in flight at once (with those fenced, below); a request that finds
  // none free fails ResourceExhausted. Give at least the engine's max_pending_requests.
  int max_transfers = 1024;
  // Conditional disaggregation (--local-prefill-max-tokens): a request whose prompt, less what
  // the prefix cache holds (and less its last token), is at most this many tokens runs here as
  // an ordinary request, no prefill instance involved (counted in local_prefills). Otherwise
  // only the pages the prefix cache lacks are asked for and transferred. -1: never (every prompt
  // of 2+ tokens is sent to a prefill instance, the cached pages still left out). serve's and up's
  // flag default is engine::kDefaultLocalPrefillMaxTokens; the messenger's own is -1, so that a
  // messenger made in code moves every prompt's KV unless told otherwise.
  int local_prefill_max_tokens = -1;
  // Which prefill instance an attempt goes to (serve --prefill-routing kv-aware: the one where the
  // prompt costs least, server/kv_choice.h): an index into `candidates` (the instances accepted,
  // not removed and not yet tried for this request), or -1 for the default, the one with the
  // fewest attempts in flight (also used when this is empty). `prefill_tokens` is what the
  // prefill instance runs (the prompt less its last token). Messenger thread; must not block.
  std::function<int(std::span<const int32_t> prefill_tokens,
                    std::span<const PrefillCandidate> candidates)>
      choose_prefill;
  // Told the names of the prefill instances in use (not removed), at Create and whenever SetPeers
  // changes them, e.g. to follow their prefix caches for choose_prefill. Messenger thread (Create's
  // for the first call); must not block.
  std::function<void(const std::vector<std::string>& names)> on_peers;
  // An attempt that ended early (failed, cancelled, aborted) keeps its pages and metadata slot out
  // of use until its prefill instance answers PrefillDone (sent once all its writes came back) or
  // its keys are revoked. If no PrefillDone came this long past the attempt's deadline, the
  // instance is marked down and its keys revoked (its other attempts retry elsewhere), then the
  // pages are freed: a late write can never land in pages another request already uses.
  double fence_grace_s = 5.0;
  // The largest control message received; a prompt's ids are split into PromptChunks that fit
  // both this and what each prefill instance announced in the handshake. At least
  // kMinMessageBytes.
  uint32_t max_message_bytes = kDefaultMessageBytes;
  // Control messages waiting for the messenger thread; beyond, dropped and counted.
  size_t max_queued_messages = 1024;
  // Tests only: consulted before each control message goes to the fabric; an error is treated as
  // that send's local failure (as an encoding or a size error would be). Messenger thread.
  std::function<Status(const Message&)> send_fault;
  // Borrowed, outlives the messenger; null: no trace. Events: "prefill request sent",
  // "kv transfer" (sent -> KV counter fired), "kv checksum" (--kv-checksum: the check), "kv ready",
  // "metadata landed", "attempt failed", "transfer failed".
  Tracer* tracer = nullptr;
  // Called (on the messenger thread, must not block) with each successful transfer's metadata
  // when its write lands: the last prefilled position's hidden state, hidden_size floats. It may
  // come before or after the request is ready (and after it ended): decoding never waits for it.
  // Before a request is sent its metadata slot is filled with a canary; a metadata write that
  // landed while the canary is still there is not delivered but counted (metadata_bad) and
  // logged; one that never lands is counted (metadata_missing). Neither fails the request.
  // Whether or not this is set, a delivered hidden state is also kept on the request in the
  // engine (AsyncEngine::SetPrefilledHidden) while it runs.
  std::function<void(int64_t request_id, const std::vector<float>& last_hidden)> on_metadata;
  // Looks up a peer's current fabric address (e.g. GET its bootstrap URL's /pd/info); may block.
  // Set: a thread of the messenger's own asks it for every peer not refused, every
  // resolve_interval_s; a peer whose address changed (a prefill instance restarted) has its
  // attempts in flight failed over as for a dead peer and is greeted at the new address at once.
  // Empty: a peer's address never changes.
  std::function<Result<std::string>(const PrefillPeer& peer)> resolve_address;
  double resolve_interval_s = 1.0;
};

struct PeerStatus {
  std::string name;
  // kDown: a send to it failed or did not complete in time (dead or unreachable); it is greeted
  // again with back-off and used again once it answers. kDraining: it refused a request because
  // it is shutting down; its transfers in flight go on, it gets nothing new, and it is greeted
  // again once it restarts (a new address or session) or is found down.
  enum class State { kWaiting, kAccepted, kRefused, kDown, kDraining } state = State::kWaiting;
  std::string reason;  // why refused
  int outstanding = 0;
  bool removed = false;       // left out by SetPeers: nothing new is sent to it
  bool was_accepted = false;  // it accepted us once (it may come back when down or draining)
};

// pdserve:kv_prefill_peers{state="accepted|waiting|refused|down|draining|removed"}: how many
// prefill instances are in each state (removed ones count as removed only).
std::string PeersPrometheusText(const std::vector<PeerStatus>& peers);

class DecodeMessenger final : public engine::AsyncEngine {
 public:
  // `runner` is the inner engine's (its KV region is registered for remote writes); it and the
  // inner engine are owned by `inner`, which the messenger owns from now on.
  static Result<std::unique_ptr<DecodeMessenger>> Create(
      const DecodeMessengerOptions& options, engine::ModelRunner& runner,
      std::unique_ptr<engine::AsyncEngine> inner);
  ~DecodeMessenger() override;

  // Waits until every peer answered Hello or `timeout_s` passed. OK when at least one accepted
  // us; FailedPrecondition listing every refusal with its reason; Unavailable when nobody answered
  // ("wrong cluster secret?"). Peers that have not answered keep being greeted.
  Status WaitForPeers(double timeout_s);
  std::vector<PeerStatus> peers() const;
  // Replaces the set of prefill instances (options.dynamic_peers), by name: a new name is added
  // and greeted; a known one at a new fabric address is treated as restarted (its attempts in
  // flight fail over, it is greeted there); one left out gets no new request while its transfers
  // in flight go on (a dead one is noticed by its heartbeats, as today), and is used again if it
  // comes back. Applied on the messenger thread, soon after the call.
  void SetPeers(const std::vector<PrefillPeer>& peers);

  // engine::AsyncEngine
  Result<int64_t> Submit(std::vector<int32_t> prompt_ids, const engine::SamplingParams& sampling,
                         engine::OutputCallback on_output) override;
  void Abort(int64_t request_id) override;
  engine::EngineStats stats() const override;
  const model::ModelConfig& config() const override;
  void Shutdown() override;
  int CachedPrefixTokens(std::span<const int32_t> prompt) const override {
    return inner_->CachedPrefixTokens(prompt);
  }

  const std::string& fabric_address() const;
  const TransferMetrics& metrics() const { return metrics_; }
  int num_active_transfers() const { return static_cast<int>(metrics_.active()); }
  engine::AsyncEngine& inner() { return *inner_; }

 private:
  class Impl;
  DecodeMessenger() = default;

  TransferMetrics metrics_;
  std::unique_ptr<engine::AsyncEngine> inner_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pd::messenger
