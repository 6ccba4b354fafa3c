// The router of a disaggregated deployment: the OpenAI API in front of decode instances. Every
// generation request (streaming or not) goes to a decode instance chosen by the routing policy:
// round-robin, least-loaded (fewest outstanding requests; the default) or kv-aware: the router
// tokenizes the prompt as the instances do, computes its prefix-cache page keys and sends it to
// the instance minimising compute_weight * (its pages not cached there) + load_weight *
// (outstanding requests there), knowing each instance's cached keys from its
// GET /v1/kv_events stream (kv_feed.h, kv_index.h). An HTTP thread reads the request and hands the
// connection to the relay's event-loop thread (server/upstream_relay.h), which carries the exchange
// to its end: SSE chunks relayed as they come, a client that goes away closes the upstream
// connection (the decode instance aborts the request); a kept-alive client connection then goes
// back to the HTTP server for its next request. So the router's threads are a fixed few
// (http.num_threads, the listener, the relay and the HTTP server's idle-connection loop), however
// many streams are open; past max_open_streams a request gets 429. /health answers when at least
// one decode instance is healthy; /metrics reports the router's own counters; GET /v1/models is
// forwarded.
//
// Thread safety: Start/Stop from one thread; handlers run on the HTTP pool's threads;
// SetBackends and the counters from any thread.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/trace.h"
#include "model/tokenizer.h"
#include "server/http_transport.h"
#include "server/kv_feed.h"
#include "server/kv_index.h"
#include "server/upstream_relay.h"

namespace pd::server {

// The router's HTTP threads only read requests (and answer /health and /metrics): a few suffice,
// and connections wait for one in a long queue rather than being turned away in a burst.
inline HttpLimits RouterHttpLimits() {
  HttpLimits l;
  l.num_threads = 8;
  l.max_queued_connections = 4096;
  return l;
}

enum class RoutingPolicy { kRoundRobin, kLeastLoaded, kKvAware };
std::string_view RoutingPolicyName(RoutingPolicy policy);
// "round-robin" | "least-loaded" | "kv-aware"; InvalidArgument naming the others.
Result<RoutingPolicy> ParseRoutingPolicy(std::string_view name);

struct KvRoutingOptions {
  // Borrowed, required by kv-aware: tokenizes prompts exactly as the instances do (the same
  // model directory and chat template); an instance whose tokenizer fingerprint differs is
  // routed by load only.
  const model::Tokenizer* tokenizer = nullptr;
  double compute_weight = 1.0;  // per prompt page not cached on the instance
  double load_weight = 4.0;     // per request in flight on the instance
  std::string api_key;          // the instances' API key, for GET /v1/kv_events
  int wait_ms = 1000;           // each long poll's wait
  int retry_ms = 500;           // after a failed poll
};

struct RouterOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                    // 0: any free port
  std::vector<std::string> backends;  // decode instances' base URLs, "http://127.0.0.1:8001"
  // The backends change at run time (SetBackends, e.g. from etcd discovery); may start empty,
  // and while there are none a request gets 503 with Retry-After.
  bool dynamic_backends = false;
  int upstream_timeout_s = 600;  // per read from a decode instance
  // Connections to decode instances are kept alive and reused: at most this many idle ones per
  // decode instance, each reused only within upstream_idle_s of its last answer (below the
  // decode instance's keep-alive timeout, 5 s by default, so it has not closed it meanwhile).
  int max_idle_upstream = 32;
  double upstream_idle_s = 2.0;
  // Relayed requests (streamed or not) open at once; beyond it a request gets 429 at once.
  int max_open_streams = 4096;
  RoutingPolicy routing = RoutingPolicy::kLeastLoaded;
  KvRoutingOptions kv;  // routing kv-aware
  HttpLimits http = RouterHttpLimits();
  // Borrowed, may be null: instants per streamed request ("router request", "router upstream
  // sent", "router upstream status", "router first chunk read", "router first chunk written").
  Tracer* tracer = nullptr;
};

class Router {
 public:
  static Result<std::unique_ptr<Router>> Create(const RouterOptions& options);
  ~Router();
  Status Start();
  void Stop();
  int port() const { return port_; }
  // Requests in flight per backend, in order (options order, or SetBackends').
  std::vector<int> outstanding() const EXCLUDES(backends_mu_);
  // Replaces the backends (dynamic_backends): new ones are used at once, ones left out get no
  // new request (those in flight on them go on). InvalidArgument naming a URL that is not
  // http://HOST:PORT or does not resolve; the others are still applied.
  Status SetBackends(const std::vector<std::string>& urls) EXCLUDES(backends_mu_);
  std::vector<std::string> backends() const EXCLUDES(backends_mu_);
  // Upstream connections opened so far (reusing a kept-alive one opens none).
  uint64_t upstream_connections() const { return relay_->connections_opened(); }
  // Relayed requests open now, and those turned away by max_open_streams so far.
  int open_streams() const { return open_.load(); }
  uint64_t rejected() const { return rejected_.load(); }
  // Clients that went away before their answer was complete (their upstream request aborted).
  uint64_t clients_gone() const { return relay_->clients_gone(); }

  // Graceful drain (server/drain.h): from BeginDrain on, new requests get 503 with Retry-After
  // and /health 503; relayed requests go on (open_streams() counts them). EndRunning ends every
  // one still open with a 503 error carrying `why`.
  void BeginDrain() { draining_ = true; }
  void EndRunning(const std::string& why) { relay_->EndAll(why); }

  // kv-aware: the index of the backends' cached keys (null under the other policies).
  const KvIndex* kv_index() const { return kv_index_.get(); }

 private:
  explicit Router(const RouterOptions& options);
  // The backend with the fewest requests in flight among those that did not refuse a connection
  // within the last second (ties go round); null when every one did.
  UpstreamTarget* PickAvailable(const UpstreamTarget* besides = nullptr) EXCLUDES(backends_mu_);
  // A backend for a new request (by the policy; `req` is the request); null when there is none.
  UpstreamTarget* Pick(const httplib::Request& req) EXCLUDES(backends_mu_);
  // The next available backend in order.
  UpstreamTarget* PickRoundRobin() EXCLUDES(backends_mu_);
  // kv-aware; null when the prompt cannot be tokenized (then the least loaded is used).
  UpstreamTarget* PickKvAware(const httplib::Request& req) EXCLUDES(backends_mu_);
  std::string KvMetricsText() const EXCLUDES(backends_mu_);
  void Forward(const httplib::Request& req, httplib::Response& res);
  void RegisterRoutes();

  const RouterOptions options_;
  mutable Mutex backends_mu_;
  std::vector<UpstreamTarget*> backends_ GUARDED_BY(backends_mu_);  // those in use, in order
  // Every backend ever used, by URL, kept for the router's life: exchanges in flight and the
  // relay's idle connections hold their pointers.
  std::map<std::string, std::unique_ptr<UpstreamTarget>> targets_ GUARDED_BY(backends_mu_);
  std::unique_ptr<UpstreamRelay> relay_;
  std::unique_ptr<KvIndex> kv_index_;  // kv-aware only
  std::unique_ptr<KvEventFeed> kv_feed_;
  std::atomic<uint64_t> kv_prompt_pages_{0};  // kv-aware: prompt pages routed ...
  std::atomic<uint64_t> kv_cached_pages_{0};  // ... and those the index had on the chosen backend
  LimitedHttpServer http_;
  std::thread listen_thread_;
  int port_ = 0;
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<int> open_{0};
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> round_robin_{0};
};

}  // namespace pd::server
