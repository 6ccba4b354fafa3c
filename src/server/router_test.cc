// The router against a plain HTTP backend standing in for a decode instance: streamed and whole
// answers relayed intact, upstream connections kept alive and reused (and not reused when the
// backend closes them or they idled too long), a backend that is down, and the trace instants.
#include "server/router.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/trace.h"
#include "server/test_http.h"

namespace pd::server {
namespace {

// Answers POST /v1/completions with three SSE events (streamed when the body asks for it) and
// records the client port of every request (one port per connection).
class Backend {
 public:
  explicit Backend(int keep_alive_max = 100, bool endless = false) {
    server_.set_keep_alive_max_count(static_cast<size_t>(keep_alive_max));
    server_.Post("/v1/completions",
                 [this, endless](const httplib::Request& req, httplib::Response& res) {
                   {
                     std::lock_guard<std::mutex> lock(mu_);
                     ports_.push_back(req.remote_port);
                   }
                   if (endless) return Endless(res);
                   if (req.body.find("\"stream\":true") == std::string::npos) {
                     res.set_content("{\"whole\":true}", "application/json");
                     return;
                   }
                   res.set_chunked_content_provider(
                       "text/event-stream", [n = 0](size_t, httplib::DataSink& sink) mutable {
                         std::string e = "data: " + std::to_string(n++) + "\n\n";
                         sink.write(e.data(), e.size());
                         if (n == 3) sink.done();
                         return true;
                       });
                 });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~Backend() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  // An endless stream: one event per millisecond until the reader goes away.
  void Endless(httplib::Response& res) {
    res.set_chunked_content_provider("text/event-stream", [this](size_t, httplib::DataSink& sink) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(1), [&] { return stopping_; });
      if (stopping_) return false;
      const std::string e = "data: x\n\n";
      if (!sink.write(e.data(), e.size())) {
        endless_aborted_ = true;
        return false;
      }
      return true;
    });
  }
  bool endless_aborted() {
    std::lock_guard<std::mutex> lock(mu_);
    return endless_aborted_;
  }
  std::vector<int> ports() {
    std::lock_guard<std::mutex> lock(mu_);
    return ports_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool endless_aborted_ = false;
  std::vector<int> ports_;
};

std::unique_ptr<Router> StartRouter(RouterOptions o) {
  o.port = 0;
  o.http.num_threads = 4;
  auto r = Router::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return nullptr;
  EXPECT_TRUE((*r)->Start().ok());
  return std::move(r).value();
}

httplib::Result Post(Router& router, bool stream) {
  httplib::Client c("127.0.0.1", router.port());
  c.set_read_timeout(10, 0);
  return c.Post("/v1/completions", stream ? "{\"stream\":true}" : "{\"stream\":false}",
                "application/json");
}

constexpr char kStreamBody[] = "data: 0\n\ndata: 1\n\ndata: 2\n\n";

TEST(RouterTest, RelaysStreamsAndReusesOneUpstreamConnection) {
  Backend backend;
  RouterOptions o;
  o.backends = {backend.url()};
  auto router = StartRouter(o);
  ASSERT_NE(router, nullptr);
  for (int i = 0; i < 4; ++i) {
    auto res = Post(*router, /*stream=*/i % 2 == 0);
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->body, i % 2 == 0 ? kStreamBody : "{\"whole\":true}");
  }
  EXPECT_EQ(router->upstream_connections(), 1u);
  const std::vector<int> ports = backend.ports();
  ASSERT_EQ(ports.size(), 4u);
  EXPECT_EQ(std::set<int>(ports.begin(), ports.end()).size(), 1u) << "one connection for all";
  EXPECT_EQ(router->outstanding(), std::vector<int>{0});
}

TEST(RouterTest, AConnectionTheBackendClosesIsNotReused) {
  Backend backend(/*keep_alive_max=*/1);  // "Connection: close" after every answer
  RouterOptions o;
  o.backends = {backend.url()};
  auto router = StartRouter(o);
  ASSERT_NE(router, nullptr);
  for (int i = 0; i < 3; ++i) {
    auto res = Post(*router, /*stream=*/true);
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->body, kStreamBody);
  }
  EXPECT_EQ(router->upstream_connections(), 3u);
}

TEST(RouterTest, AConnectionIdleTooLongIsNotReused) {
  Backend backend;
  RouterOptions o;
  o.backends = {backend.url()};
  o.upstream_idle_s = 0.0;  // every idle connection is too old
  auto router = StartRouter(o);
  ASSERT_NE(router, nullptr);
  for (int i = 0; i < 2; ++i) {
    auto res = Post(*router, /*stream=*/true);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->body, kStreamBody);
  }
  EXPECT_EQ(router->upstream_connections(), 2u);
}

TEST(RouterTest, NoIdleConnectionsKeptWhenThePoolIsEmptySized) {
  Backend backend;
  RouterOptions o;
  o.backends = {backend.url()};
  o.max_idle_upstream = 0;
  auto router = StartRouter(o);
  ASSERT_NE(router, nullptr);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(Post(*router, /*stream=*/false));
  EXPECT_EQ(router->upstream_connections(), 2u);
}

// A loopback port nothing listens on (bound, then closed); 0 when none could be had.
int ClosedPort() {
  int port = 0;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

TEST(RouterTest, ABackendThatIsDownGets502) {
  const int port = ClosedPort();
  ASSERT_GT(port, 0);
  RouterOptions o;
  o.backends = {"http://127.0.0.1:" + std::to_string(port)};
  auto router = StartRouter(o);
  ASSERT_NE(router, nullptr);
  for (bool stream : {true, false}) {
    auto res = Post(*router, stream);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 502);
    EXPECT_NE(res->body.find("decode instance"), std::string::npos) << res->body;
  }
  EXPECT_EQ(router->outstanding(), std::vector<int>{0});
}

// A decode instance that is down (dead or restarting under `pdserve up`): requests sent its way
// are rerouted to the live one, and new ones pass it over; none gets a 502.
TEST(RouterTest, RequestsRefusedByADownBackendGoToAnotherOne) {
  const int port = ClosedPort();
  ASSERT_GT(port, 0);
  Backend live;
  RouterOptions o;
  o.backends = {"http://127.0.0.1:" + std::to_string(port), live.url()};
  auto router = StartRouter(o);
  ASSERT_NE(router, nullptr);
  for (int i = 0; i < 6; ++i) {
    auto res = Post(*router, /*stream=*/i % 2 == 0);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
  }
  EXPECT_EQ(live.ports().size(), 6u);
  EXPECT_EQ(router->outstanding(), (std::vector<int>{0, 0}));
}

TEST(RouterTest, AClientThatGoesAwayMidStreamClosesTheUpstream) {
  const std::string kThreeEvents = "data: x\n\n\r\n9\r\ndata: x\n\n\r\n9\r\ndata: x\n\n";
  Backend backend(100, /*endless=*/true);
  RouterOptions o;
  o.backends = {backend.url()};
  auto router = StartRouter(o);
  ASSERT_NE(router, nullptr);
  {
    testing::RawConnection c(router->port());
    ASSERT_TRUE(c.ok());
    const std::string body = "{\"stream\":true}";
    ASSERT_TRUE(
        c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body));
    // Three events in chunked encoding (chunks of 9 bytes) have come through the relay (its
    // provider parked, the reading thread writing them).
    EXPECT_NE(c.ReadUntil(kThreeEvents, std::chrono::seconds(10)).find(kThreeEvents),
              std::string::npos);
  }  // closed
  EXPECT_TRUE(
      testing::WaitFor([&] { return backend.endless_aborted(); }, std::chrono::seconds(10)));
  EXPECT_TRUE(testing::WaitFor([&] { return router->outstanding() == std::vector<int>{0}; },
                               std::chrono::seconds(10)));
}

TEST(RouterTest, TracesEachStreamedRequestsMilestonesInOrder) {
  Backend backend;
  Tracer tracer;
  RouterOptions o;
  o.backends = {backend.url()};
  o.tracer = &tracer;
  auto router = StartRouter(o);
  ASSERT_NE(router, nullptr);
  auto res = Post(*router, /*stream=*/true);
  ASSERT_TRUE(res);
  router->Stop();  // the last instant is recorded by the time the HTTP threads are joined
  std::vector<std::string> names;
  int64_t last_ts = 0;
  for (const TraceEvent& e : tracer.Events()) {
    names.push_back(e.name);
    EXPECT_GE(e.ts_ns, last_ts) << e.name;
    last_ts = e.ts_ns;
  }
  const std::vector<std::string> want = {"router request", "router upstream send",
                                         "router upstream status", "router first chunk read",
                                         "router first chunk written"};
  EXPECT_EQ(names, want);
}

}  // namespace
}  // namespace pd::server
