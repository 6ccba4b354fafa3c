// LimitedHttpServer's connection handling: a full connection queue is answered 503 at once, and
// connections with nothing to read (new or kept alive between requests) wait on the idle loop
// rather than on an HTTP thread, and are closed once idle past the keep-alive timeout.
#include "server/http_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

#include "server/drain.h"
#include "server/test_http.h"

namespace pd::server {
namespace {

using ::testing::HasSubstr;
using testing::RawConnection;
using ::testing::StartsWith;
using testing::WaitFor;
using namespace std::chrono_literals;

constexpr char kHealth[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";

class Served {
 public:
  explicit Served(HttpLimits limits) : http_(limits) {
    http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("OK", "text/plain");
    });
    port_ = http_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { http_.listen_after_bind(); });
    EXPECT_TRUE(WaitFor([&] { return http_.is_running(); }, 5s));
  }
  ~Served() {
    http_.stop();
    thread_.join();
  }
  LimitedHttpServer& http() { return http_; }
  int port() const { return port_; }

 private:
  LimitedHttpServer http_;
  int port_ = 0;
  std::thread thread_;
};

TEST(HttpTransportTest, FullConnectionQueueIs503) {
  HttpLimits l;
  l.num_threads = 1;
  l.max_queued_connections = 1;
  Served s(l);
  RawConnection busy(s.port());  // occupies the only thread: its request head is unfinished
  ASSERT_TRUE(busy.Send("GET /health HTTP/1.1\r\n"));
  ASSERT_TRUE(WaitFor([&] { return s.http().num_busy_threads() == 1; }, 5s));
  RawConnection queued(s.port());    // waits in the queue
  RawConnection rejected(s.port());  // finds the queue full
  std::string resp = rejected.ReadUntil("}}", 5s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(resp, HasSubstr("Retry-After: 1"));
  // Unread, so not started: a router may send it to another instance.
  EXPECT_THAT(resp, HasSubstr(std::string(kDrainingHeader) + ": 1"));
  EXPECT_EQ(s.http().num_rejected_connections(), 1);
  ASSERT_TRUE(busy.Send("Host: x\r\n\r\n"));  // finished: served, then parked
  EXPECT_THAT(busy.ReadUntil("OK", 5s), StartsWith("HTTP/1.1 200"));
  ASSERT_TRUE(queued.Send(kHealth));
  EXPECT_THAT(queued.ReadUntil("OK", 5s), StartsWith("HTTP/1.1 200"));
}

TEST(HttpTransportTest, IdleConnectionsHoldNoThreadAndAreServedWhenTheyAsk) {
  HttpLimits l;
  l.num_threads = 1;
  l.keep_alive_timeout_ms = 60000;
  Served s(l);
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 20; ++i) {  // twenty kept-alive connections on one thread
    idle.push_back(std::make_unique<RawConnection>(s.port()));
    ASSERT_TRUE(idle.back()->Send(kHealth));
    ASSERT_THAT(idle.back()->ReadUntil("OK", 5s), StartsWith("HTTP/1.1 200"));
  }
  // The thread counts itself idle just after it parks the connection: wait for both.
  EXPECT_TRUE(WaitFor(
      [&] { return s.http().num_parked_connections() == 20 && s.http().num_busy_threads() == 0; },
      5s))
      << s.http().num_parked_connections() << " parked, " << s.http().num_busy_threads() << " busy";
  RawConnection fresh(s.port());  // still served at once
  ASSERT_TRUE(fresh.Send(kHealth));
  EXPECT_THAT(fresh.ReadUntil("OK", 5s), StartsWith("HTTP/1.1 200"));
  for (auto& c : idle) {  // each one's second request, on the same connection
    ASSERT_TRUE(c->Send("GET /missing HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_THAT(c->ReadUntil("no route for GET /missing", 5s), HasSubstr("HTTP/1.1 404"));
  }
}

TEST(HttpTransportTest, AConnectionIdlePastTheKeepAliveTimeoutIsClosed) {
  HttpLimits l;
  l.keep_alive_timeout_ms = 100;
  Served s(l);
  RawConnection c(s.port());
  ASSERT_TRUE(c.Send(kHealth));
  ASSERT_THAT(c.ReadUntil("OK", 5s), StartsWith("HTTP/1.1 200"));
  // The server closes it: ReadUntil returns at the close, long before its deadline.
  const auto start = std::chrono::steady_clock::now();
  c.ReadUntil("never sent", 10s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_TRUE(WaitFor([&] { return s.http().num_parked_connections() == 0; }, 5s));
}

// Idle connections are bounded: past max_idle_connections a new connection with nothing sent yet
// is answered 503 and closed, and one that is not idle (it sent its request) is served.
TEST(HttpTransportTest, IdleConnectionsBeyondTheLimitAreRefused) {
  HttpLimits l;
  l.num_threads = 2;
  l.max_idle_connections = 3;
  l.keep_alive_timeout_ms = 60000;
  Served s(l);
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 3; ++i) {  // they send nothing
    idle.push_back(std::make_unique<RawConnection>(s.port()));
    ASSERT_TRUE(WaitFor([&] { return s.http().num_parked_connections() == i + 1; }, 5s));
  }
  RawConnection refused(s.port());
  std::string resp = refused.ReadUntil("}}", 5s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(resp, HasSubstr("too many idle connections"));
  EXPECT_THAT(resp, HasSubstr(std::string(kDrainingHeader) + ": 1"));
  EXPECT_EQ(s.http().num_parked_connections(), 3);
  EXPECT_EQ(s.http().num_rejected_connections(), 1);
  EXPECT_THAT(s.http().RefusedMetricsText(),
              HasSubstr("pdserve:http_refused_total{reason=\"connections\"} 1"));
  // A parked one that asks is served, and leaves room for another.
  ASSERT_TRUE(idle[0]->Send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  EXPECT_THAT(idle[0]->ReadUntil("OK", 5s), StartsWith("HTTP/1.1 200"));
  ASSERT_TRUE(WaitFor([&] { return s.http().num_parked_connections() == 2; }, 5s));
  RawConnection later(s.port());
  EXPECT_TRUE(WaitFor([&] { return s.http().num_parked_connections() == 3; }, 5s));
  EXPECT_FALSE(later.Readable(50));
}

}  // namespace
}  // namespace pd::server
