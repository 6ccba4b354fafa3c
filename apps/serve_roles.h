// Disaggregation roles of `pdserve serve` (the hooks apps/cmd_serve.cc calls):
//   --role prefill                      prefill instance: /health, /metrics, /pd/info (its fabric
//                                       address, for decode instances to bootstrap from),
//                                       /v1/kv_events (its prefix cache's keys, kv_events_wire.h)
//   --role decode --prefill-peers URLs  decode instance: the OpenAI API, requests through the
//                                       decode messenger
//   --discovery etcd://H:P --cluster C  register in etcd and find the prefill instances there
//                                       (cluster/discovery.h) instead of --prefill-peers
//   --cluster-secret-file FILE          HMAC key of every control message (same on every instance);
//                                       required by the prefill and decode roles, unless
//   --insecure-no-secret                runs them without one, only with the fabric endpoint on
//                                       loopback (--fabric-node 127.x.x.x or ::1, or shm)
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "cluster/discovery.h"
#include "common/status.h"
#include "common/trace.h"
#include "engine/async_engine.h"
#include "engine/engine.h"
#include "model/weights.h"
#include "server/http_transport.h"
#include "server/kv_choice.h"

namespace pd::apps {

struct RoleFlags {
  std::string role = "colocated";  // colocated | prefill | decode
  std::string prefill_peers;       // decode: comma-separated base URLs of prefill instances
  std::string cluster_secret_file;
  bool insecure_no_secret = false;  // no secret: only on loopback
  std::string fabric_provider = "tcp;ofi_rxm";
  std::string fabric_node = "127.0.0.1";  // local address the fabric endpoint binds
  std::string fabric_nics;  // --fabric-nics auto|LIST: one fabric domain per NIC; empty: one
  int kv_transfer_timeout_ms = 30000;
  double kv_prefill_wait_s = engine::kDefaultPrefillWaitS;  // decode: --kv-prefill-wait-s
  uint32_t control_message_bytes = 256u << 10;              // largest control message received
  double peer_wait_s = 60.0;     // decode: how long to wait for prefill instances at start
  double peer_silence_s = 2.0;   // prefill: drop transfers of a decode peer silent this long
  double kv_wait_warm_ms = 2.0;  // decode: cache-warming period while waiting for KV; 0: off
  // decode: a prompt whose uncached part is at most this many tokens is computed here (-1: never)
  int local_prefill_max_tokens = engine::kDefaultLocalPrefillMaxTokens;
  bool kv_checksum = false;       // --kv-checksum: a CRC32C per layer of the KV, checked on decode
  std::string fault_inject;       // hidden --fault-inject (tests): transfer::ParseFaultRules
  double drain_timeout_s = 30.0;  // SIGTERM: how long work in flight may take to finish
  std::string trace_file;         // --trace: Chrome trace-event JSON written at shutdown
  int64_t trace_max_events = static_cast<int64_t>(TracerOptions{}.max_events);  // its cap
  Tracer* tracer = nullptr;           // made by RunServe from trace_file; given to the messengers
  cluster::DiscoveryFlags discovery;  // --discovery: etcd instead of --prefill-peers
  int tensor_parallel_size = 1;       // copied from serve's flag: registered with --discovery
  // decode: --prefill-routing least-loaded | kv-aware (where the prompt's prefix is cached on a
  // prefill instance, weighed against load) and kv-aware's weights (server/kv_choice.h).
  std::string prefill_routing = "least-loaded";
  double prefill_kv_compute_weight = 1.0;
  double prefill_kv_load_weight = 4.0;
  // Set by RunServe: serve's --api-key (prefill: required on GET /v1/kv_events; decode: sent to
  // the prefill instances' /v1/kv_events), its tokenizer's fingerprint and the engine's
  // prefix-cache key log (prefill: published at GET /v1/kv_events).
  std::string api_key;
  uint64_t tokenizer_fingerprint = 0;
  engine::KvEventLog* kv_events = nullptr;
  // messenger::SpeculativeIdentity of --speculative-config (set by RunServe): both sides of the
  // handshake must say the same.
  std::string speculative;
};

// A role's engine and, for a decode instance with --discovery, the watch that feeds its messenger
// the cluster's prefill instances (declared last: it stops before the engine goes).
struct RoleEngine {
  std::unique_ptr<engine::AsyncEngine> engine;
  std::unique_ptr<cluster::MemberWatch> prefill_watch;
  // decode --prefill-routing kv-aware: the messenger's choice of prefill instance (shared with it),
  // for /metrics.
  std::shared_ptr<server::KvPeerChooser> prefill_chooser;
};

void AddRoleFlags(CLI::App* app, RoleFlags* flags);
// Also the secret rule: a prefill or decode role needs --cluster-secret-file, or
// --insecure-no-secret with the fabric endpoint on loopback; each refusal names the flag and why.
Status ValidateRoleFlags(const RoleFlags& flags);
// Whether a fabric endpoint bound to `node` with `provider` is reachable from this host only:
// shm, or a loopback address (127.0.0.0/8, ::1, localhost). An empty node binds every interface.
bool FabricIsLoopbackOnly(const std::string& provider, const std::string& node);

// Runs a prefill instance until SIGINT/SIGTERM (which the caller has blocked; SIGTERM drains
// first: new PrefillRequests refused, transfers in flight finished within drain_timeout_s);
// returns the exit code.
// Its bootstrap HTTP server has the same limits as every other (`http`).
int RunPrefillRole(const RoleFlags& flags, const model::ModelWeights& weights,
                   std::unique_ptr<engine::Engine> engine, const engine::AsyncEngineOptions& ao,
                   const std::string& host, int port, const server::HttpLimits& http);

// The engine the OpenAI server runs on: a plain AsyncEngine (colocated) or a DecodeMessenger
// that has completed its handshake with the prefill instances (decode).
Result<RoleEngine> CreateRoleEngine(const RoleFlags& flags, const model::ModelWeights& weights,
                                    std::unique_ptr<engine::Engine> engine,
                                    const engine::AsyncEngineOptions& ao);

// The cluster secret (--cluster-secret-file; "" with --insecure-no-secret).
Result<std::string> ReadClusterSecret(const RoleFlags& flags);
// --discovery: registers this instance (`role`, its HTTP host and bound port, `fabric_address`,
// the model's fingerprint) in etcd; null without --discovery.
Result<std::unique_ptr<cluster::Registration>> RegisterRole(const RoleFlags& flags,
                                                            const model::ModelWeights& weights,
                                                            const std::string& host, int port,
                                                            const std::string& fabric_address);

std::string HexEncode(const std::string& bytes);
Result<std::string> HexDecode(const std::string& hex);

}  // namespace pd::apps
