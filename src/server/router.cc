#include "server/router.h"

#include <poll.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/thread_util.h"

namespace pd::server {

namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

struct IdleClient {
  std::unique_ptr<httplib::Client> client;
  SteadyTime since;
};

// True when an idle kept-alive connection can carry another request: open, and nothing to read
// (an idle connection turns readable only when the peer closed it or sent something unasked).
bool Reusable(httplib::Client& c) {
  if (!c.is_socket_open()) return false;
  pollfd p{c.socket(), POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

}  // namespace

struct Router::Backend {
  std::string url;
  std::atomic<int> outstanding{0};
  std::mutex mu;
  std::vector<IdleClient> idle;  // GUARDED_BY(mu): kept-alive connections, the newest last
};

// A client whose connection to the decode instance is kept alive between requests.
class Router::Upstream {
 public:
  Upstream(Router& router, Backend& backend) : router_(router), backend_(backend) {
    const auto now = std::chrono::steady_clock::now();
    const auto max_idle = std::chrono::duration<double>(router.options_.upstream_idle_s);
    std::lock_guard<std::mutex> lock(backend.mu);
    while (!backend.idle.empty() && client_ == nullptr) {
      IdleClient c = std::move(backend.idle.back());
      backend.idle.pop_back();
      if (now - c.since < max_idle && Reusable(*c.client)) client_ = std::move(c.client);
    }
  }
  Upstream(const Upstream&) = delete;
  Upstream& operator=(const Upstream&) = delete;
  // Back to the pool when the exchange ended cleanly (Keep() was called) and the connection is
  // still open; closed otherwise.
  ~Upstream() { Release(); }
  // Gives the connection back now (to the pool, or closed); the destructor does it otherwise.
  void Release() {
    std::unique_ptr<httplib::Client> c = std::move(client_);
    if (c == nullptr || !keep_ || !c->is_socket_open()) return;
    std::lock_guard<std::mutex> lock(backend_.mu);
    if (static_cast<int>(backend_.idle.size()) >= router_.options_.max_idle_upstream) return;
    backend_.idle.push_back({std::move(c), std::chrono::steady_clock::now()});
  }

  httplib::Client& client() {
    if (client_ == nullptr) {
      client_ = std::make_unique<httplib::Client>(backend_.url);
      client_->set_keep_alive(true);
      client_->set_read_timeout(router_.options_.upstream_timeout_s, 0);
      client_->set_tcp_nodelay(true);
      router_.connections_.fetch_add(1);
    }
    return *client_;
  }
  void Keep() { keep_ = true; }

 private:
  Router& router_;
  Backend& backend_;
  std::unique_ptr<httplib::Client> client_;
  bool keep_ = false;
};

namespace {

// Counts a request against its backend for as long as it is in flight.
class Outstanding {
 public:
  explicit Outstanding(std::atomic<int>& n) : n_(n) { n_.fetch_add(1); }
  ~Outstanding() { n_.fetch_sub(1); }
  Outstanding(const Outstanding&) = delete;
  Outstanding& operator=(const Outstanding&) = delete;

 private:
  std::atomic<int>& n_;
};

httplib::Headers ForwardedHeaders(const httplib::Request& req) {
  httplib::Headers h;
  for (const char* name : {"Authorization", "Accept"}) {
    if (req.has_header(name)) h.emplace(name, req.get_header_value(name));
  }
  return h;
}

void SendError(httplib::Response& res, int status, const std::string& message) {
  nlohmann::json j = {
      {"error", {{"message", message}, {"type", "server_error"}, {"code", status}}}};
  res.status = status;
  res.set_content(j.dump(), "application/json");
}

bool WantsStream(const std::string& body) {
  try {
    auto j = nlohmann::json::parse(body);
    return j.is_object() && j.value("stream", false);
  } catch (const std::exception&) {
    return false;  // the decode instance answers the 400
  }
}

// The upstream half of a relayed stream: a thread reads the decode instance's answer. Chunks
// that arrive before the client's response has started are queued; once the HTTP thread has
// written them and parked in its content provider (sink set), the reading thread writes each new
// chunk straight into the client's connection: no thread hand-off per chunk.
struct Relay {
  std::mutex mu;
  std::condition_variable cv;
  bool have_status = false;
  int status = 0;
  std::string content_type;
  std::deque<std::string> chunks;     // GUARDED_BY(mu): read, not yet written to the client
  httplib::DataSink* sink = nullptr;  // GUARDED_BY(mu): the parked provider's sink
  bool client_gone = false;           // GUARDED_BY(mu): a write to the client failed
  bool first_written = false;         // GUARDED_BY(mu)
  bool done = false;
  std::string error;
  std::atomic<bool> cancel{false};
  std::thread worker;
  Tracer* tracer = nullptr;

  // Under mu: writes `c` to the client; false (and client_gone) when it has gone away.
  bool WriteLocked(httplib::DataSink& s, const std::string& c) {
    if (!s.write(c.data(), c.size())) {
      client_gone = true;
      return false;
    }
    if (!first_written) TraceInstant(tracer, "router first chunk written", "http");
    first_written = true;
    return true;
  }
  // The reading thread: a chunk from the decode instance. False stops the upstream read.
  bool Receive(std::string chunk) {
    std::lock_guard<std::mutex> lock(mu);
    if (sink != nullptr) {
      if (!WriteLocked(*sink, chunk)) cv.notify_all();
      return !client_gone;
    }
    chunks.push_back(std::move(chunk));
    cv.notify_all();
    return true;
  }
};

// The relay's worker: sends `up` to the decode instance on `client` and queues its status and
// body chunks into `relay` as they arrive, until the answer ends or the relay is cancelled. True
// when the answer was read to its end (the connection may carry another request). The caller
// marks the relay done once the connection is back in the pool.
bool RelayUpstream(const std::shared_ptr<Relay>& relay, httplib::Client& client,
                   httplib::Request up) {
  Tracer* const tracer = relay->tracer;
  up.response_handler = [relay, tracer](const httplib::Response& r) {
    TraceInstant(tracer, "router upstream status", "http");
    std::lock_guard<std::mutex> lock(relay->mu);
    relay->have_status = true;
    relay->status = r.status;
    relay->content_type = r.get_header_value("Content-Type");
    relay->cv.notify_all();
    return true;
  };
  up.content_receiver = [relay, tracer, first = true](const char* data, size_t len, uint64_t,
                                                      uint64_t) mutable {
    if (first) TraceInstant(tracer, "router first chunk read", "http");
    first = false;
    // false closes the upstream: the decode instance aborts
    return relay->Receive(std::string(data, len)) && !relay->cancel.load();
  };
  httplib::Response r;
  httplib::Error err = httplib::Error::Success;
  TraceInstant(tracer, "router upstream send", "http");
  bool ok = client.send(up, r, err);
  std::lock_guard<std::mutex> lock(relay->mu);
  if (!ok && !relay->cancel.load()) relay->error = httplib::to_string(err);
  return ok && !relay->cancel.load();
}

}  // namespace

Router::Router(const RouterOptions& options) : options_(options), http_(options.http) {}

Router::~Router() { Stop(); }

Result<std::unique_ptr<Router>> Router::Create(const RouterOptions& options) {
  if (options.backends.empty()) return InvalidArgument("the router needs decode instances");
  std::unique_ptr<Router> r(new Router(options));
  for (const std::string& url : options.backends) {
    auto b = std::make_unique<Backend>();
    b->url = url;
    r->backends_.push_back(std::move(b));
  }
  auto generate = [raw = r.get()](const httplib::Request& req, httplib::Response& res) {
    raw->Forward(req, res);
  };
  r->http_.Post("/v1/completions", generate);
  r->http_.Post("/v1/chat/completions", generate);
  r->http_.Get("/v1/models", generate);
  r->http_.Get("/health", [raw = r.get()](const httplib::Request&, httplib::Response& res) {
    for (const auto& b : raw->backends_) {
      httplib::Client c(b->url);
      c.set_connection_timeout(1, 0);
      auto h = c.Get("/health");
      if (h && h->status == 200) {
        res.set_content("OK", "text/plain");
        return;
      }
    }
    SendError(res, 503, "no decode instance is healthy");
  });
  r->http_.Get("/metrics", [raw = r.get()](const httplib::Request&, httplib::Response& res) {
    std::string out =
        "# TYPE pdserve:router_requests_total counter\npdserve:router_requests_total " +
        std::to_string(raw->requests_.load()) +
        "\n# TYPE pdserve:router_failures_total counter\npdserve:router_failures_total " +
        std::to_string(raw->failures_.load()) + "\n# TYPE pdserve:router_outstanding gauge\n";
    for (const auto& b : raw->backends_) {
      out += "pdserve:router_outstanding{backend=\"" + b->url + "\"} " +
             std::to_string(b->outstanding.load()) + "\n";
    }
    res.set_content(out, "text/plain; version=0.0.4");
  });
  return r;
}

Status Router::Start() {
  port_ = options_.port == 0
              ? http_.bind_to_any_port(options_.host)
              : (http_.bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port_ <= 0) {
    return Unavailable("router: cannot bind " + options_.host + ":" +
                       std::to_string(options_.port));
  }
  http_.SetListenBacklog(1024);
  listen_thread_ = std::thread([this] {
    (void)SetCurrentThreadLatencySensitive();  // best effort: it accepts every connection
    http_.listen_after_bind();
  });
  return OkStatus();
}

void Router::Stop() {
  http_.stop();
  if (listen_thread_.joinable()) listen_thread_.join();
}

std::vector<int> Router::outstanding() const {
  std::vector<int> out;
  for (const auto& b : backends_) out.push_back(b->outstanding.load());
  return out;
}

int Router::Pick() {
  const size_t n = backends_.size();
  const size_t start = round_robin_.fetch_add(1) % n;  // ties go round
  int best = static_cast<int>(start);
  for (size_t k = 1; k < n; ++k) {
    size_t i = (start + k) % n;
    if (backends_[i]->outstanding.load() < backends_[best]->outstanding.load()) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

void Router::Forward(const httplib::Request& req, httplib::Response& res) {
  TraceInstant(options_.tracer, "router request", "http");
  requests_.fetch_add(1);
  Backend& b = *backends_[Pick()];
  if (req.method == "POST" && WantsStream(req.body)) {
    ForwardStream(b, req, res);
    return;
  }
  Outstanding count(b.outstanding);
  Upstream upstream(*this, b);
  httplib::Client& client = upstream.client();
  auto up = req.method == "GET" ? client.Get(req.path.c_str(), ForwardedHeaders(req))
                                : client.Post(req.path.c_str(), ForwardedHeaders(req), req.body,
                                              "application/json");
  if (!up) {
    failures_.fetch_add(1);
    SendError(res, 502, "decode instance " + b.url + ": " + httplib::to_string(up.error()));
    return;
  }
  upstream.Keep();
  res.status = up->status;
  if (up->has_header("Retry-After"))
    res.set_header("Retry-After", up->get_header_value("Retry-After"));
  res.set_content(up->body, up->get_header_value("Content-Type").c_str());
}

void Router::ForwardStream(Backend& b, const httplib::Request& req, httplib::Response& res) {
  auto relay = std::make_shared<Relay>();
  relay->tracer = options_.tracer;
  b.outstanding.fetch_add(1);
  const std::string url = b.url;
  httplib::Request up;
  up.method = "POST";
  up.path = req.path;
  up.headers = ForwardedHeaders(req);
  up.headers.emplace("Content-Type", "application/json");
  up.body = req.body;
  relay->worker = std::thread([this, relay, &b, up]() mutable {
    SetCurrentThreadName("pd-router-up");
    (void)SetCurrentThreadLatencySensitive();  // best effort: it writes the client's chunks
    Upstream upstream(*this, b);
    if (RelayUpstream(relay, upstream.client(), std::move(up))) upstream.Keep();
    // Back in the pool before the client sees the answer end, so its next request reuses it.
    upstream.Release();
    std::lock_guard<std::mutex> lock(relay->mu);
    relay->done = true;
    relay->cv.notify_all();
  });
  auto finish = [relay, &b] {
    relay->cancel.store(true);
    if (relay->worker.joinable()) relay->worker.join();
    b.outstanding.fetch_sub(1);
  };
  {
    std::unique_lock<std::mutex> lock(relay->mu);
    relay->cv.wait(lock, [&] { return relay->have_status || relay->done; });
    if (!relay->have_status || relay->status != 200) {
      relay->cv.wait(lock, [&] { return relay->done; });
      lock.unlock();
      finish();
      if (!relay->have_status) {
        failures_.fetch_add(1);
        SendError(res, 502, "decode instance " + url + ": " + relay->error);
        return;
      }
      std::string body;
      for (auto& c : relay->chunks) body += c;
      res.status = relay->status;
      res.set_content(body, relay->content_type.c_str());
      return;
    }
  }
  res.set_chunked_content_provider(
      "text/event-stream",
      [relay](size_t, httplib::DataSink& sink) {
        std::unique_lock<std::mutex> lock(relay->mu);
        for (; !relay->chunks.empty(); relay->chunks.pop_front()) {
          if (!relay->WriteLocked(sink, relay->chunks.front())) return false;  // client gone
        }
        // Parked until the answer ends: the reading thread writes the rest itself.
        relay->sink = &sink;
        relay->cv.wait(lock, [&] { return relay->done || relay->client_gone; });
        relay->sink = nullptr;
        if (relay->client_gone) return false;
        for (; !relay->chunks.empty(); relay->chunks.pop_front()) {
          if (!relay->WriteLocked(sink, relay->chunks.front())) return false;
        }
        sink.done();
        return true;
      },
      [finish](bool) { finish(); });
}

}  // namespace pd::server
