// HTTP limits, overload shedding and client disconnects, against a fake engine.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>

#include "server/http_server.h"
#include "server/test_fakes.h"
#include "server/test_http.h"

namespace pd::server {
namespace {

using json = nlohmann::json;
using testing::FakeAsyncEngine;
using testing::FakeEngineOptions;
using testing::FakeTokenizer;
using ::testing::HasSubstr;
using testing::RawConnection;
using ::testing::StartsWith;
using testing::ThreadCount;
using testing::WaitFor;
using namespace std::chrono_literals;

class LimitsTest : public ::testing::Test {
 protected:
  void Start(FakeEngineOptions eo, ServerOptions so) {
    if (eo.script.empty()) eo.script = {'a', 'b', 'c'};
    engine_ = std::make_unique<FakeAsyncEngine>(eo);
    so.port = 0;
    so.served_model_name = "tiny";
    so.max_model_len = 1 << 20;
    so.http.max_body_bytes = 64 << 10;
    so.http.max_header_bytes = 8 << 10;
    so.http.max_header_count = 32;
    auto server = OpenAiServer::Create(so, engine_.get(), &tokenizer_);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    if (engine_) engine_->Release();
    if (server_) server_->Stop();
    server_.reset();
    engine_.reset();
  }
  int port() const { return server_->port(); }
  bool Healthy() {
    httplib::Client c("127.0.0.1", port());
    auto r = c.Get("/health");
    return r && r->status == 200;
  }
  static std::string Request(const std::string& body, const std::string& extra_headers = "") {
    return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
           extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  }

  FakeTokenizer tokenizer_;
  std::unique_ptr<FakeAsyncEngine> engine_;
  std::unique_ptr<OpenAiServer> server_;
};

TEST_F(LimitsTest, OversizedContentLengthIs413WithoutReadingTheBody) {
  Start({}, {});
  RawConnection c(port());
  ASSERT_TRUE(
      c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"));
  std::string resp = c.ReadUntil("}}", 5s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(resp, HasSubstr("exceeds the limit of 65536 bytes"));
  EXPECT_THAT(resp, HasSubstr("\"type\":\"invalid_request_error\""));
  EXPECT_TRUE(Healthy());
}

TEST_F(LimitsTest, UnboundedChunkedBodyIsCutOff) {
  Start({}, {});
  RawConnection c(port());
  ASSERT_TRUE(
      c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk =
      "10000\r\n" + std::string(0x10000, 'x') + "\r\n";  // 64 KiB chunks, forever
  size_t sent = 0;
  bool answered = false;
  while (sent < (256u << 20)) {
    if (c.Readable()) {
      answered = true;
      break;
    }
    if (!c.Send(chunk)) break;  // the server closed the connection
    sent += chunk.size();
  }
  // The server stopped reading after its budget; only socket buffers absorbed the rest.
  EXPECT_LT(sent, 64u << 20);
  EXPECT_TRUE(answered);
  std::string resp = c.ReadUntil("}}", 5s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(resp, HasSubstr("request body exceeds the limit"));
  EXPECT_EQ(engine_->num_submitted(), 0);
  EXPECT_TRUE(Healthy());
}

TEST_F(LimitsTest, LargeChunkedBodyUnderTheLimitIsAccepted) {
  Start({}, {});
  RawConnection c(port());
  const std::string body =
      R"({"prompt":"hi","max_tokens":2,"user":")" + std::string(40000, 'u') + "\"}";
  std::string req =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (size_t off = 0; off < body.size(); off += 1000) {
    std::string part = body.substr(off, 1000);
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%zx", part.size());
    req += std::string(hex) + "\r\n" + part + "\r\n";
  }
  req += "0\r\n\r\n";
  ASSERT_TRUE(c.Send(req));
  std::string resp = c.ReadUntil("\"total_tokens\"", 5s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 200"));
}

TEST_F(LimitsTest, TooManyHeadersIs431) {
  Start({}, {});
  std::string headers;
  for (int i = 0; i < 40; ++i) headers += "X-H" + std::to_string(i) + ": v\r\n";
  RawConnection c(port());
  ASSERT_TRUE(c.Send(Request(R"({"prompt":"hi"})", headers)));
  std::string resp = c.ReadUntil("}}", 5s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 431"));
  EXPECT_THAT(resp, HasSubstr("too many request headers"));
  EXPECT_EQ(engine_->num_submitted(), 0);
}

TEST_F(LimitsTest, EndlessHeadersAre431) {
  Start({}, {});
  RawConnection c(port());
  ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\nHost: x\r\n"));
  size_t sent = 0;
  while (sent < (64u << 20) && !c.Readable()) {
    std::string h = "X-Flood: " + std::string(1000, 'f') + "\r\n";
    if (!c.Send(h)) break;
    sent += h.size();
  }
  EXPECT_LT(sent, 16u << 20);
  std::string resp = c.ReadUntil("}}", 5s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 431"));
  EXPECT_THAT(resp, HasSubstr("request headers exceed the limit of 8192 bytes"));
  EXPECT_TRUE(Healthy());
}

TEST_F(LimitsTest, OneHugeHeaderIs431) {
  Start({}, {});
  RawConnection c(port());
  ASSERT_TRUE(c.Send(Request(R"({"prompt":"hi"})", "X-Big: " + std::string(20000, 'b') + "\r\n")));
  std::string resp = c.ReadUntil("}}", 5s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 431"));
  EXPECT_TRUE(Healthy());
}

// A body trickled a byte at a time, each byte well within the per-read timeout, is cut off at the
// whole-request deadline with 408, and the connection is closed.
TEST_F(LimitsTest, TrickledBodyIs408AtTheRequestDeadline) {
  ServerOptions so;
  so.http.read_timeout_ms = 20000;
  so.http.request_timeout_ms = 500;
  Start({}, so);
  RawConnection c(port());
  ASSERT_TRUE(
      c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
             "application/json\r\nContent-Length: 1000\r\n\r\n{"));
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (!c.Readable(50) && std::chrono::steady_clock::now() < give_up) c.Send(" ");
  std::string resp = c.ReadUntil("}}", 5s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 408"));
  EXPECT_THAT(resp, HasSubstr("request not received in time"));
  EXPECT_THAT(resp, HasSubstr("500 ms for the whole request"));
  EXPECT_THAT(resp, HasSubstr("Connection: close"));
  // The refusal is counted once the server's thread is back from answering, which may be just
  // after the client read the answer: wait for the count (bounded).
  httplib::Client client("127.0.0.1", port());
  double refused = 0;
  for (const auto until = std::chrono::steady_clock::now() + 5s;
       refused < 1 && std::chrono::steady_clock::now() < until;) {
    auto metrics = client.Get("/metrics");
    ASSERT_TRUE(metrics);
    refused = testing::MetricValue(metrics->body, "pdserve:http_refused_total{reason=\"timeout\"}");
  }
  EXPECT_EQ(refused, 1);
  EXPECT_TRUE(Healthy());
}

// A request line that never ends is answered 408 once the head's deadline passes.
TEST_F(LimitsTest, UnfinishedRequestLineIs408) {
  ServerOptions so;
  so.http.read_timeout_ms = 300;
  Start({}, so);
  RawConnection c(port());
  ASSERT_TRUE(c.Send("POST /v1/compl"));
  std::string resp = c.ReadUntil("}}", 10s);
  EXPECT_THAT(resp, StartsWith("HTTP/1.1 408"));
  EXPECT_THAT(resp, HasSubstr("request not received in time"));
  EXPECT_TRUE(Healthy());
}

TEST_F(LimitsTest, EngineFullIs429WithRetryAfterAndAdmittedRequestsComplete) {
  FakeEngineOptions eo;
  eo.max_pending = 2;
  eo.start_held = true;
  Start(eo, {});
  std::vector<std::unique_ptr<RawConnection>> admitted;
  for (int i = 0; i < 2; ++i) {
    admitted.push_back(std::make_unique<RawConnection>(port()));
    ASSERT_TRUE(admitted.back()->Send(Request(R"({"prompt":"hi","max_tokens":4})")));
  }
  ASSERT_TRUE(WaitFor([&] { return engine_->num_active() == 2; }, 5s));
  httplib::Client c("127.0.0.1", port());
  auto r = c.Post("/v1/completions", R"({"prompt":"hi","max_tokens":4})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_THAT(json::parse(r->body)["error"]["message"].get<std::string>(), HasSubstr("overloaded"));
  engine_->Release();
  for (auto& conn : admitted) {
    std::string resp = conn->ReadUntil("\"total_tokens\"", 5s);
    EXPECT_THAT(resp, StartsWith("HTTP/1.1 200"));
    EXPECT_THAT(resp, HasSubstr("\"text\":\"abca\""));
  }
}

TEST_F(LimitsTest, ServerInflightCapIs503) {
  FakeEngineOptions eo;
  eo.start_held = true;
  ServerOptions so;
  so.max_inflight_requests = 1;
  Start(eo, so);
  RawConnection first(port());
  ASSERT_TRUE(first.Send(Request(R"({"prompt":"hi","max_tokens":2})")));
  ASSERT_TRUE(WaitFor([&] { return engine_->num_active() == 1; }, 5s));
  httplib::Client c("127.0.0.1", port());
  auto r = c.Post("/v1/completions", R"({"prompt":"hi","max_tokens":2})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  engine_->Release();
  EXPECT_THAT(first.ReadUntil("total_tokens", 5s), StartsWith("HTTP/1.1 200"));
}

TEST_F(LimitsTest, ClientDisconnectMidStreamAbortsTheRequest) {
  FakeEngineOptions eo;
  eo.step_interval_us = 1000;
  Start(eo, {});
  RawConnection c(port());
  ASSERT_TRUE(c.Send(Request(R"({"prompt":"hi","max_tokens":100000,"stream":true})")));
  std::string got = c.ReadUntil("\"text\":\"b\"", 5s);
  ASSERT_THAT(got, HasSubstr("\"text\":\"b\""));
  c.Close();
  EXPECT_TRUE(WaitFor([&] { return engine_->aborted().size() == 1; }, 5s));
  EXPECT_TRUE(WaitFor([&] { return engine_->num_active() == 0; }, 5s));
  httplib::Client h("127.0.0.1", port());
  EXPECT_TRUE(WaitFor(
      [&] {
        auto m = h.Get("/metrics");
        return m && testing::MetricValue(m->body,
                                         "pdserve:request_success_total{model_name=\"tiny\","
                                         "finished_reason=\"abort\"}") == 1;
      },
      5s));
}

TEST_F(LimitsTest, ClientDisconnectWhileWaitingNonStreamingAbortsTheRequest) {
  FakeEngineOptions eo;
  eo.start_held = true;
  Start(eo, {});
  RawConnection c(port());
  ASSERT_TRUE(c.Send(Request(R"({"prompt":"hi","max_tokens":5})")));
  ASSERT_TRUE(WaitFor([&] { return engine_->num_active() == 1; }, 5s));
  c.Close();
  EXPECT_TRUE(WaitFor([&] { return engine_->aborted().size() == 1; }, 5s));
  EXPECT_TRUE(WaitFor([&] { return engine_->num_active() == 0; }, 5s));
}

TEST_F(LimitsTest, ManyOpenStreamsTakeNoThreadEach) {
  constexpr int kStreams = 200;  // far more than HTTP threads
  FakeEngineOptions eo;
  eo.start_held = true;
  eo.max_pending = kStreams;
  ServerOptions so;
  so.http.num_threads = 4;
  so.http.max_queued_connections = kStreams;
  Start(eo, so);
  ASSERT_TRUE(Healthy());  // every HTTP thread has started
  const int threads_before = ThreadCount();
  std::vector<std::unique_ptr<RawConnection>> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.push_back(std::make_unique<RawConnection>(port()));
    ASSERT_TRUE(clients.back()->Send(
        Request(R"({"prompt":"hi","max_tokens":3,"stream":true,"ignore_eos":true})")));
  }
  ASSERT_TRUE(WaitFor([&] { return engine_->num_submitted() == kStreams; }, 20s))
      << engine_->num_submitted();
  EXPECT_EQ(ThreadCount(), threads_before) << "no thread per stream";
  engine_->Release();
  for (auto& c : clients) {
    const std::string got = c->ReadUntil("\r\n0\r\n\r\n", 20s);
    EXPECT_THAT(got, HasSubstr("\"text\":\"c\""));
    EXPECT_THAT(got, HasSubstr("\"finish_reason\":\"length\""));
    EXPECT_THAT(got, HasSubstr("data: [DONE]\n\n\r\n0\r\n\r\n")) << "a clean chunked end";
  }
  EXPECT_TRUE(WaitFor([&] { return engine_->num_active() == 0; }, 5s));
}

TEST_F(LimitsTest, AKeptAliveConnectionCarriesStreamedAndWholeAnswers) {
  Start({}, {});
  RawConnection c(port());
  const std::string stream = Request(R"({"prompt":"hi","max_tokens":2,"stream":true})");
  const std::string whole = Request(R"({"prompt":"hi","max_tokens":2})");
  ASSERT_TRUE(c.Send(stream));
  ASSERT_THAT(c.ReadUntil("[DONE]\n\n\r\n0\r\n\r\n", 5s), HasSubstr("Connection: keep-alive"));
  ASSERT_TRUE(c.Send(whole));
  ASSERT_THAT(c.ReadUntil("total_tokens", 5s), HasSubstr("\"object\":\"text_completion\""));
  ASSERT_TRUE(c.Send(stream));  // a third answer on the same connection, streamed again
  std::string got;
  auto streams_ended = [&] {
    got = c.ReadUntil("(never sent)", 20ms);  // reads what has come
    size_t n = 0;
    for (size_t at = got.find("data: [DONE]"); at != std::string::npos;
         at = got.find("data: [DONE]", at + 1))
      ++n;
    return n == 2;
  };
  EXPECT_TRUE(WaitFor(streams_ended, 5s)) << got;
  EXPECT_TRUE(WaitFor([&] { return engine_->num_active() == 0; }, 5s));
}

}  // namespace
}  // namespace pd::server
