#include "server/router.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

namespace pd::server {

struct Router::Backend {
  std::string url;
  std::atomic<int> outstanding{0};
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

// The upstream half of a relayed stream: a thread reads the decode instance's answer into a queue
// the HTTP thread drains into the client's connection.
struct Relay {
  std::mutex mu;
  std::condition_variable cv;
  bool have_status = false;
  int status = 0;
  std::string content_type;
  std::deque<std::string> chunks;
  bool done = false;
  std::string error;
  std::atomic<bool> cancel{false};
  std::thread worker;

  void Push(std::string chunk) {
    std::lock_guard<std::mutex> lock(mu);
    chunks.push_back(std::move(chunk));
    cv.notify_all();
  }
};

// The relay's worker thread: sends `up` to the decode instance at `url` and queues its status and
// body chunks into `relay` as they arrive, until the answer ends or the relay is cancelled.
void RelayUpstream(const std::shared_ptr<Relay>& relay, const std::string& url, int timeout_s,
                   httplib::Request up) {
  up.response_handler = [relay](const httplib::Response& r) {
    std::lock_guard<std::mutex> lock(relay->mu);
    relay->have_status = true;
    relay->status = r.status;
    relay->content_type = r.get_header_value("Content-Type");
    relay->cv.notify_all();
    return true;
  };
  up.content_receiver = [relay](const char* data, size_t len, uint64_t, uint64_t) {
    relay->Push(std::string(data, len));
    return !relay->cancel.load();  // false closes the upstream: the decode instance aborts
  };
  httplib::Client client(url);
  client.set_read_timeout(timeout_s, 0);
  client.set_tcp_nodelay(true);
  httplib::Response r;
  httplib::Error err = httplib::Error::Success;
  bool ok = client.send(up, r, err);
  std::lock_guard<std::mutex> lock(relay->mu);
  if (!ok && !relay->cancel.load()) relay->error = httplib::to_string(err);
  relay->done = true;
  relay->cv.notify_all();
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
  listen_thread_ = std::thread([this] { http_.listen_after_bind(); });
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
  requests_.fetch_add(1);
  Backend& b = *backends_[Pick()];
  if (req.method == "POST" && WantsStream(req.body)) {
    ForwardStream(b, req, res);
    return;
  }
  Outstanding count(b.outstanding);
  httplib::Client client(b.url);
  client.set_read_timeout(options_.upstream_timeout_s, 0);
  client.set_tcp_nodelay(true);
  auto up = req.method == "GET" ? client.Get(req.path.c_str(), ForwardedHeaders(req))
                                : client.Post(req.path.c_str(), ForwardedHeaders(req), req.body,
                                              "application/json");
  if (!up) {
    failures_.fetch_add(1);
    SendError(res, 502, "decode instance " + b.url + ": " + httplib::to_string(up.error()));
    return;
  }
  res.status = up->status;
  if (up->has_header("Retry-After"))
    res.set_header("Retry-After", up->get_header_value("Retry-After"));
  res.set_content(up->body, up->get_header_value("Content-Type").c_str());
}

void Router::ForwardStream(Backend& b, const httplib::Request& req, httplib::Response& res) {
  auto relay = std::make_shared<Relay>();
  b.outstanding.fetch_add(1);
  const std::string url = b.url;
  const int timeout_s = options_.upstream_timeout_s;
  httplib::Request up;
  up.method = "POST";
  up.path = req.path;
  up.headers = ForwardedHeaders(req);
  up.headers.emplace("Content-Type", "application/json");
  up.body = req.body;
  relay->worker = std::thread([relay, url, timeout_s, up]() mutable {
    RelayUpstream(relay, url, timeout_s, std::move(up));
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
        relay->cv.wait(lock, [&] { return !relay->chunks.empty() || relay->done; });
        while (!relay->chunks.empty()) {
          std::string c = std::move(relay->chunks.front());
          relay->chunks.pop_front();
          lock.unlock();
          if (!sink.write(c.data(), c.size())) return false;  // the client went away
          lock.lock();
        }
        if (relay->done) sink.done();
        return true;
      },
      [finish](bool) { finish(); });
}

}  // namespace pd::server
