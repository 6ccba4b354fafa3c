// Graceful drain: the drain sequence (server/drain.h), the OpenAI server refusing new requests and
// ending those still running at the deadline, the router refusing new requests, rerouting the
// ones a draining decode instance refuses, and following SetBackends.
#include "server/drain.h"

#include <httplib.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/http_server.h"
#include "server/router.h"
#include "server/test_fakes.h"
#include "server/test_http.h"

namespace pd::server {
namespace {

using namespace std::chrono_literals;
using testing::WaitFor;

TEST(DrainTest, WaitsForTheWorkInFlightThenReports) {
  std::atomic<int> left{3};
  std::atomic<bool> began{false};
  bool ended = false;
  std::thread worker([&] {
    while (!began) std::this_thread::yield();  // the work finishes only once the drain began
    while (left > 0) --left;
  });
  DrainHooks hooks;
  hooks.begin = [&] { began = true; };
  hooks.in_flight = [&] { return left.load(); };
  hooks.end_running = [&](const std::string&) { ended = true; };
  const DrainReport r = Drain(hooks, 30.0, "test");
  worker.join();
  EXPECT_GE(r.in_flight_at_start, 0);
  EXPECT_EQ(r.ended_at_deadline, 0);
  EXPECT_FALSE(ended);
}

// Work that begins during the linger (a request that was on the wire) is waited for too: the
// third look at the work in flight (after the linger) finds one piece, the fourth none.
TEST(DrainTest, WorkThatBeginsDuringTheLingerIsWaitedFor) {
  int looks = 0;
  bool ended = false;
  DrainHooks hooks;
  hooks.in_flight = [&] { return ++looks == 3 ? 1 : 0; };
  hooks.end_running = [&](const std::string&) { ended = true; };
  hooks.linger_s = 0.01;
  const DrainReport r = Drain(hooks, 30.0, "prefill instance");
  EXPECT_EQ(looks, 4);
  EXPECT_EQ(r.ended_at_deadline, 0);
  EXPECT_FALSE(ended);
  // Without a linger the drain ends at the first look that finds nothing.
  looks = 0;
  hooks.linger_s = 0.0;
  (void)Drain(hooks, 30.0, "prefill instance");
  EXPECT_EQ(looks, 2);
}

TEST(DrainTest, EndsWhatIsLeftAtTheDeadlineSayingWhy) {
  int left = 2;
  std::string why;
  DrainHooks hooks;
  hooks.in_flight = [&] { return left; };
  hooks.end_running = [&](const std::string& w) {
    why = w;
    left = 0;
  };
  const DrainReport r = Drain(hooks, 0.0, "serve");
  EXPECT_EQ(r.in_flight_at_start, 2);
  EXPECT_EQ(r.ended_at_deadline, 2);
  EXPECT_NE(why.find("serve is shutting down: its drain deadline (--drain-timeout-s 0)"),
            std::string::npos)
      << why;
}

// A decode instance standing in: answers 200, or (draining) 503 with kDrainingHeader.
class FakeDecode {
 public:
  explicit FakeDecode(bool draining) {
    server_.Post("/v1/completions",
                 [this, draining](const httplib::Request&, httplib::Response& res) {
                   ++requests_;
                   if (draining) {
                     res.status = 503;
                     res.set_header(kDrainingHeader, "1");
                     res.set_header("Retry-After", "1");
                     return res.set_content("{\"error\":{}}", "application/json");
                   }
                   res.set_content("{\"ok\":true}", "application/json");
                 });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    EXPECT_TRUE(WaitFor([this] { return server_.is_running(); }, 10s));
  }
  ~FakeDecode() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_.load(); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> requests_{0};
};

std::unique_ptr<Router> StartRouter(RouterOptions o) {
  o.port = 0;
  o.http.num_threads = 2;
  auto r = Router::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return nullptr;
  EXPECT_TRUE((*r)->Start().ok());
  return std::move(r).value();
}

httplib::Result Complete(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10, 0);
  return c.Post("/v1/completions", "{\"prompt\":\"x\"}", "application/json");
}

TEST(RouterDrainTest, RequestsADrainingDecodeInstanceRefusesGoToAnotherOne) {
  FakeDecode draining(/*draining=*/true), live(/*draining=*/false);
  RouterOptions o;
  o.backends = {draining.url(), live.url()};
  auto router = StartRouter(o);
  ASSERT_NE(router, nullptr);
  for (int i = 0; i < 6; ++i) {
    auto res = Complete(router->port());
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
  }
  EXPECT_EQ(live.requests(), 6);
  EXPECT_GE(draining.requests(), 1);  // asked once, then passed over
  EXPECT_LT(draining.requests(), 6);
}

TEST(RouterDrainTest, ADrainingRouterRefusesNewRequestsWith503AndRetryAfter) {
  FakeDecode live(false);
  RouterOptions o;
  o.backends = {live.url()};
  auto router = StartRouter(o);
  ASSERT_NE(router, nullptr);
  router->BeginDrain();
  auto res = Complete(router->port());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_TRUE(res->has_header("Retry-After"));
  EXPECT_NE(res->body.find("draining"), std::string::npos);
  httplib::Client c("127.0.0.1", router->port());
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(live.requests(), 0);
}

TEST(RouterDrainTest, DynamicBackendsFollowSetBackends) {
  FakeDecode a(false), b(false);
  RouterOptions o;
  o.dynamic_backends = true;
  auto router = StartRouter(o);
  ASSERT_NE(router, nullptr);
  auto none = Complete(router->port());
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 503);  // nobody registered yet
  EXPECT_TRUE(none->has_header("Retry-After"));
  ASSERT_TRUE(router->SetBackends({a.url()}).ok());
  for (int i = 0; i < 2; ++i) EXPECT_EQ(Complete(router->port())->status, 200);
  ASSERT_TRUE(router->SetBackends({b.url()}).ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Complete(router->port())->status, 200);
  EXPECT_EQ(a.requests(), 2);
  EXPECT_EQ(b.requests(), 3);
  EXPECT_EQ(router->backends(), std::vector<std::string>{b.url()});
  EXPECT_FALSE(router->SetBackends({"ftp://x"}).ok());
}

class ServerDrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::FakeEngineOptions eo;
    for (int i = 0; i < 50; ++i) eo.script.push_back('a');
    eo.start_held = true;  // generates nothing until Release
    engine_ = std::make_unique<testing::FakeAsyncEngine>(eo);
    ServerOptions so;
    so.port = 0;
    so.served_model_name = "tiny";
    so.max_model_len = 256;
    auto s = OpenAiServer::Create(so, engine_.get(), &tokenizer_);
    ASSERT_TRUE(s.ok());
    server_ = std::move(s).value();
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  testing::FakeTokenizer tokenizer_;
  std::unique_ptr<testing::FakeAsyncEngine> engine_;
  std::unique_ptr<OpenAiServer> server_;
};

TEST_F(ServerDrainTest, NewRequestsGet503WhileThoseInFlightFinish) {
  int status = -1;
  std::string body;
  std::thread client([&] {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(10, 0);
    auto r = c.Post("/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":4}", "application/json");
    if (r) {
      status = r->status;
      body = r->body;
    }
  });
  ASSERT_TRUE(WaitFor([&] { return server_->inflight() == 1; }, 10s));
  server_->BeginDrain();
  httplib::Client c("127.0.0.1", server_->port());
  auto refused =
      c.Post("/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":4}", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(refused->get_header_value(kDrainingHeader), "1");
  EXPECT_TRUE(refused->has_header("Retry-After"));
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  engine_->Release();  // the request in flight finishes
  client.join();
  EXPECT_EQ(status, 200) << body;
  EXPECT_TRUE(WaitFor([&] { return server_->inflight() == 0; }, 10s));
}

TEST_F(ServerDrainTest, RequestsStillRunningAtTheDeadlineEndWithTheReason) {
  std::string body;
  std::thread client([&] {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(10, 0);
    auto r = c.Post("/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":4,\"stream\":true}",
                    "application/json");
    if (r) body = r->body;
  });
  ASSERT_TRUE(WaitFor([&] { return server_->inflight() == 1; }, 10s));
  DrainHooks hooks;
  hooks.begin = [&] { server_->BeginDrain(); };
  hooks.in_flight = [&] { return server_->inflight(); };
  hooks.end_running = [&](const std::string& why) { server_->EndRunning(why); };
  const DrainReport r = Drain(hooks, 0.05, "serve");
  client.join();
  EXPECT_EQ(r.ended_at_deadline, 1);
  EXPECT_NE(body.find("drain deadline"), std::string::npos) << body;
  EXPECT_TRUE(WaitFor([&] { return server_->inflight() == 0; }, 10s));
  EXPECT_TRUE(WaitFor([&] { return engine_->aborted().size() == 1; }, 10s));
}

}  // namespace
}  // namespace pd::server
