#include "server/router.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/rate_limited_log.h"
#include "common/thread_util.h"
#include "server/openai_protocol.h"
#include "server/prompt_tokens.h"

namespace pd::server {

namespace {

std::string ForwardedHeaders(const httplib::Request& req) {
  std::string h;
  for (const char* name : {"Authorization", "Accept"}) {
    if (req.has_header(name)) h += std::string(name) + ": " + req.get_header_value(name) + "\r\n";
  }
  return h;
}

void SendError(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  PD_LOG_WARN_EVERY_N_SEC(10.0, std::to_string(status), "router: answered {}: {}", status, message);
  res.set_content(ErrorBody(status, message), "application/json");
}

bool WantsStream(const std::string& body) {
  try {
    auto j = nlohmann::json::parse(body);
    return j.is_object() && j.value("stream", false);
  } catch (const std::exception&) {
    return false;  // the decode instance answers the 400
  }
}

}  // namespace

Router::Router(const RouterOptions& options) : options_(options), http_(options.http) {}

Router::~Router() { Stop(); }

Result<std::unique_ptr<Router>> Router::Create(const RouterOptions& options) {
  if (options.backends.empty() && !options.dynamic_backends) {
    return InvalidArgument("the router needs decode instances");
  }
  if (options.max_open_streams < 1) return InvalidArgument("max_open_streams must be >= 1");
  if (options.routing == RoutingPolicy::kKvAware) {
    if (options.kv.tokenizer == nullptr)
      return InvalidArgument("kv-aware routing needs the model's tokenizer (--model)");
    if (options.kv.compute_weight < 0 || options.kv.load_weight < 0)
      return InvalidArgument("kv-aware routing weights must be >= 0");
  }
  std::unique_ptr<Router> r(new Router(options));
  for (const std::string& url : options.backends) {
    ASSIGN_OR_RETURN(auto target, ResolveUpstream(url));
    MutexLock lock(&r->backends_mu_);
    r->backends_.push_back(target.get());
    r->targets_[url] = std::move(target);
  }
  UpstreamRelayOptions ro;
  ro.upstream_timeout_ms = options.upstream_timeout_s * 1000;
  ro.write_timeout_ms = options.http.write_timeout_ms;
  ro.max_idle_upstream = options.max_idle_upstream;
  ro.upstream_idle_s = options.upstream_idle_s;
  ro.tracer = options.tracer;
  ro.give_back = [raw = r.get()](int fd, int requests_left) {
    raw->http_.ResumeConnection(fd, requests_left);
  };
  ro.reroute = [raw = r.get()](UpstreamTarget* refused) { return raw->PickAvailable(refused); };
  ro.max_reroutes = options.dynamic_backends ? 4 : static_cast<int>(options.backends.size()) - 1;
  ASSIGN_OR_RETURN(r->relay_, UpstreamRelay::Create(ro));
  if (options.routing == RoutingPolicy::kKvAware) {
    KvFeedOptions fo;
    fo.api_key = options.kv.api_key;
    fo.tokenizer_fingerprint = TokenizerFingerprint(*options.kv.tokenizer);
    fo.wait_ms = options.kv.wait_ms;
    fo.retry_ms = options.kv.retry_ms;
    r->kv_index_ = std::make_unique<KvIndex>();
    r->kv_feed_ = std::make_unique<KvEventFeed>(r->kv_index_.get(), fo);
    r->kv_feed_->SetBackends(r->backends());
  }
  r->RegisterRoutes();
  return r;
}

void Router::RegisterRoutes() {
  auto generate = [this](const httplib::Request& req, httplib::Response& res) {
    Forward(req, res);
  };
  http_.Post("/v1/completions", generate);
  http_.Post("/v1/chat/completions", generate);
  http_.Get("/v1/models", generate);
  http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) return SendError(res, 503, "the router is draining (shutting down)");
    for (const std::string& url : backends()) {
      httplib::Client c(url);
      c.set_connection_timeout(1, 0);
      auto h = c.Get("/health");
      if (h && h->status == 200) {
        res.set_content("OK", "text/plain");
        return;
      }
    }
    SendError(res, 503, "no decode instance is healthy");
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string out =
        "# TYPE pdserve:router_requests_total counter\npdserve:router_requests_total " +
        std::to_string(requests_.load()) +
        "\n# TYPE pdserve:router_failures_total counter\npdserve:router_failures_total " +
        std::to_string(relay_->failures()) +
        "\n# TYPE pdserve:router_unforwarded_total counter\npdserve:router_unforwarded_total " +
        std::to_string(relay_->unforwarded()) +
        "\n# TYPE pdserve:router_rejected_total counter\npdserve:router_rejected_total " +
        std::to_string(rejected_.load()) +
        "\n# TYPE pdserve:router_clients_gone_total counter\npdserve:router_clients_gone_total " +
        std::to_string(relay_->clients_gone()) +
        "\n# TYPE pdserve:router_open_streams gauge\npdserve:router_open_streams " +
        std::to_string(open_.load()) + "\n# TYPE pdserve:router_outstanding gauge\n";
    {
      MutexLock lock(&backends_mu_);
      for (const UpstreamTarget* b : backends_) {
        out += "pdserve:router_outstanding{backend=\"" + b->url + "\"} " +
               std::to_string(b->outstanding.load()) + "\n";
      }
      out += "# TYPE pdserve:router_backends gauge\npdserve:router_backends " +
             std::to_string(backends_.size()) + "\n";
    }
    out += KvMetricsText();
    out += http_.RefusedMetricsText();
    res.set_content(out, "text/plain; version=0.0.4");
  });
}

Status Router::Start() {
  port_ = options_.port == 0
              ? http_.bind_to_any_port(options_.host)
              : (http_.bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port_ <= 0) {
    return Unavailable("router: cannot bind " + options_.host + ":" +
                       std::to_string(options_.port));
  }
  http_.SetListenBacklog(4096);
  listen_thread_ = std::thread([this] {
    (void)SetCurrentThreadLatencySensitive();  // best effort: it accepts every connection
    http_.listen_after_bind();
  });
  // Every thread exists once Start returns (so a caller can see, pin or count them).
  if (!http_.WaitListening(std::chrono::seconds(10)))
    return Internal("router: HTTP threads did not start");
  return OkStatus();
}

void Router::Stop() {
  http_.stop();
  if (listen_thread_.joinable()) listen_thread_.join();
  if (relay_ != nullptr) relay_->Stop();  // after the HTTP threads: none hands over any more
  if (kv_feed_ != nullptr) kv_feed_->Stop();
}

std::vector<int> Router::outstanding() const {
  MutexLock lock(&backends_mu_);
  std::vector<int> out;
  for (const UpstreamTarget* b : backends_) out.push_back(b->outstanding.load());
  return out;
}

std::vector<std::string> Router::backends() const {
  MutexLock lock(&backends_mu_);
  std::vector<std::string> out;
  for (const UpstreamTarget* b : backends_) out.push_back(b->url);
  return out;
}

Status Router::SetBackends(const std::vector<std::string>& urls) {
  std::vector<std::unique_ptr<UpstreamTarget>> fresh;  // resolved outside the lock
  std::string errors;
  for (const std::string& url : urls) {
    {
      MutexLock lock(&backends_mu_);
      if (targets_.count(url) > 0) continue;
    }
    auto target = ResolveUpstream(url);
    if (!target.ok()) {
      errors += (errors.empty() ? "" : "; ") + target.status().message();
      continue;
    }
    fresh.push_back(std::move(target).value());
  }
  MutexLock lock(&backends_mu_);
  for (auto& t : fresh) {
    const std::string url = t->url;
    targets_.emplace(url, std::move(t));
  }
  std::vector<UpstreamTarget*> now;
  for (const std::string& url : urls) {
    auto it = targets_.find(url);
    if (it == targets_.end()) continue;
    UpstreamTarget* t = it->second.get();
    if (std::find(backends_.begin(), backends_.end(), t) == backends_.end()) {
      t->refused_at_ns.store(-1);  // a member that (re)joined is used at once
    }
    now.push_back(t);
  }
  backends_ = std::move(now);
  if (kv_feed_ != nullptr) {
    std::vector<std::string> in_use;
    for (const UpstreamTarget* t : backends_) in_use.push_back(t->url);
    lock.Unlock();
    kv_feed_->SetBackends(in_use);  // starts the new ones' streams; the others leave the index
  }
  return errors.empty() ? OkStatus() : InvalidArgument(errors);
}

UpstreamTarget* Router::PickAvailable(const UpstreamTarget* besides) {
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  const int64_t kRefusedNs = 1'000'000'000;
  MutexLock lock(&backends_mu_);
  const size_t n = backends_.size();
  if (n == 0) return nullptr;
  const size_t start = round_robin_.fetch_add(1) % n;  // ties go round
  UpstreamTarget* best = nullptr;
  for (size_t k = 0; k < n; ++k) {
    UpstreamTarget* b = backends_[(start + k) % n];
    const int64_t refused = b->refused_at_ns.load();
    if (b == besides || (refused >= 0 && now - refused < kRefusedNs)) continue;
    if (best == nullptr || b->outstanding.load() < best->outstanding.load()) best = b;
  }
  return best;
}

UpstreamTarget* Router::Pick(const httplib::Request& req) {
  UpstreamTarget* best = nullptr;
  if (options_.routing == RoutingPolicy::kRoundRobin) best = PickRoundRobin();
  if (options_.routing == RoutingPolicy::kKvAware && req.method == "POST") best = PickKvAware(req);
  if (best == nullptr) best = PickAvailable();
  if (best != nullptr) return best;
  MutexLock lock(&backends_mu_);
  const size_t n = backends_.size();
  if (n == 0) return nullptr;
  best = backends_[round_robin_.fetch_add(1) % n];  // every one refused lately: the least loaded
  for (UpstreamTarget* b : backends_)
    if (b->outstanding.load() < best->outstanding.load()) best = b;
  return best;
}

void Router::Forward(const httplib::Request& req, httplib::Response& res) {
  TraceInstant(options_.tracer, "router request", "http");
  requests_.fetch_add(1);
  if (draining_) {
    rejected_.fetch_add(1);
    res.set_header("Retry-After", std::to_string(options_.http.retry_after_s));
    return SendError(res, 503, "the router is draining (shutting down); retry later");
  }
  if (open_.fetch_add(1) >= options_.max_open_streams) {
    open_.fetch_sub(1);
    rejected_.fetch_add(1);
    res.set_header("Retry-After", std::to_string(options_.http.retry_after_s));
    return SendError(res, 429,
                     "router overloaded: " + std::to_string(options_.max_open_streams) +
                         " requests open (--max-open-streams); retry later");
  }
  UpstreamTarget* target = Pick(req);
  if (target == nullptr) {
    open_.fetch_sub(1);
    res.set_header("Retry-After", std::to_string(options_.http.retry_after_s));
    return SendError(res, 503, "no decode instance is registered yet; retry later");
  }
  target->outstanding.fetch_add(1);
  RelayRequest up;
  up.method = req.method;
  up.path = req.path;
  up.headers = ForwardedHeaders(req);
  up.body = req.body;
  up.stream = req.method == "POST" && WantsStream(req.body);
  const bool detached = LimitedHttpServer::DetachCurrentConnection(
      [this, target, up = std::move(up)](int fd, int requests_left) mutable {
        relay_->Relay(target, fd, requests_left, std::move(up), [this] { open_.fetch_sub(1); });
      });
  if (!detached) {  // not on one of our HTTP threads: cannot happen with LimitedHttpServer
    target->outstanding.fetch_sub(1);
    open_.fetch_sub(1);
    return SendError(res, 500, "router: the connection cannot be handed over");
  }
  res.status = 200;  // the relay writes the real answer
}

}  // namespace pd::server
