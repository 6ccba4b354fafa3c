// The router's event-loop relay against a decode stand-in that holds its streams open until told:
// many streams open at once on the router's fixed threads, the bound on open streams (429), a
// client that goes away freeing its upstream connection, and a decode instance that dies
// mid-stream giving the client an error event and a clean end.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/router.h"
#include "server/test_http.h"

namespace pd::server {
namespace {

std::string Chunk(const std::string& data) {
  char size[16];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + data + "\r\n";
}

void SendAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, 1000);
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0 && errno != EAGAIN) return;
    if (n > 0) off += static_cast<size_t>(n);
  }
}

// A decode instance stand-in on one thread: answers each request with an SSE head and
// "data: 0", then holds the stream open until Release(); then it writes "data: 1" and the end,
// or (die_on_release) closes the connection mid-stream. Requests after Release are answered at
// once the same way.
class GatedUpstream {
 public:
  // silent: a held request gets nothing at all until Release (a non-streamed answer being
  // computed), then the SSE head, "data: 0" and the rest.
  explicit GatedUpstream(bool die_on_release = false, bool silent = false)
      : die_(die_on_release), silent_(silent) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listen_fd_, 4096), 0);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~GatedUpstream() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int streaming() const { return streaming_.load(); }      // held open now
  int peer_closed() const { return peer_closed_.load(); }  // closed by the router while held
  void Release() { release_ = true; }

 private:
  struct Conn {
    int fd = -1;
    std::string in;
    bool held = false;
    bool head_sent = false;
  };

  void Finish(Conn& c) {
    if (!c.head_sent) SendAll(c.fd, kHead + Chunk("data: 0\n\n"));
    if (!die_) SendAll(c.fd, Chunk("data: 1\n\n") + "0\r\n\r\n");
    ::close(c.fd);
    c.fd = -1;
  }

  void OnReadable(Conn& c) {
    char buf[4096];
    const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      if (c.held) {
        streaming_.fetch_sub(1);
        peer_closed_.fetch_add(1);
      }
      ::close(c.fd);
      c.fd = -1;
      return;
    }
    c.in.append(buf, static_cast<size_t>(n));
    const size_t head_end = c.in.find("\r\n\r\n");
    if (c.held || head_end == std::string::npos) return;
    const size_t cl = c.in.find("Content-Length: ");
    const size_t body = cl == std::string::npos ? 0 : std::stoul(c.in.substr(cl + 16));
    if (c.in.size() < head_end + 4 + body) return;
    if (!silent_) {
      SendAll(c.fd, kHead + Chunk("data: 0\n\n"));
      c.head_sent = true;
    }
    if (release_) return Finish(c);
    c.held = true;
    streaming_.fetch_add(1);
  }

  void Run() {
    std::vector<Conn> conns;
    while (!stop_) {
      std::vector<pollfd> p{{listen_fd_, POLLIN, 0}};
      for (const Conn& c : conns) p.push_back({c.fd, POLLIN, 0});
      ::poll(p.data(), p.size(), 5);
      for (size_t i = 0; i < conns.size(); ++i) {
        if (p[i + 1].revents != 0) OnReadable(conns[i]);
      }
      for (int fd; (fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK)) >= 0;) {
        conns.push_back({fd, "", false, false});
      }
      for (Conn& c : conns) {
        if (release_ && c.held && c.fd >= 0) {
          streaming_.fetch_sub(1);
          Finish(c);
        }
      }
      std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
    }
    for (Conn& c : conns) ::close(c.fd);
  }

  static inline const std::string kHead =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
  const bool die_;
  const bool silent_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> release_{false};
  std::atomic<int> streaming_{0};
  std::atomic<int> peer_closed_{0};
};

std::unique_ptr<Router> StartRouter(const std::string& backend, int max_open_streams = 4096) {
  RouterOptions o;
  o.port = 0;
  o.backends = {backend};
  o.http.num_threads = 4;
  o.max_open_streams = max_open_streams;
  auto r = Router::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return nullptr;
  EXPECT_TRUE((*r)->Start().ok());
  return std::move(r).value();
}

const std::string kStreamRequest =
    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    "Content-Length: 15\r\n\r\n{\"stream\":true}";
constexpr auto kDeadline = std::chrono::seconds(20);

TEST(UpstreamRelayTest, ManyOpenStreamsShareTheRoutersFixedThreads) {
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &nofile);
  const int n = nofile.rlim_cur >= 4096 ? 500 : 200;  // 4 descriptors per stream in this process
  GatedUpstream upstream;
  auto router = StartRouter(upstream.url());
  ASSERT_NE(router, nullptr);
  {  // one request served: every HTTP thread has started
    httplib::Client c("127.0.0.1", router->port());
    ASSERT_TRUE(c.Get("/metrics"));
  }
  const int threads_before = testing::ThreadCount();
  std::vector<std::unique_ptr<testing::RawConnection>> clients;
  for (int i = 0; i < n; ++i) {
    clients.push_back(std::make_unique<testing::RawConnection>(router->port()));
    ASSERT_TRUE(clients.back()->ok());
    ASSERT_TRUE(clients.back()->Send(kStreamRequest));
  }
  ASSERT_TRUE(testing::WaitFor([&] { return upstream.streaming() == n; }, kDeadline))
      << upstream.streaming() << " of " << n;
  EXPECT_EQ(router->open_streams(), n);
  EXPECT_EQ(router->outstanding(), std::vector<int>{n});
  EXPECT_EQ(testing::ThreadCount(), threads_before) << "no thread per stream";
  for (auto& c : clients) {
    EXPECT_NE(c->ReadUntil("data: 0\n\n", kDeadline).find("data: 0\n\n"), std::string::npos);
  }
  upstream.Release();
  for (auto& c : clients) {
    const std::string got = c->ReadUntil("\r\n0\r\n\r\n", kDeadline);
    EXPECT_NE(got.find("200 OK"), std::string::npos);
    EXPECT_NE(got.find("9\r\ndata: 0\n\n\r\n9\r\ndata: 1\n\n\r\n0\r\n\r\n"), std::string::npos)
        << got;
  }
  EXPECT_TRUE(testing::WaitFor([&] { return router->open_streams() == 0; }, kDeadline));
  EXPECT_EQ(router->outstanding(), std::vector<int>{0});
}

TEST(UpstreamRelayTest, StreamsPastTheBoundGet429InOpenAiShape) {
  GatedUpstream upstream;
  auto router = StartRouter(upstream.url(), /*max_open_streams=*/2);
  ASSERT_NE(router, nullptr);
  testing::RawConnection a(router->port()), b(router->port());
  ASSERT_TRUE(a.Send(kStreamRequest) && b.Send(kStreamRequest));
  ASSERT_TRUE(testing::WaitFor([&] { return upstream.streaming() == 2; }, kDeadline));
  httplib::Client c("127.0.0.1", router->port());
  auto res = c.Post("/v1/completions", "{\"stream\":true}", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  auto body = nlohmann::json::parse(res->body);
  EXPECT_EQ(body["error"]["code"], 429);
  EXPECT_EQ(body["error"]["type"], "rate_limit_error") << res->body;
  EXPECT_NE(body["error"]["message"].get<std::string>().find("--max-open-streams"),
            std::string::npos);
  EXPECT_EQ(router->rejected(), 1u);
  upstream.Release();
  EXPECT_NE(a.ReadUntil("\r\n0\r\n\r\n", kDeadline).find("data: 1"), std::string::npos);
  EXPECT_NE(b.ReadUntil("\r\n0\r\n\r\n", kDeadline).find("data: 1"), std::string::npos);
  ASSERT_TRUE(testing::WaitFor([&] { return router->open_streams() == 0; }, kDeadline));
  res = c.Post("/v1/completions", "{\"stream\":true}", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "data: 0\n\ndata: 1\n\n");
}

TEST(UpstreamRelayTest, AClientThatDisconnectsFreesItsUpstream) {
  GatedUpstream upstream;
  auto router = StartRouter(upstream.url());
  ASSERT_NE(router, nullptr);
  {
    testing::RawConnection c(router->port());
    ASSERT_TRUE(c.Send(kStreamRequest));
    EXPECT_NE(c.ReadUntil("data: 0\n\n", kDeadline).find("data: 0"), std::string::npos);
  }  // closed mid-stream
  EXPECT_TRUE(testing::WaitFor([&] { return upstream.peer_closed() == 1; }, kDeadline));
  EXPECT_TRUE(testing::WaitFor([&] { return router->open_streams() == 0; }, kDeadline));
  EXPECT_EQ(router->outstanding(), std::vector<int>{0});
}

const std::string kWholeRequest =
    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    "Content-Length: 16\r\n\r\n{\"stream\":false}";

// A client waiting for a whole (non-streamed) answer that goes away before any of it came: the
// router notices, closes the upstream connection (the decode instance aborts the request and
// frees its pages) and counts it.
TEST(UpstreamRelayTest, AClientThatLeavesWhileWaitingForAWholeAnswerClosesTheUpstream) {
  GatedUpstream upstream(false, /*silent=*/true);
  auto router = StartRouter(upstream.url());
  ASSERT_NE(router, nullptr);
  {
    testing::RawConnection c(router->port());
    ASSERT_TRUE(c.Send(kWholeRequest));
    ASSERT_TRUE(testing::WaitFor([&] { return upstream.streaming() == 1; }, kDeadline));
  }  // closed with nothing answered
  EXPECT_TRUE(testing::WaitFor([&] { return upstream.peer_closed() == 1; }, kDeadline));
  EXPECT_TRUE(testing::WaitFor([&] { return router->open_streams() == 0; }, kDeadline));
  EXPECT_EQ(router->outstanding(), std::vector<int>{0});
  EXPECT_EQ(router->clients_gone(), 1u);
}

// The same when the client had already sent the start of its next request on the kept-alive
// connection: the bytes stay unread for the next exchange, yet the client's close is noticed.
TEST(UpstreamRelayTest, AClientThatLeavesAfterSendingMoreIsStillNoticed) {
  GatedUpstream upstream(false, /*silent=*/true);
  auto router = StartRouter(upstream.url());
  ASSERT_NE(router, nullptr);
  {
    testing::RawConnection c(router->port());
    ASSERT_TRUE(c.Send(kWholeRequest));
    ASSERT_TRUE(testing::WaitFor([&] { return upstream.streaming() == 1; }, kDeadline));
    ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\n"));
    EXPECT_FALSE(c.Readable(100));
  }
  EXPECT_TRUE(testing::WaitFor([&] { return upstream.peer_closed() == 1; }, kDeadline));
  EXPECT_TRUE(testing::WaitFor([&] { return router->open_streams() == 0; }, kDeadline));
  EXPECT_EQ(router->clients_gone(), 1u);
}

TEST(UpstreamRelayTest, AnUpstreamThatDiesMidStreamEndsTheStreamWithAnError) {
  GatedUpstream upstream(/*die_on_release=*/true);
  auto router = StartRouter(upstream.url());
  ASSERT_NE(router, nullptr);
  testing::RawConnection c(router->port());
  ASSERT_TRUE(c.Send(kStreamRequest));
  EXPECT_NE(c.ReadUntil("data: 0\n\n", kDeadline).find("data: 0"), std::string::npos);
  upstream.Release();
  const std::string got = c.ReadUntil("\r\n0\r\n\r\n", kDeadline);
  ASSERT_NE(got.find("\r\n0\r\n\r\n"), std::string::npos) << "a clean end: " << got;
  ASSERT_NE(got.find("data: {\"error\""), std::string::npos) << got;
  const std::string error_json = got.substr(got.find("data: {\"error\"") + 6);
  auto error = nlohmann::json::parse(error_json.substr(0, error_json.find("\n\n")));
  EXPECT_EQ(error["error"]["code"], 502);
  EXPECT_NE(error["error"]["message"].get<std::string>().find("decode instance"),
            std::string::npos);
  EXPECT_TRUE(testing::WaitFor([&] { return router->open_streams() == 0; }, kDeadline));
}

// The answers read so far on `c` that ended (a chunked body's last chunk), waiting up to
// `timeout` for `n` of them.
int ReadEndedAnswers(testing::RawConnection& c, int n, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int ended = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string got = c.ReadUntil("(never sent)", std::chrono::milliseconds(20));
    ended = 0;
    for (size_t at = got.find("\r\n0\r\n\r\n"); at != std::string::npos;
         at = got.find("\r\n0\r\n\r\n", at + 1))
      ++ended;
    if (ended >= n) break;
  }
  return ended;
}

TEST(UpstreamRelayTest, AKeptAliveClientConnectionCarriesStreamAfterStream) {
  GatedUpstream upstream;
  upstream.Release();  // every request answered whole at once
  auto router = StartRouter(upstream.url());
  ASSERT_NE(router, nullptr);
  testing::RawConnection c(router->port());
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(c.Send(kStreamRequest)) << i;
    ASSERT_EQ(ReadEndedAnswers(c, i, kDeadline), i);
  }
  const std::string got = c.ReadUntil("(never sent)", std::chrono::milliseconds(1));
  EXPECT_NE(got.find("Connection: keep-alive"), std::string::npos) << got;
  EXPECT_EQ(got.find("Connection: close"), std::string::npos) << got;
  // Asking for the close is honoured.
  ASSERT_TRUE(
      c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
             "Content-Length: 15\r\n\r\n{\"stream\":true}"));
  ASSERT_EQ(ReadEndedAnswers(c, 4, kDeadline), 4);
  EXPECT_NE(c.ReadUntil("(never sent)", kDeadline).find("Connection: close"), std::string::npos);
}

}  // namespace
}  // namespace pd::server
