// The OpenAI server against a fake engine and tokenizer: every endpoint, streaming and not,
// bad input, auth, HTTP limits, overload and client disconnects.
#include "server/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "common/trace.h"
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
using testing::SseData;
using testing::WaitFor;
using namespace std::chrono_literals;

std::vector<int32_t> Script(const std::string& text, bool eos = true) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  if (eos) ids.push_back(FakeTokenizer::kEos);
  return ids;
}

class ServerTest : public ::testing::Test {
 protected:
  void Start(FakeEngineOptions engine_options, ServerOptions options = {}) {
    if (engine_options.script.empty()) engine_options.script = Script("Hello world");
    engine_ = std::make_unique<FakeAsyncEngine>(engine_options);
    options.port = 0;
    if (options.served_model_name.empty()) options.served_model_name = "tiny";
    options.max_model_len = options.max_model_len == 4096 ? 256 : options.max_model_len;
    auto server = OpenAiServer::Create(options, engine_.get(), &tokenizer_);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    ASSERT_TRUE(server_->Start().ok());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10, 0);
    ASSERT_TRUE(WaitFor(
        [&] {
          auto r = client_->Get("/health");
          return r && r->status == 200;
        },
        5s));
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->Stop();
    server_.reset();
    engine_.reset();
  }
  httplib::Result Post(const std::string& path, const std::string& body,
                       httplib::Headers headers = {}) {
    return client_->Post(path.c_str(), headers, body, "application/json");
  }
  json PostJson(const std::string& path, const std::string& body, int expected_status = 200) {
    auto r = Post(path, body);
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, expected_status) << r->body;
    return json::parse(r->body, nullptr, false);
  }
  void ExpectError(const std::string& path, const std::string& body, int status,
                   const std::string& needle) {
    json j = PostJson(path, body, status);
    ASSERT_TRUE(j.contains("error")) << j.dump();
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr(needle)) << body;
    EXPECT_EQ(j["error"]["code"], status);
    EXPECT_TRUE(j["error"]["type"].is_string());
  }
  std::string Metrics() {
    auto r = client_->Get("/metrics");
    return r ? r->body : "";
  }

  FakeTokenizer tokenizer_;
  std::unique_ptr<FakeAsyncEngine> engine_;
  std::unique_ptr<OpenAiServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ServerTest, CompletionNonStreaming) {
  Start({});
  json j = PostJson("/v1/completions", R"({"model":"tiny","prompt":"hi","max_tokens":50})");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["choices"][0]["text"], "Hello world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["stop_reason"], FakeTokenizer::kEos);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["total_tokens"], 14);
  EXPECT_EQ(engine_->last_prompt(), (std::vector<int32_t>{'h', 'i'}));
  // Token-id prompts and max_tokens / length.
  j = PostJson("/v1/completions", R"({"prompt":[72,105],"max_tokens":3,"temperature":0,"seed":7})");
  EXPECT_EQ(j["choices"][0]["text"], "Hel");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(engine_->last_sampling().max_tokens, 3);
  EXPECT_EQ(*engine_->last_sampling().seed, 7u);
}

TEST_F(ServerTest, CompletionStreamingWithUsage) {
  Start({});
  auto r = Post(
      "/v1/completions",
      R"({"prompt":"hi","max_tokens":50,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->get_header_value("Content-Type"), HasSubstr("text/event-stream"));
  auto events = SseData(r->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, "Hello world");
  EXPECT_EQ(finish, "stop");
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 12);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 2);
}

// A streamed request's first and last token each leave one trace instant naming its engine
// request id (issue #7 pairs them with the client); a non-streamed one leaves neither.
TEST_F(ServerTest, StreamTracesItsFirstAndLastTokenWithTheRequestId) {
  Tracer tracer;
  ServerOptions so;
  so.tracer = &tracer;
  Start({}, so);
  for (int i = 0; i < 2; ++i) {
    auto r = Post("/v1/completions", R"({"prompt":"hi","max_tokens":5,"stream":true})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
  }
  ASSERT_TRUE(Post("/v1/completions", R"({"prompt":"hi","max_tokens":5})"));
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> written;  // name -> (id, ts)
  for (const TraceEvent& e : tracer.Events()) {
    if (e.name != "first token written" && e.name != "last token written") continue;
    ASSERT_EQ(e.args.size(), 1u) << e.name;
    EXPECT_EQ(e.args[0].key, "request");
    written[e.name].emplace_back(std::get<int64_t>(e.args[0].value), e.ts_ns);
  }
  const auto& first = written["first token written"];
  const auto& last = written["last token written"];
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_NE(first[0].first, first[1].first);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(first[i].first, last[i].first);
    EXPECT_LE(first[i].second, last[i].second);
  }
}

TEST_F(ServerTest, ChatNonStreamingAndStreaming) {
  Start({});
  const std::string msgs =
      R"("messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}])";
  json j = PostJson("/v1/chat/completions", "{" + msgs + R"(,"max_tokens":40})");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello world");
  const std::string rendered =
      "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(engine_->last_prompt(), tokenizer_.Encode(rendered));
  EXPECT_EQ(j["usage"]["prompt_tokens"], tokenizer_.Encode(rendered).size());

  auto r = Post("/v1/chat/completions", "{" + msgs + R"(,"stream":true})");
  ASSERT_TRUE(r);
  auto events = SseData(r->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    if (c["choices"][0]["delta"].contains("content"))
      text += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, "Hello world");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "stop");
  // Default max_tokens for chat is the rest of the context.
  EXPECT_EQ(engine_->last_sampling().max_tokens,
            256 - static_cast<int>(tokenizer_.Encode(rendered).size()));
}

TEST_F(ServerTest, StopStringTrimsTextCountsExactlyAndAbortsEngine) {
  Start({});
  json j = PostJson("/v1/completions", R"({"prompt":"hi","max_tokens":50,"stop":["wor"]})");
  EXPECT_EQ(j["choices"][0]["text"], "Hello ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["stop_reason"], "wor");
  EXPECT_EQ(j["usage"]["completion_tokens"], 9);  // "Hello wor"
  EXPECT_TRUE(WaitFor([&] { return engine_->aborted().size() == 1; }, 5s));
  auto r =
      Post("/v1/completions", R"({"prompt":"hi","max_tokens":50,"stop":"lo w","stream":true})");
  ASSERT_TRUE(r);
  std::string text;
  for (const auto& e : SseData(r->body)) {
    if (e == "[DONE]") continue;
    text += json::parse(e)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "Hel");
}

TEST_F(ServerTest, LogprobsAndTokenIds) {
  Start({});
  json j =
      PostJson("/v1/completions",
               R"({"prompt":"hi","max_tokens":2,"logprobs":2,"return_tokens_as_token_ids":true})");
  json lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"token_id:72", "token_id:101"}));
  EXPECT_EQ(lp["token_logprobs"].size(), 2u);
  EXPECT_TRUE(lp["top_logprobs"][0].contains("token_id:73"));
  EXPECT_EQ(lp["text_offset"].size(), 2u);
  EXPECT_EQ(engine_->last_sampling().logprobs, 2);
  j = PostJson(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2,"logprobs":true,"top_logprobs":1})");
  json content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "H");
  EXPECT_EQ(content[0]["bytes"], json({72}));
  EXPECT_EQ(content[0]["top_logprobs"].size(), 1u);
  j = PostJson("/v1/completions", R"({"prompt":"hi","max_tokens":2})");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
}

TEST_F(ServerTest, MultiByteCharactersAreNeverSplitInStreams) {
  FakeEngineOptions eo;
  eo.script = Script("caf\xC3\xA9 \xE2\x82\xAC");
  Start(eo);
  auto r = Post("/v1/completions", R"({"prompt":"hi","max_tokens":50,"stream":true})");
  ASSERT_TRUE(r);
  std::string text;
  for (const auto& e : SseData(r->body)) {
    if (e == "[DONE]") continue;
    std::string piece = json::parse(e)["choices"][0]["text"];
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << "replacement character in a chunk";
    text += piece;
  }
  EXPECT_EQ(text, "caf\xC3\xA9 \xE2\x82\xAC");
}

TEST_F(ServerTest, BadInputGetsOpenAiErrors) {
  Start({});
  ExpectError("/v1/completions", "{bad json", 400, "not valid JSON");
  ExpectError("/v1/completions", R"({"prompt":"x","max_tokens":"3"})", 400,
              "'max_tokens' must be an integer");
  ExpectError("/v1/completions", R"({"model":"other","prompt":"x"})", 404,
              "`other` does not exist");
  ExpectError("/v1/completions", R"({"prompt":""})", 400, "'prompt' must not be empty");
  ExpectError("/v1/completions", R"({"prompt":[1,259]})", 400, "outside the vocabulary");
  ExpectError("/v1/completions", R"({"prompt":"hi","max_tokens":255})", 400,
              "maximum context length is 256");
  ExpectError("/v1/completions", R"({"prompt":"hi","n":2})", 400, "'n' = 2 is not supported");
  ExpectError("/v1/chat/completions", R"({"messages":[]})", 400, "'messages' must not be empty");
  ExpectError("/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"x"}],"max_tokens":300})", 400,
              "maximum context length");
  ExpectError("/tokenize", R"({"prompt":1})", 400, "'prompt' must be a string");
  ExpectError("/detokenize", R"({"tokens":[999]})", 400, "outside the vocabulary");
  auto r = client_->Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_THAT(json::parse(r->body)["error"]["message"].get<std::string>(),
              HasSubstr("/v1/nothing"));
  EXPECT_EQ(engine_->num_submitted(), 0);
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

TEST_F(ServerTest, TokenizeRendersWhatChatPrefills) {
  Start({}, ServerOptions());
  // /tokenize renders what a chat request prefills: tools and chat_template_kwargs included.
  const std::string chat =
      R"("messages":[{"role":"user","content":"a"}],"tools":[{"type":"function",)"
      R"("function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false})";
  json t = PostJson("/tokenize", "{" + chat + "}");
  EXPECT_EQ(t["count"], tokenizer_
                            .Encode(R"(<tools>[{"type": "function", "function": {"name": "f"}}])"
                                    "</tools><|im_start|>user\na<|im_end|>\n<|im_start|>"
                                    "assistant\n<think></think>")
                            .size());
  json chat_reply = PostJson("/v1/chat/completions", "{" + chat + R"(,"max_tokens":2})");
  EXPECT_EQ(chat_reply["usage"]["prompt_tokens"], t["count"]);
  ExpectError("/v1/chat/completions", R"({"messages":[{"role":"developer","content":"x"}]})", 400,
              "raise_exception: no developer role");
  ExpectError("/tokenize", R"({"messages":[{"role":"developer","content":"x"}]})", 400,
              "raise_exception: no developer role");
}

TEST_F(ServerTest, ToolChoiceForcesACallOnlyWithAParserThatCanConstrainIt) {
  const std::string tools =
      R"("messages":[{"role":"user","content":"a"}],"max_tokens":2,"tools":[{"type":"function",)"
      R"("function":{"name":"f","parameters":{"type":"object"}}}])";
  // No --tool-call-parser: a call cannot be forced; "auto" and "none" still work, unconstrained.
  Start({}, ServerOptions());
  ExpectError("/v1/chat/completions", "{" + tools + R"(,"tool_choice":"required"})", 400,
              "needs the server started with --tool-call-parser");
  PostJson("/v1/chat/completions", "{" + tools + R"(,"tool_choice":"none"})");
  EXPECT_EQ(engine_->last_sampling().constraint, nullptr);
  ExpectError("/v1/chat/completions",
              "{" + tools + R"(,"tool_choice":{"type":"function","function":{"name":"g"}}})", 400,
              "'tool_choice.function.name' = \"g\" is not the name of one of 'tools'");
  ExpectError("/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function",)"
              R"("function":{"name":"f","parameters":[]}}]})",
              400, "'tools[0].function.parameters' must be a JSON Schema object, got array");
}

TEST_F(ServerTest, ForcedToolCallReachesTheEngineAsAConstraint) {
  ServerOptions so;
  so.tool_call_format = ToolCallFormat::kHermes;
  Start({}, so);
  const std::string body =
      R"({"messages":[{"role":"user","content":"a"}],"max_tokens":2,"tools":[{"type":"function",)"
      R"("function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}})";
  PostJson("/v1/chat/completions", body);
  const auto constraint = engine_->last_sampling().constraint;
  ASSERT_NE(constraint, nullptr);
  auto state = constraint->Start();
  EXPECT_TRUE(state->Allows("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(state->Allows("Sure"));
  EXPECT_EQ(constraint->texts().size(), tokenizer_.vocab_size());
  PostJson("/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"a"}],"max_tokens":2,"tools":[)"
           R"({"type":"function","function":{"name":"f"}}]})");
  EXPECT_EQ(engine_->last_sampling().constraint, nullptr);  // "auto": parsed, not forced
}

// response_format and guided_* reach the engine as a compiled constraint, both APIs; a schema or
// regex the compiler refuses is a 400 naming the field and the problem.
TEST_F(ServerTest, StructuredOutputsReachTheEngineAsAConstraint) {
  Start({}, ServerOptions());
  PostJson("/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"a"}],"max_tokens":2,"response_format":)"
           R"({"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object",)"
           R"("properties":{"ok":{"type":"boolean"}},"required":["ok"]}}}})");
  auto constraint = engine_->last_sampling().constraint;
  ASSERT_NE(constraint, nullptr);
  auto state = constraint->Start();
  EXPECT_TRUE(state->Allows("{\"ok\": true}"));
  EXPECT_FALSE(state->Allows("{\"no\""));
  PostJson("/v1/completions", R"({"prompt":"a","max_tokens":2,"guided_regex":"[0-9]{3}"})");
  constraint = engine_->last_sampling().constraint;
  ASSERT_NE(constraint, nullptr);
  EXPECT_TRUE(constraint->Start()->Allows("12"));
  EXPECT_FALSE(constraint->Start()->Allows("1a"));
  PostJson("/v1/completions", R"({"prompt":"a","max_tokens":2,"response_format":{"type":"text"}})");
  EXPECT_EQ(engine_->last_sampling().constraint, nullptr);
  ExpectError("/v1/completions",
              R"({"prompt":"a","guided_json":{"type":"integer","multipleOf":2}})", 400,
              "'guided_json': unsupported JSON schema keyword 'multipleOf' at #");
  ExpectError("/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"a"}],"guided_regex":"(a)\\1"})", 400,
              "'guided_regex': regex: unsupported back-reference");
}

TEST_F(ServerTest, ModelsTokenizeDetokenizeMetrics) {
  ServerOptions so;
  so.model_path = "/models/tiny";
  Start({}, so);
  json models = json::parse(client_->Get("/v1/models")->body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["max_model_len"], 256);
  json t = PostJson("/tokenize", R"({"prompt":"ab"})");
  EXPECT_EQ(t["tokens"], json({97, 98}));
  EXPECT_EQ(t["count"], 2);
  t = PostJson("/tokenize", R"({"messages":[{"role":"user","content":"a"}]})");
  EXPECT_EQ(t["count"],
            tokenizer_.Encode("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n").size());
  json d = PostJson("/detokenize", R"({"tokens":[104,105]})");
  EXPECT_EQ(d["prompt"], "hi");
  PostJson("/v1/completions", R"({"prompt":"hi","max_tokens":3})");
  PostJson("/v1/completions", R"({"prompt":"hi","max_tokens":50})");
  const std::string m = Metrics();
  const std::string l = "{model_name=\"tiny\"";
  EXPECT_EQ(
      testing::MetricValue(m, "pdserve:request_success_total" + l + ",finished_reason=\"length\"}"),
      1);
  EXPECT_EQ(
      testing::MetricValue(m, "pdserve:request_success_total" + l + ",finished_reason=\"stop\"}"),
      1);
  EXPECT_EQ(testing::MetricValue(m, "pdserve:prompt_tokens_total" + l + "}"), 4);
  EXPECT_EQ(testing::MetricValue(m, "pdserve:generation_tokens_total" + l + "}"), 15);
  EXPECT_EQ(testing::MetricValue(m, "pdserve:time_to_first_token_seconds_count" + l + "}"), 2);
  EXPECT_EQ(testing::MetricValue(m, "pdserve:inter_token_latency_seconds_count" + l + "}"), 13);
  EXPECT_EQ(testing::MetricValue(m, "pdserve:e2e_request_latency_seconds_count" + l + "}"), 2);
  EXPECT_EQ(testing::MetricValue(m, "pdserve:kv_cache_usage_perc" + l + "}"), 0);
}

TEST_F(ServerTest, ExtraMetricsAreAppended) {
  ServerOptions so;
  int calls = 0;
  so.extra_metrics = [&calls] {
    ++calls;
    return std::string("pdserve:kv_transfers_total{role=\"decode\"} ") + std::to_string(calls) +
           "\n";
  };
  Start({}, so);
  EXPECT_EQ(testing::MetricValue(Metrics(), "pdserve:kv_transfers_total{role=\"decode\"}"), 1);
  EXPECT_EQ(testing::MetricValue(Metrics(), "pdserve:kv_transfers_total{role=\"decode\"}"), 2);
}

TEST_F(ServerTest, ApiKeyIsRequiredOnV1) {
  ServerOptions so;
  so.api_key = "sekret";
  Start({}, so);
  ExpectError("/v1/completions", R"({"prompt":"hi"})", 401, "Authorization");
  auto bad = Post("/v1/completions", R"({"prompt":"hi"})", {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 401);
  EXPECT_EQ(client_->Get("/v1/models")->status, 401);
  auto good = Post("/v1/completions", R"({"prompt":"hi","max_tokens":2})",
                   {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200);
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

}  // namespace
}  // namespace pd::server
