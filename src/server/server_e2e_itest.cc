// End to end: `pdserve serve` as a separate process with a tiny synthetic qwen3 model, driven
// over HTTP: every endpoint streaming and not, every bad-input case, 200 requests with
// cancellations, and overload from `pdserve bench` with bounded memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/test_http.h"
#include "server/test_process.h"

namespace pd::server {
namespace {

using json = nlohmann::json;
using testing::ChildProcess;
using ::testing::HasSubstr;
using testing::MetricValue;
using testing::RawConnection;
using testing::SseData;
using testing::WaitFor;
using namespace std::chrono_literals;

const std::string kBinary = PDSERVE_BINARY;
const std::string kLabels = "{model_name=\"tiny\"";

std::string ModelDir() {
  static const std::string dir = [] {
    std::string d = (std::filesystem::temp_directory_path() /
                     ("pdserve_e2e_model_" + std::to_string(::getpid())))
                        .string();
    std::string out;
    int rc = testing::RunCommand(
        {kBinary, "make-model", "--arch", "qwen3", "--preset", "tiny", "--seed", "3", "--out", d},
        &out, 120s);
    EXPECT_EQ(rc, 0) << out;
    return d;
  }();
  return dir;
}

// A running `pdserve serve` on a free loopback port.
class Server {
 public:
  explicit Server(std::vector<std::string> extra, int max_model_len = 256) {
    std::vector<std::string> argv = {kBinary,
                                     "serve",
                                     "--model",
                                     ModelDir(),
                                     "--port",
                                     "0",
                                     "--served-model-name",
                                     "tiny",
                                     "--max-model-len",
                                     std::to_string(max_model_len),
                                     "--threads",
                                     "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    EXPECT_TRUE(process_.Start(argv));
    std::string line = process_.WaitForLine("on http://127.0.0.1:", 60s);
    EXPECT_FALSE(line.empty()) << process_.output();
    port_ = std::atoi(line.substr(line.rfind(':') + 1).c_str());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_read_timeout(60, 0);
    EXPECT_TRUE(WaitFor(
        [&] {
          auto r = client_->Get("/health");
          return r && r->status == 200;
        },
        30s));
  }
  ~Server() {
    client_.reset();
    EXPECT_EQ(process_.Stop(SIGTERM, 30s), 0) << process_.output();
  }
  int port() const { return port_; }
  httplib::Client& client() { return *client_; }
  ChildProcess& process() { return process_; }
  json Post(const std::string& path, const std::string& body, int expected_status = 200) {
    auto r = client_->Post(path.c_str(), body, "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return json();
    EXPECT_EQ(r->status, expected_status) << path << " " << body << " -> " << r->body;
    return json::parse(r->body, nullptr, false);
  }
  std::string Stream(const std::string& path, const std::string& body) {
    auto r = client_->Post(path.c_str(), body, "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r ? r->body : "";
  }
  std::string Metrics() {
    auto r = client_->Get("/metrics");
    return r ? r->body : "";
  }

 private:
  ChildProcess process_;
  int port_ = 0;
  std::unique_ptr<httplib::Client> client_;
};

std::string StreamText(const std::string& body, bool chat, json* usage = nullptr) {
  std::string text;
  auto events = SseData(body);
  EXPECT_FALSE(events.empty());
  if (!events.empty()) {
    EXPECT_EQ(events.back(), "[DONE]");
  }
  for (const auto& e : events) {
    if (e == "[DONE]") continue;
    json c = json::parse(e);
    if (usage && c.contains("usage") && c["usage"].is_object()) *usage = c["usage"];
    if (c["choices"].empty()) continue;
    const json& choice = c["choices"][0];
    if (chat && choice["delta"].contains("content"))
      text += choice["delta"]["content"].get<std::string>();
    if (!chat) text += choice["text"].get<std::string>();
  }
  return text;
}

TEST(ServerE2ETest, EveryEndpointStreamingAndNot) {
  Server s({});
  // Completions: greedy, non-streamed and streamed give the same text and exact usage.
  const std::string req =
      R"({"model":"tiny","prompt":"The quick brown fox","max_tokens":12,"temperature":0,"ignore_eos":true)";
  json full = s.Post("/v1/completions", req + "}");
  ASSERT_TRUE(full.contains("choices")) << full.dump();
  const std::string text = full["choices"][0]["text"];
  EXPECT_EQ(full["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(full["usage"]["completion_tokens"], 12);
  json tok = s.Post("/tokenize", R"({"prompt":"The quick brown fox"})");
  EXPECT_EQ(full["usage"]["prompt_tokens"], tok["count"]);
  json usage;
  EXPECT_EQ(StreamText(s.Stream("/v1/completions",
                                req + R"(,"stream":true,"stream_options":{"include_usage":true}})"),
                       false, &usage),
            text);
  EXPECT_EQ(usage["completion_tokens"], 12);
  EXPECT_EQ(usage["prompt_tokens"], tok["count"]);
  // Token-id prompts give the same result as the text they encode.
  json by_ids =
      s.Post("/v1/completions", R"({"prompt":)" + tok["tokens"].dump() +
                                    R"(,"max_tokens":12,"temperature":0,"ignore_eos":true})");
  EXPECT_EQ(by_ids["choices"][0]["text"], text);
  // Detokenize is the inverse of tokenize.
  EXPECT_EQ(s.Post("/detokenize", json{{"tokens", tok["tokens"]}}.dump())["prompt"],
            "The quick brown fox");

  // A stop string cut from the greedy text trims it there.
  if (text.size() > 6) {
    const std::string stop = text.substr(3, 3);
    json stopped = s.Post("/v1/completions", req + R"(,"stop":)" + json(stop).dump() + "}");
    EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(stopped["choices"][0]["text"], text.substr(0, text.find(stop)));
    EXPECT_LE(stopped["usage"]["completion_tokens"].get<int>(), 12);
  }
  // Logprobs with token ids.
  json lp = s.Post("/v1/completions",
                   req + R"(,"max_tokens":3,"logprobs":2,"return_tokens_as_token_ids":true})");
  ASSERT_EQ(lp["choices"][0]["logprobs"]["tokens"].size(), 3u);
  EXPECT_THAT(lp["choices"][0]["logprobs"]["tokens"][0].get<std::string>(), HasSubstr("token_id:"));
  EXPECT_LE(lp["choices"][0]["logprobs"]["token_logprobs"][0].get<double>(), 0.0);

  // Chat, both ways.
  const std::string chat =
      R"({"messages":[{"role":"user","content":"Hello!"}],"max_tokens":8,"temperature":0,"ignore_eos":true)";
  json c = s.Post("/v1/chat/completions", chat + "}");
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["usage"]["completion_tokens"], 8);
  EXPECT_EQ(StreamText(s.Stream("/v1/chat/completions", chat + R"(,"stream":true})"), true),
            c["choices"][0]["message"]["content"]);
  json cl = s.Post("/v1/chat/completions", chat + R"(,"logprobs":true,"top_logprobs":2})");
  EXPECT_EQ(cl["choices"][0]["logprobs"]["content"].size(), 8u);

  json models = json::parse(s.client().Get("/v1/models")->body);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["max_model_len"], 256);
  const std::string m = s.Metrics();
  EXPECT_GE(
      MetricValue(m, "pdserve:request_success_total" + kLabels + ",finished_reason=\"length\"}"),
      7);
  EXPECT_GT(MetricValue(m, "pdserve:generation_tokens_total" + kLabels + "}"), 50);
  EXPECT_GT(MetricValue(m, "pdserve:time_to_first_token_seconds_count" + kLabels + "}"), 7);
  EXPECT_EQ(s.client().Get("/health")->status, 200);
}

// A 2,000-token prefix computed once: later requests starting with it report the part the
// prefix cache held in usage.prompt_tokens_details.cached_tokens (whole and in the streamed usage
// chunk, completions and chat), and /metrics counts the tokens looked up and found.
TEST(ServerE2ETest, ASharedPrefixIsReportedAsCachedTokens) {
  Server server({"--page-size", "16"}, 2100);
  std::vector<int> prefix(2000);
  for (int i = 0; i < 2000; ++i) prefix[i] = 40 + (i * 7919) % 200;
  auto completion = [&](std::vector<int> prompt, bool stream) {
    json body = {{"model", "tiny"},
                 {"prompt", prompt},
                 {"max_tokens", 3},
                 {"temperature", 0.0},
                 {"ignore_eos", true},
                 {"stream", stream},
                 {"stream_options", {{"include_usage", true}}}};
    if (!stream) {
      body.erase("stream_options");
      return server.Post("/v1/completions", body.dump())["usage"];
    }
    json usage;
    StreamText(server.Stream("/v1/completions", body.dump()), false, &usage);
    return usage;
  };
  const auto t0 = std::chrono::steady_clock::now();
  json first = completion(prefix, false);
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(first["prompt_tokens"], 2000);
  EXPECT_EQ(first["prompt_tokens_details"]["cached_tokens"], 0);
  std::vector<int> longer = prefix;
  longer.insert(longer.end(), {7, 8, 9, 10, 11});
  json second = completion(longer, false);
  const auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ(second["prompt_tokens_details"]["cached_tokens"], 2000) << second.dump();
  json streamed = completion(prefix, true);
  EXPECT_GE(streamed["prompt_tokens_details"]["cached_tokens"].get<int>(), 1984) << streamed.dump();
  std::printf("[ measure  ] 2000-token prompt: first %.1f ms, then %.1f ms with 2000 cached\n",
              std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t2 - t1).count());

  std::string words;
  for (int i = 0; i < 300; ++i) words += "word" + std::to_string(i % 17) + " ";
  auto chat = [&](const std::string& question) {
    json body = {
        {"model", "tiny"},
        {"messages",
         {{{"role", "system"}, {"content", words}}, {{"role", "user"}, {"content", question}}}},
        {"max_tokens", 2},
        {"stream", true},
        {"stream_options", {{"include_usage", true}}}};
    json usage;
    StreamText(server.Stream("/v1/chat/completions", body.dump()), true, &usage);
    return usage;
  };
  chat("first question");
  json again = chat("second question");
  EXPECT_GE(again["prompt_tokens_details"]["cached_tokens"].get<int>(), 16 * 10) << again.dump();
  EXPECT_LT(again["prompt_tokens_details"]["cached_tokens"].get<int>(),
            again["prompt_tokens"].get<int>());

  const std::string m = server.Metrics();
  EXPECT_GE(MetricValue(m, "pdserve:prefix_cache_queries_total" + kLabels + "}"), 2000 * 3 + 5);
  EXPECT_GE(MetricValue(m, "pdserve:prefix_cache_hits_total" + kLabels + "}"), 2000 + 1984);
}

// --no-enable-prefix-caching: nothing is reported cached.
TEST(ServerE2ETest, WithoutPrefixCachingNothingIsCached) {
  Server server({"--no-enable-prefix-caching"});
  json body = {{"model", "tiny"}, {"prompt", std::vector<int>(100, 50)}, {"max_tokens", 2}};
  server.Post("/v1/completions", body.dump());
  json usage = server.Post("/v1/completions", body.dump())["usage"];
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(MetricValue(server.Metrics(), "pdserve:prefix_cache_hits_total" + kLabels + "}"), 0);
}

TEST(ServerE2ETest, BadInputIsRejectedAndServerStaysHealthy) {
  Server s({"--api-key", "k1", "--max-body-bytes", "65536"});
  httplib::Headers auth = {{"Authorization", "Bearer k1"}};
  auto post = [&](const std::string& path, const std::string& body) {
    return s.client().Post(path.c_str(), auth, body, "application/json");
  };
  struct Case {
    std::string path, body;
    int status;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{oops", 400, "not valid JSON"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":"9"})", 400,
       "'max_tokens' must be an integer"},
      {"/v1/completions", R"({"prompt":"x","temperature":"hot"})", 400,
       "'temperature' must be a number"},
      {"/v1/completions", R"({"model":"gpt-9","prompt":"x"})", 404, "`gpt-9` does not exist"},
      {"/v1/completions", R"({"prompt":""})", 400, "'prompt' must not be empty"},
      {"/v1/completions", R"({"prompt":[1,99999999]})", 400, "outside the vocabulary"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":300})", 400,
       "maximum context length is 256"},
      {"/v1/completions", R"({"prompt":"x","n":3})", 400, "'n' = 3 is not supported"},
      {"/v1/completions", R"({"prompt":"x","logprobs":99})", 400, "'logprobs' must be in"},
      {"/v1/chat/completions", R"({"messages":[]})", 400, "'messages' must not be empty"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":5}]})", 400, "content"},
      {"/v1/completions", R"({"prompt":"x","user":")" + std::string(70000, 'u') + "\"}", 413,
       "exceeds the limit"},
  };
  for (const Case& c : cases) {
    auto r = post(c.path, c.body);
    ASSERT_TRUE(r) << c.body.substr(0, 80);
    EXPECT_EQ(r->status, c.status) << c.body.substr(0, 80) << " -> " << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr(c.needle))
        << c.body.substr(0, 80);
    EXPECT_EQ(j["error"]["code"], c.status);
  }
  // Missing / wrong API key.
  auto no_key = s.client().Post("/v1/completions", R"({"prompt":"x"})", "application/json");
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(json::parse(no_key->body)["error"]["type"], "authentication_error");
  // Too many and too large headers.
  {
    RawConnection c(s.port());
    std::string headers;
    for (int i = 0; i < 150; ++i) headers += "X-" + std::to_string(i) + ": v\r\n";
    ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n"));
    EXPECT_THAT(c.ReadUntil("}}", 10s), ::testing::StartsWith("HTTP/1.1 431"));
  }
  {
    RawConnection c(s.port());
    ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(40000, 'b') +
                       "\r\n\r\n"));
    EXPECT_THAT(c.ReadUntil("}}", 10s), ::testing::StartsWith("HTTP/1.1 431"));
  }
  // An unbounded chunked body is cut off.
  {
    RawConnection c(s.port());
    ASSERT_TRUE(
        c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k1\r\n"
               "Transfer-Encoding: chunked\r\n\r\n"));
    const std::string chunk = "4000\r\n" + std::string(0x4000, 'x') + "\r\n";
    size_t sent = 0;
    while (sent < (512u << 20) && !c.Readable() && c.Send(chunk)) sent += chunk.size();
    EXPECT_LT(sent, 64u << 20);
  }
  EXPECT_EQ(s.client().Get("/health")->status, 200);
  json ok = json::parse(post("/v1/completions", R"({"prompt":"x","max_tokens":2})")->body);
  EXPECT_EQ(ok["usage"]["completion_tokens"], 2);
  // No request reached the engine and stayed there.
  const std::string m = s.Metrics();
  EXPECT_EQ(MetricValue(m, "pdserve:num_requests_running" + kLabels + "}"), 0);
}

TEST(ServerE2ETest, TwoHundredRequestsWithCancellationsFreeEveryPage) {
  Server s({"--max-num-seqs", "16"});
  constexpr int kRequests = 200;
  std::atomic<int> completed{0}, cancelled{0}, failed{0};
  std::atomic<int> next{0};
  auto worker = [&] {
    for (int i = next.fetch_add(1); i < kRequests; i = next.fetch_add(1)) {
      const bool cancel = i % 4 == 1;
      const std::string body = "{\"prompt\":\"request " + std::to_string(i) +
                               "\",\"max_tokens\":" + (cancel ? "200" : "6") +
                               ",\"ignore_eos\":true,\"stream\":" + (i % 2 ? "true" : "false") +
                               "}";
      RawConnection c(s.port());
      c.Send(
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
          "application/json\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body);
      if (cancel) {
        std::string got = c.ReadUntil("\"text\"", 60s);  // first streamed token, then hang up
        got.find("\"text\"") != std::string::npos ? ++cancelled : ++failed;
        c.Close();
        continue;
      }
      std::string got = c.ReadUntil(i % 2 ? "[DONE]" : "\"total_tokens\"", 60s);
      got.find("HTTP/1.1 200") == 0 ? ++completed : ++failed;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(cancelled.load(), kRequests / 4);
  EXPECT_EQ(completed.load(), kRequests - kRequests / 4);
  // Every page comes back and the counters add up. A hung-up request is aborted unless it ran
  // all its tokens first: the tiny model runs 200 steps in a few ms, so a client thread starved
  // of CPU after the first token (ctest -j2) can hang up after the end. Those count as "length".
  std::string m;
  const auto finished = [&](const std::string& reason) {
    return MetricValue(
        m, "pdserve:request_success_total" + kLabels + ",finished_reason=\"" + reason + "\"}");
  };
  EXPECT_TRUE(WaitFor(
      [&] {
        m = s.Metrics();
        return MetricValue(m, "pdserve:kv_cache_usage_perc" + kLabels + "}") == 0 &&
               finished("abort") + finished("length") == kRequests;
      },
      30s))
      << m;
  EXPECT_GE(finished("abort"), 1) << m;  // the hang-ups did abort requests
  EXPECT_LE(finished("abort"), kRequests / 4) << m;
  EXPECT_EQ(MetricValue(m, "pdserve:num_requests_running" + kLabels + "}"), 0);
  EXPECT_EQ(MetricValue(m, "pdserve:num_requests_waiting" + kLabels + "}"), 0);
  EXPECT_EQ(s.client().Get("/health")->status, 200);
}

TEST(ServerE2ETest, OverloadFromBenchIsShedWithBoundedMemory) {
  Server s({"--max-num-seqs", "2", "--max-pending-requests", "4", "--http-threads", "8",
            "--max-queued-connections", "8"});
  const long rss_start = s.process().VmRssKib();
  ASSERT_GT(rss_start, 0);
  std::atomic<long> rss_max{rss_start};
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done) {
      rss_max = std::max(rss_max.load(), s.process().VmRssKib());
      std::this_thread::sleep_for(5ms);  // sampling period, not synchronisation
    }
  });
  const std::string result = (std::filesystem::temp_directory_path() /
                              ("pdserve_bench_" + std::to_string(::getpid()) + ".json"))
                                 .string();
  std::string out;
  int rc = testing::RunCommand(
      {kBinary, "bench", "--base-url", "http://127.0.0.1:" + std::to_string(s.port()),
       "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "8",
       "--num-prompts", "120", "--request-rate", "inf", "--ignore-eos", "--result-filename",
       result},
      &out, 120s);
  done = true;
  sampler.join();
  ASSERT_EQ(rc, 0) << out;
  std::ifstream f(result);
  json j = json::parse(f, nullptr, false);
  std::filesystem::remove(result);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_GT(j["failed"].get<int>(), 0) << out;     // load was shed ...
  EXPECT_GT(j["completed"].get<int>(), 0) << out;  // ... and admitted requests were served
  EXPECT_EQ(j["completed"].get<int>() + j["failed"].get<int>(), 120);
  for (const auto& len : j["output_lens"]) EXPECT_EQ(len, 8);
  bool saw_shed = false;
  for (const auto& e : j["errors"]) {
    const std::string msg = e;
    saw_shed |=
        msg.find("HTTP 429") != std::string::npos || msg.find("HTTP 503") != std::string::npos;
  }
  EXPECT_TRUE(saw_shed) << j["errors"].dump();
  // Memory stays bounded: well under 256 MiB above the idle server.
  EXPECT_LT(rss_max.load() - rss_start, 256 * 1024)
      << "start " << rss_start << " KiB, max " << rss_max << " KiB";
  std::string m;
  EXPECT_TRUE(WaitFor(
      [&] {
        m = s.Metrics();
        return MetricValue(m, "pdserve:kv_cache_usage_perc" + kLabels + "}") == 0;
      },
      30s))
      << m;
  EXPECT_EQ(s.client().Get("/health")->status, 200);
}

}  // namespace
}  // namespace pd::server
