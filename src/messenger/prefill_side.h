// The prefill side of the KV messenger (docs/architecture.md, disaggregated flow, steps 2, 3, 5
// and 6).
//
// It accepts Hello from decode instances (same model fingerprint, page size, layout and KV dtype,
// else a HelloReply that says what differs) and PrefillRequests from the peers it accepted. Each
// request is validated field by field, then run as a prefill-only engine request. The engine's
// step observer tells the messenger which chunk of which request each runner step computes; the
// messenger's own thread watches the runner's per-layer progress counter and, as soon as layer L
// of a chunk is final, posts that layer's page writes: after a chunk, the pages it completed;
// after the last chunk also the partial last page, so every page is written exactly once per
// layer. After the last chunk it writes the metadata (the last prefilled position's hidden state)
// into the decode side's buffer, once the engine's step has ended. Every page write carries the
// transfer's imm, the metadata write its metadata_imm: the decode side counts the two apart and
// decodes as soon as the last layer's page writes (posted at that layer's progress bump, while
// the step still runs its last MLP) have landed. When every write has
// completed the source pages go back to the engine and PrefillDone goes to the decode side; a
// failure, a Cancel or the request's deadline stops the writes and, once every write already
// posted has come back from the fabric (completed, failed or flushed: Domain reports a cancelled
// transfer no sooner), frees the pages and reports PrefillDone with the error. PrefillDone thus
// always means that no write of that transfer can land any more.
//
//   auto engine = Engine::Create(weights, options);
//   auto messenger = PrefillMessenger::Create(opts, engine->runner());
//   engine->disagg_hooks()->SetStepObserver(messenger->step_observer());
//   auto async = AsyncEngine::Create(std::move(engine), {});
//   messenger->Start(async.get());   ... messenger->Stop() before the AsyncEngine goes.
//
// Thread safety: public methods may be called from any thread. One messenger thread owns all
// transfer state; the domain worker and the engine thread only post tasks to it.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/trace.h"
#include "engine/async_engine.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "messenger/transfer_metrics.h"
#include "messenger/wire.h"
#include "transfer/domain.h"
#include "transfer/fault_injection.h"

namespace pd::messenger {

struct PrefillMessengerOptions {
  std::string instance_name = "prefill";
  std::string cluster_secret;      // HMAC key of every control message
  uint64_t model_hash = 0;         // ModelFingerprint(weights)
  transfer::DomainOptions domain;  // provider, node; on_message is set by the messenger
  // --fabric-nics, resolved (nics.h): one domain per entry, each with `domain`'s options bound to
  // that NIC. NIC 0 carries the control messages, metadata and checksum writes; the KV writes of
  // every request stripe over all NICs, round-robin over those in rotation. A KV write that fails
  // on NIC k >= 1 takes k out of rotation towards that decode instance (kNicDownS) and moves its
  // transfer to a fresh imm (Reroute): every KV write of it is re-posted on the NICs left. Empty:
  // one domain as `domain` says.
  std::vector<std::string> nics;
  // Tests only: nic_faults[i] is injected into NIC i >= 1 (domain.faults stays with NIC 0).
  std::vector<std::shared_ptr<transfer::FaultInjector>> nic_faults;
  int max_transfers = 256;            // in flight; beyond: PrefillDone ResourceExhausted
  uint32_t max_deadline_ms = 120000;  // a request's deadline is capped to this
  // A transfer whose decode peer has sent nothing (Hello, heartbeat, request, Cancel) for this
  // long is failed: its engine request aborted (queued or running), its pages freed, and counted
  // in kv_transfers_dropped_silent_peer_total. Decode instances Hello every
  // DecodeMessengerOptions::heartbeat_s (0.25 s) while they have attempts in flight, so the default
  // is 8 heartbeats. 0: off (only the request's deadline applies).
  double peer_silence_s = 2.0;
  // The largest control message received (announced in the handshake: decode instances split a
  // prompt's ids to fit); at least kMinMessageBytes.
  uint32_t max_message_bytes = kDefaultMessageBytes;
  // Prompts whose ids are still arriving (PromptChunks): at most this many bytes of ids held at
  // once (beyond: PrefillDone ResourceExhausted), each prompt complete within prompt_timeout_s of
  // its first message (else dropped, PrefillDone DeadlineExceeded).
  uint64_t max_partial_prompt_bytes = 64u << 20;
  double prompt_timeout_s = 10.0;
  // Control messages waiting for the messenger thread; beyond, dropped and counted.
  size_t max_queued_messages = 1024;
  // --kv-checksum (kv_checksum.h): send a CRC32C per layer of the KV written. Decode instances must
  // say the same in their Hello, else the handshake is refused.
  bool kv_checksum = false;
  // --speculative-config as SpeculativeIdentity (handshake.h) says it; "": none. Decode instances
  // must say the same, else the handshake is refused naming speculative_config.
  std::string speculative;
  // The engine's draft KV region (DisaggHooks::DraftKvRunner; borrowed, outlives the messenger;
  // null: none). Its rank regions are registered beside the target's and every transfer writes
  // the draft KV of its pages too, once the engine's final output for the request says the
  // drafter has caught up on the prompt (KvFormat::draft_kv; decode instances must have the same
  // region, else the handshake is refused naming draft_kv).
  engine::ModelRunner* draft_kv = nullptr;
  // A failed transfer waits for every write it posted to come back before it frees its pages
  // and answers PrefillDone. Writes a stalled decode instance holds (SIGSTOP, a partition) may
  // not come back for long: after this many seconds the transfer is set aside, its pages and
  // slot freed (what the fabric may still send from them lands only in pages its decode
  // instance keeps quarantined) and it stops counting as active, but its PrefillDone still waits
  // for the last write to come back: it is sent then, or never (the decode instance revokes this
  // instance's keys instead). Counted in kv_transfers_set_aside_total.
  double drain_timeout_s = 2.0;
  // Borrowed, outlives the messenger; null: no trace. Events: "post writes" per request and
  // layer, "write layer" (post -> completion), "post metadata", "transfer", "transfer failed".
  Tracer* tracer = nullptr;
};

class PrefillMessenger {
 public:
  // Opens a fabric domain and registers the runner's KV region (the runner must outlive the
  // messenger).
  static Result<std::unique_ptr<PrefillMessenger>> Create(const PrefillMessengerOptions& options,
                                                          engine::ModelRunner& runner);
  ~PrefillMessenger();
  PrefillMessenger(const PrefillMessenger&) = delete;
  PrefillMessenger& operator=(const PrefillMessenger&) = delete;

  // For DisaggHooks::SetStepObserver (before the engine is handed to its AsyncEngine).
  engine::StepObserver step_observer();
  // Starts the messenger thread; `engine` must outlive Stop().
  void Start(engine::AsyncEngine* engine);
  // Joins the thread, closes the fabric domain (no write of ours can land afterwards), then gives
  // every transfer's pages back and aborts its engine request. Idempotent. Once it returned the
  // runner's KV regions may be freed before the messenger is destroyed.
  void Stop();
  // Graceful drain: from now on every new PrefillRequest is answered PrefillDone(kUnavailable,
  // kDrainingMessage) before any work, so decode instances send it elsewhere; transfers already
  // accepted go on (num_active_transfers() says how many).
  void BeginDrain();

  const std::string& fabric_address() const;
  const KvFormat& format() const { return format_; }
  const TransferMetrics& metrics() const { return metrics_; }
  int num_active_transfers() const { return static_cast<int>(metrics_.active()); }
  int num_peers() const { return num_peers_.load(); }
  int num_nics() const;

 private:
  class Impl;
  explicit PrefillMessenger(KvFormat format);

  KvFormat format_;
  TransferMetrics metrics_;
  std::atomic<int> num_peers_{0};
  std::unique_ptr<Impl> impl_;
};

}  // namespace pd::messenger
