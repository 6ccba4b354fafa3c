// The prefill and decode roles of `pdserve serve` (see serve_roles.h). No subcommand is
// registered here: cmd_serve.cc calls these hooks.
#include <arpa/inet.h>
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "apps/discovery_flags.h"
#include "apps/serve_roles.h"
#include "common/file_util.h"
#include "common/log.h"
#include "engine/kv_events.h"
#include "messenger/decode_side.h"
#include "messenger/handshake.h"
#include "messenger/nics.h"
#include "messenger/prefill_side.h"
#include "server/auth.h"
#include "server/drain.h"
#include "server/kv_events_wire.h"
#include "server/openai_protocol.h"
#include "transfer/fault_injection.h"

namespace pd::apps {

void AddRoleFlags(CLI::App* app, RoleFlags* f) {
  app->add_option("--role", f->role, "colocated | prefill | decode")->capture_default_str();
  app->add_option("--prefill-peers", f->prefill_peers,
                  "decode role: prefill instances' base URLs, comma-separated");
  app->add_option("--cluster-secret-file", f->cluster_secret_file,
                  "file whose contents authenticate control messages between instances (required "
                  "by --role prefill|decode; `pdserve up` makes one per deployment)");
  app->add_flag("--insecure-no-secret", f->insecure_no_secret,
                "run --role prefill|decode without a cluster secret: anyone who reaches the "
                "fabric endpoint can then send control messages, so only allowed with the "
                "endpoint on loopback");
  app->add_option("--fabric-provider", f->fabric_provider, "libfabric provider")
      ->capture_default_str();
  app->add_option("--fabric-node", f->fabric_node, "address the fabric endpoint binds")
      ->capture_default_str();
  app->add_option("--fabric-nics", f->fabric_nics,
                  "prefill and decode roles: the NICs the KV messenger uses, one fabric domain "
                  "each: auto (the RDMA NICs nearest this process's CPUs that the provider "
                  "offers; none: the one default interface) or a comma-separated list of local "
                  "addresses (tcp) or provider domain names (mlx5_0). The first also carries the "
                  "control messages (it replaces --fabric-node); KV writes stripe over all and a "
                  "NIC that fails is taken out of rotation, its writes re-posted on the others");
  app->add_option("--kv-transfer-timeout-ms", f->kv_transfer_timeout_ms,
                  "deadline of one KV transfer attempt")
      ->capture_default_str();
  app->add_option("--kv-prefill-wait-s", f->kv_prefill_wait_s,
                  "decode role: how long a request with no prefill instance to go to (every one "
                  "restarting, draining or lost) waits for one that accepted this instance to "
                  "come back before it fails; 0: fail at once")
      ->capture_default_str();
  app->add_option("--control-message-bytes", f->control_message_bytes,
                  "largest control message this instance receives (announced in the handshake; "
                  "a prompt's ids travel in as many messages as they need); at least 4096")
      ->capture_default_str();
  app->add_option("--peer-wait-s", f->peer_wait_s,
                  "decode role: how long to wait for prefill instances at start")
      ->capture_default_str();
  app->add_option("--peer-silence-s", f->peer_silence_s,
                  "prefill role: drop (abort, free the pages of) the requests of a decode instance "
                  "that has sent nothing, not even a heartbeat, for this long; 0: off")
      ->capture_default_str();
  app->add_option("--kv-wait-warm-ms", f->kv_wait_warm_ms,
                  "decode role: while requests wait for their KV and nothing else runs, read the "
                  "weights and the arrived KV back into the caches this often (only for models "
                  "whose weights fit in 64 MiB); 0: off")
      ->capture_default_str();
  app->add_option("--local-prefill-max-tokens", f->local_prefill_max_tokens,
                  "decode role: a request whose prompt, less what this instance's prefix cache "
                  "holds, is at most this many tokens is computed here, no prefill instance "
                  "involved (conditional disaggregation: up to 64 tokens this costs the requests "
                  "decoding beside it no measurable time and saves the round trip and the "
                  "transfer, see docs/prefix-caching.md); -1: only prompts whose every page "
                  "before the last token is cached")
      ->check(CLI::Range(-1, 1 << 30))
      ->capture_default_str();
  app->add_option("--prefill-routing", f->prefill_routing,
                  "decode role: which prefill instance computes a prompt: least-loaded (fewest "
                  "transfers in flight) or kv-aware (the one whose prefix cache holds most of "
                  "the prompt, weighed against load, from their GET /v1/kv_events)")
      ->check(CLI::IsMember({"least-loaded", "kv-aware"}))
      ->capture_default_str();
  app->add_option("--prefill-kv-compute-weight", f->prefill_kv_compute_weight,
                  "decode role, --prefill-routing kv-aware: cost of one prompt page the prefill "
                  "instance lacks")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_option("--prefill-kv-load-weight", f->prefill_kv_load_weight,
                  "decode role, --prefill-routing kv-aware: cost of one transfer in flight on the "
                  "prefill instance")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_flag("--kv-checksum", f->kv_checksum,
                "prefill and decode roles: send (prefill) and check (decode, before the request "
                "decodes) a CRC32C per layer of the KV each transfer moves; a mismatch fails the "
                "attempt, which is retried on another prefill instance. Every instance of a "
                "deployment must say the same");
  // Tests only: faults injected into this instance's fabric domain (transfer/fault_injection.h).
  app->add_option("--fault-inject", f->fault_inject)->group("");
  AddDiscoveryFlags(app, &f->discovery);
  app->add_option("--drain-timeout-s", f->drain_timeout_s,
                  "on SIGTERM: refuse new work (503 with Retry-After; a prefill instance refuses "
                  "new KV transfers), let the work in flight finish for at most this long, end "
                  "what is left with an error, exit 0 (SIGINT stops at once)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_option("--trace", f->trace_file,
                  "write a Chrome trace-event JSON (chrome://tracing, Perfetto) here at shutdown");
  app->add_option("--trace-max-events", f->trace_max_events,
                  "--trace keeps this many events (the first ones) and counts the rest as "
                  "dropped (the file's otherData.dropped_events); each takes a few hundred bytes")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
}

Status ValidateRoleFlags(const RoleFlags& f) {
  if (f.role != "colocated" && f.role != "prefill" && f.role != "decode") {
    return InvalidArgument("--role must be colocated, prefill or decode, got '" + f.role + "'");
  }
  if (f.role == "decode" && f.prefill_peers.empty() && !f.discovery.enabled()) {
    return InvalidArgument(
        "--role decode needs --prefill-peers URL[,URL...] or --discovery etcd://HOST:PORT");
  }
  if (f.role == "colocated" && f.discovery.enabled()) {
    return InvalidArgument(
        "--discovery is for --role prefill|decode (a colocated instance has "
        "no peers; put a router in front of several with --decode)");
  }
  RETURN_IF_ERROR(cluster::ValidateDiscoveryFlags(f.discovery));
  if (!(f.drain_timeout_s >= 0)) return InvalidArgument("--drain-timeout-s must be >= 0");
  if (f.role != "decode" && !f.prefill_peers.empty()) {
    return InvalidArgument("--prefill-peers is only for --role decode");
  }
  if (f.role != "decode" && f.prefill_routing != "least-loaded") {
    return InvalidArgument("--prefill-routing is only for --role decode");
  }
  if (f.kv_transfer_timeout_ms <= 0) {
    return InvalidArgument("--kv-transfer-timeout-ms must be positive");
  }
  if (!(f.kv_prefill_wait_s >= 0)) return InvalidArgument("--kv-prefill-wait-s must be >= 0");
  if (!(f.peer_silence_s >= 0)) return InvalidArgument("--peer-silence-s must be >= 0");
  if (f.control_message_bytes < messenger::kMinMessageBytes) {
    return InvalidArgument("--control-message-bytes must be at least " +
                           std::to_string(messenger::kMinMessageBytes) + ", got " +
                           std::to_string(f.control_message_bytes));
  }
  if (!(f.kv_wait_warm_ms >= 0)) return InvalidArgument("--kv-wait-warm-ms must be >= 0");
  if (!f.fabric_nics.empty() && f.fabric_nics != "auto") {
    RETURN_IF_ERROR(messenger::ResolveNics(f.fabric_nics, f.fabric_provider).status());
  }
  if (f.role == "colocated" && !f.fabric_nics.empty()) {
    return InvalidArgument(
        "--fabric-nics is for --role prefill|decode (a colocated instance "
        "moves no KV)");
  }
  if (auto rules = transfer::ParseFaultRules(f.fault_inject); !rules.ok()) {
    return rules.status().WithContext("--fault-inject");
  }
  if (f.role == "colocated") return OkStatus();
  if (!f.cluster_secret_file.empty() && f.insecure_no_secret) {
    return InvalidArgument("give either --cluster-secret-file or --insecure-no-secret, not both");
  }
  if (f.cluster_secret_file.empty() && !f.insecure_no_secret) {
    return InvalidArgument(
        "--role " + f.role +
        " needs --cluster-secret-file FILE (the same secret on every instance; `pdserve up` makes "
        "one per deployment): without it anyone who reaches the fabric endpoint can send "
        "control messages. For a test on one host, --insecure-no-secret runs without one while "
        "the fabric endpoint is on loopback");
  }
  if (f.insecure_no_secret && !FabricIsLoopbackOnly(f.fabric_provider, f.fabric_node)) {
    return InvalidArgument(
        "--insecure-no-secret is only allowed with the fabric endpoint on loopback, but "
        "--fabric-node '" +
        f.fabric_node + "' (provider " + f.fabric_provider +
        ") is reachable from other hosts: give --cluster-secret-file FILE, or --fabric-node "
        "127.0.0.1");
  }
  if (f.insecure_no_secret && !f.fabric_nics.empty()) {
    // Control messages travel on the first NIC: it must be loopback like --fabric-node.
    auto nics = f.fabric_nics == "auto"
                    ? Result<std::vector<std::string>>(std::vector<std::string>{"auto"})
                    : messenger::ResolveNics(f.fabric_nics, f.fabric_provider);
    for (const std::string& nic : nics.ok() ? *nics : std::vector<std::string>{}) {
      if (!FabricIsLoopbackOnly(f.fabric_provider, nic)) {
        return InvalidArgument(
            "--insecure-no-secret is only allowed with the fabric endpoints "
            "on loopback, but --fabric-nics names '" +
            nic + "': give --cluster-secret-file FILE");
      }
    }
  }
  return OkStatus();
}

bool FabricIsLoopbackOnly(const std::string& provider, const std::string& node) {
  if (provider == "shm") return true;
  if (node == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, node.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, node.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;  // empty (every interface), a name, or an interface
}

std::string HexEncode(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

Result<std::string> HexDecode(const std::string& hex) {
  if (hex.size() % 2 != 0) return InvalidArgument("odd-length hex string");
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("not a hex string");
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}

Result<std::string> ReadClusterSecret(const RoleFlags& f) {
  if (f.cluster_secret_file.empty()) {  // ValidateRoleFlags allowed it: loopback only
    PD_LOG_WARN(
        "--insecure-no-secret: control messages are checked for integrity only (the fabric "
        "endpoint is on loopback)");
    return std::string();
  }
  auto text = ReadFileToString(f.cluster_secret_file);
  if (!text.ok()) return text.status().WithContext("--cluster-secret-file");
  std::string s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty())
    return InvalidArgument("--cluster-secret-file " + f.cluster_secret_file + " is empty");
  return s;
}

Result<std::unique_ptr<cluster::Registration>> RegisterRole(const RoleFlags& flags,
                                                            const model::ModelWeights& weights,
                                                            const std::string& host, int port,
                                                            const std::string& fabric_address) {
  if (!flags.discovery.enabled()) return std::unique_ptr<cluster::Registration>();
  ASSIGN_OR_RETURN(std::string secret, ReadClusterSecret(flags));
  cluster::Member m;
  m.role = flags.role;
  ASSIGN_OR_RETURN(m.http_url, cluster::AdvertiseUrl(flags.discovery, host, port));
  m.fabric_address = HexEncode(fabric_address);
  m.model_fingerprint = std::to_string(messenger::ModelFingerprint(weights));
  m.tensor_parallel_size = flags.tensor_parallel_size;
  auto nics = messenger::ResolveNics(flags.fabric_nics, flags.fabric_provider);
  if (nics.ok() && !nics->empty()) {
    m.nics = *nics;
  } else if (!flags.fabric_node.empty()) {
    m.nics.push_back(flags.fabric_node);
  }
  return cluster::RegisterMember(flags.discovery, std::move(m), secret);
}

namespace {

transfer::DomainOptions DomainFor(const RoleFlags& f) {
  transfer::DomainOptions d;
  d.provider = f.fabric_provider;
  d.node = f.fabric_node;
  // A write or send that makes no progress this long fails (and stops blocking the queue behind
  // it): a dead peer is noticed in seconds rather than at the transfer deadline.
  d.op_timeout_s = 3.0;
  if (!f.fault_inject.empty()) {
    d.faults = std::make_shared<transfer::FaultInjector>();
    const auto rules = transfer::ParseFaultRules(f.fault_inject);  // ValidateRoleFlags checked it
    for (const transfer::FaultRule& rule : rules.value()) {
      PD_LOG_WARN("fault injection armed on this instance's fabric domain: {}",
                  transfer::FaultRuleToString(rule));
      d.faults->Arm(rule);
    }
  }
  return d;
}

// How long a draining prefill instance keeps refusing PrefillRequests once its transfers ended.
constexpr double kPrefillDrainLingerS = 0.25;

std::string EngineMetrics(const engine::EngineStats& s, const std::string& role) {
  const std::string l = "{role=\"" + role + "\"}";
  std::ostringstream o;
  o << "# TYPE pdserve:kv_cache_usage_perc gauge\npdserve:kv_cache_usage_perc" << l << " "
    << s.kv_cache_usage() << "\n# TYPE pdserve:num_requests_running gauge\n"
    << "pdserve:num_requests_running" << l << " " << s.num_running
    << "\n# TYPE pdserve:num_requests_waiting gauge\npdserve:num_requests_waiting" << l << " "
    << s.num_waiting << "\n# TYPE pdserve:kv_free_pages gauge\npdserve:kv_free_pages" << l << " "
    << s.num_free_pages << "\n# TYPE pdserve:kv_total_pages gauge\npdserve:kv_total_pages" << l
    << " " << s.num_total_pages << "\n# TYPE pdserve:prefix_cache_queries_total counter\n"
    << "pdserve:prefix_cache_queries_total" << l << " " << s.prefix_cache_queries
    << "\n# TYPE pdserve:prefix_cache_hits_total counter\npdserve:prefix_cache_hits_total" << l
    << " " << s.prefix_cache_hits << "\n";
  return o.str();
}

sigset_t StopSignals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  return s;
}

}  // namespace

int RunPrefillRole(const RoleFlags& flags, const model::ModelWeights& weights,
                   std::unique_ptr<engine::Engine> eng, const engine::AsyncEngineOptions& ao,
                   const std::string& host, int port, const server::HttpLimits& limits) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "serve: %s\n", s.ToString().c_str());
    return 1;
  };
  auto secret = ReadClusterSecret(flags);
  if (!secret.ok()) return fail(secret.status());
  messenger::PrefillMessengerOptions mo;
  mo.instance_name = "prefill@" + host + ":" + std::to_string(port);
  mo.cluster_secret = *secret;
  mo.model_hash = messenger::ModelFingerprint(weights);
  mo.domain = DomainFor(flags);
  auto nics = messenger::ResolveNics(flags.fabric_nics, flags.fabric_provider);
  if (!nics.ok()) return fail(nics.status());
  mo.nics = *nics;
  mo.max_transfers = ao.max_pending_requests;
  mo.max_message_bytes = flags.control_message_bytes;
  // A decode instance's deadline is capped at this: never below what it asks for.
  mo.max_deadline_ms =
      std::max(mo.max_deadline_ms, static_cast<uint32_t>(flags.kv_transfer_timeout_ms));
  mo.peer_silence_s = flags.peer_silence_s;
  mo.kv_checksum = flags.kv_checksum;
  mo.speculative = flags.speculative;
  mo.tracer = flags.tracer;
  engine::DisaggHooks* hooks = eng->disagg_hooks();
  if (hooks == nullptr) return fail(FailedPrecondition("the engine runs no prefill-only requests"));
  auto messenger = messenger::PrefillMessenger::Create(mo, eng->runner());
  if (!messenger.ok()) return fail(messenger.status().WithContext("fabric"));
  hooks->SetStepObserver((*messenger)->step_observer());
  auto async = engine::AsyncEngine::Create(std::move(eng), ao);
  if (!async.ok()) return fail(async.status());
  (*messenger)->Start(async->get());

  server::LimitedHttpServer http(limits);
  const messenger::KvFormat fmt = (*messenger)->format();
  nlohmann::json info = {
      {"role", "prefill"},
      {"fabric_address", HexEncode((*messenger)->fabric_address())},
      {"model_hash", std::to_string(fmt.model_hash)},
      {"page_size", fmt.page_size},
      {"kv_layout", std::string(engine::KvLayoutName(static_cast<engine::KvLayout>(fmt.layout)))},
      {"num_layers", fmt.num_layers}};
  std::atomic<bool> draining{false};
  http.Get("/health", [&draining](const httplib::Request&, httplib::Response& res) {
    if (draining) {
      res.status = 503;
      return res.set_content("draining", "text/plain");
    }
    res.set_content("OK", "text/plain");
  });
  http.Get("/pd/info", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(info.dump(), "application/json");
  });
  engine::AsyncEngine* a = async->get();
  messenger::PrefillMessenger* m = messenger->get();
  http.Get("/metrics", [a, m, &http](const httplib::Request&, httplib::Response& res) {
    res.set_content(EngineMetrics(a->stats(), "prefill") + m->metrics().PrometheusText("prefill") +
                        http.RefusedMetricsText(),
                    "text/plain; version=0.0.4");
  });
  if (flags.kv_events != nullptr) {  // decode instances choosing a prefill instance by its cache
    http.Get("/v1/kv_events", [&flags](const httplib::Request& req, httplib::Response& res) {
      if (!flags.api_key.empty() &&
          !server::BearerMatches(req.get_header_value("Authorization"), flags.api_key)) {
        res.status = 401;
        return res.set_content(
            server::ErrorBody(401, req.has_header("Authorization")
                                       ? "invalid API key"
                                       : "missing 'Authorization: Bearer <api key>' header"),
            "application/json");
      }
      server::HandleKvEvents(flags.kv_events, flags.tokenizer_fingerprint, req, res);
    });
  }
  int bound = port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
  if (bound < 0) return fail(Unavailable("cannot listen on " + host + ":" + std::to_string(port)));
  std::thread listener([&] { http.listen_after_bind(); });
  // Until the server runs, http.stop() is a no-op and the listener would never return: a stop
  // signal right after the line below must find it running.
  if (!http.WaitListening(std::chrono::seconds(10))) {
    listener.detach();  // the process exits next; stop() cannot reach a server not running
    return fail(Internal("the prefill instance's HTTP threads did not start"));
  }
  auto registration = RegisterRole(flags, weights, host, bound, m->fabric_address());
  if (!registration.ok()) {
    http.stop();
    listener.join();
    (*messenger)->Stop();
    (*async)->Shutdown();
    return fail(registration.status().WithContext("--discovery"));
  }
  std::printf("pdserve: prefill instance on http://%s:%d (fabric %s)\n", host.c_str(), bound,
              flags.fabric_provider.c_str());
  std::fflush(stdout);
  sigset_t stop = StopSignals();
  int sig = 0;
  sigwait(&stop, &sig);
  if (sig == SIGTERM) {
    server::DrainHooks hooks;
    hooks.begin = [&] {
      if (*registration != nullptr) (*registration)->Deregister();  // decode instances look away
      draining = true;
      m->BeginDrain();
    };
    hooks.in_flight = [m] { return m->num_active_transfers(); };
    // A decode instance may have sent a PrefillRequest before it saw a refusal: refuse it (a free
    // retry elsewhere) rather than exit under it, which it would notice only at a timeout.
    hooks.linger_s = kPrefillDrainLingerS;
    (void)server::Drain(hooks, flags.drain_timeout_s, "prefill instance");  // Stop ends the rest
  }
  if (flags.kv_events != nullptr) flags.kv_events->Close();  // ends the waiting polls
  http.stop();
  listener.join();
  // Teardown order: the messenger stops and closes its fabric domain, the engine stops, then the
  // messenger goes before the engine, which owns the KV region the domain had registered.
  (*messenger)->Stop();
  (*async)->Shutdown();
  messenger->reset();
  async->reset();
  std::printf("pdserve: stopped\n");
  return 0;
}

namespace {

// GET base_url/pd/info until it answers or the deadline passes.
Result<messenger::PrefillPeer> FetchPeer(const std::string& base_url, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string last_error = "no answer";
  while (true) {
    httplib::Client client(base_url);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(5, 0);
    auto res = client.Get("/pd/info");
    if (res && res->status == 200) {
      try {
        auto j = nlohmann::json::parse(res->body);
        if (j.value("role", "") != "prefill") {
          return FailedPrecondition(base_url + " is not a prefill instance (role '" +
                                    j.value("role", "") + "')");
        }
        ASSIGN_OR_RETURN(std::string addr, HexDecode(j.at("fabric_address").get<std::string>()));
        return messenger::PrefillPeer{base_url, addr};
      } catch (const std::exception& e) {
        return InvalidArgument(base_url + "/pd/info: " + e.what());
      }
    }
    last_error = res ? "HTTP " + std::to_string(res->status) : httplib::to_string(res.error());
    if (std::chrono::steady_clock::now() > end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return Unavailable("prefill instance " + base_url + "/pd/info: " + last_error);
}

}  // namespace

namespace {

// --discovery: the messenger's peers come from etcd. Waits (up to peer_wait_s) for one of the
// prefill instances registered at start to accept us; none registered yet is not an error.
Result<std::unique_ptr<cluster::MemberWatch>> DiscoverPrefills(const RoleFlags& flags,
                                                               const std::string& secret,
                                                               uint64_t model_hash,
                                                               messenger::DecodeMessenger* decode) {
  ASSIGN_OR_RETURN(auto watch, cluster::FeedDecodeMessenger(flags.discovery, secret,
                                                            std::to_string(model_hash), decode));
  if (watch->members().empty()) {
    PD_LOG_WARN(
        "etcd: no prefill instance registered in cluster '{}' yet: requests get 503 "
        "until one joins",
        flags.discovery.cluster);
    return watch;
  }
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(flags.peer_wait_s));
  auto accepted = [decode] {
    for (const messenger::PeerStatus& p : decode->peers())
      if (p.state == messenger::PeerStatus::State::kAccepted && !p.removed) return true;
    return false;
  };
  while (!accepted() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!accepted()) PD_LOG_WARN("etcd: no registered prefill instance has accepted us yet");
  return watch;
}

// --prefill-routing kv-aware: the messenger sends each prompt to the prefill instance where it
// costs least, knowing their caches from their GET /v1/kv_events.
std::shared_ptr<server::KvPeerChooser> PrefillChooser(const RoleFlags& flags,
                                                      messenger::DecodeMessengerOptions* mo) {
  server::KvPeerChooserOptions o;
  o.feed.api_key = flags.api_key;
  o.feed.check_tokenizer = false;  // token ids travel to the prefill instances, not text
  o.feed.log_name = "decode instance (--prefill-routing kv-aware)";
  o.compute_weight = flags.prefill_kv_compute_weight;
  o.load_weight = flags.prefill_kv_load_weight;
  auto chooser = std::make_shared<server::KvPeerChooser>(o);
  mo->on_peers = [chooser](const std::vector<std::string>& names) { chooser->SetPeers(names); };
  mo->choose_prefill = [chooser](std::span<const int32_t> tokens,
                                 std::span<const messenger::PrefillCandidate> candidates) {
    std::vector<server::KvPeerLoad> peers;
    for (const messenger::PrefillCandidate& c : candidates)
      peers.push_back({c.name, c.outstanding});
    return chooser->Choose(tokens, peers);
  };
  return chooser;
}

}  // namespace

Result<RoleEngine> CreateRoleEngine(const RoleFlags& flags, const model::ModelWeights& weights,
                                    std::unique_ptr<engine::Engine> eng,
                                    const engine::AsyncEngineOptions& ao) {
  RoleEngine out;
  if (flags.role != "decode") {
    ASSIGN_OR_RETURN(out.engine, engine::AsyncEngine::Create(std::move(eng), ao));
    return out;
  }
  ASSIGN_OR_RETURN(std::string secret, ReadClusterSecret(flags));
  messenger::DecodeMessengerOptions mo;
  mo.instance_name = "decode";
  mo.cluster_secret = secret;
  mo.model_hash = messenger::ModelFingerprint(weights);
  mo.domain = DomainFor(flags);
  ASSIGN_OR_RETURN(mo.nics, messenger::ResolveNics(flags.fabric_nics, flags.fabric_provider));
  mo.transfer_timeout_ms = static_cast<uint32_t>(flags.kv_transfer_timeout_ms);
  mo.prefill_wait_s = flags.kv_prefill_wait_s;
  mo.kv_checksum = flags.kv_checksum;
  mo.speculative = flags.speculative;
  mo.local_prefill_max_tokens = flags.local_prefill_max_tokens;
  mo.max_message_bytes = flags.control_message_bytes;
  mo.max_transfers = std::max(mo.max_transfers, ao.max_pending_requests);  // one per request
  mo.tracer = flags.tracer;
  // A prefill instance that restarts (under `up`'s supervision) has a new fabric endpoint at the
  // same URL: one look at its /pd/info per round.
  mo.resolve_address = [](const messenger::PrefillPeer& p) -> Result<std::string> {
    ASSIGN_OR_RETURN(messenger::PrefillPeer now, FetchPeer(p.name, 0.0));
    return now.fabric_address;
  };
  std::stringstream urls(flags.prefill_peers);
  std::string url;
  while (std::getline(urls, url, ',')) {
    if (url.empty()) continue;
    ASSIGN_OR_RETURN(auto peer, FetchPeer(url, flags.peer_wait_s));
    mo.peers.push_back(std::move(peer));
  }
  if (flags.prefill_routing == "kv-aware") out.prefill_chooser = PrefillChooser(flags, &mo);
  engine::ModelRunner& runner = eng->runner();
  ASSIGN_OR_RETURN(auto inner, engine::AsyncEngine::Create(std::move(eng), ao));
  mo.dynamic_peers = flags.discovery.enabled();
  ASSIGN_OR_RETURN(auto decode, messenger::DecodeMessenger::Create(mo, runner, std::move(inner)));
  if (flags.discovery.enabled()) {
    ASSIGN_OR_RETURN(out.prefill_watch,
                     DiscoverPrefills(flags, secret, mo.model_hash, decode.get()));
  } else {
    RETURN_IF_ERROR(decode->WaitForPeers(flags.peer_wait_s));
  }
  out.engine = std::move(decode);
  return out;
}

}  // namespace pd::apps
