// The prefix_repetition and multi_turn workloads: their prompts, and a stub server that sees each
// conversation's turns resent whole, in order, with the replies it gave.
#include "bench/workloads.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <map>
#include <set>
#include <thread>

#include "bench/runner.h"
#include "common/mutex.h"

namespace pd::bench {
namespace {

using ::testing::HasSubstr;

GenerationRequest Base(const std::string& path) {
  GenerationRequest b;
  b.path = path;
  b.model = "m";
  return b;
}

TEST(PrefixRepetitionTest, EachPrefixIsSharedByItsShareOfTheRequests) {
  PrefixRepetitionSpec spec{.prefix_len = 12, .suffix_len = 5, .num_prefixes = 3, .output_len = 7};
  auto rs = PrefixRepetitionRequests(spec, 10, 1, 1000, Base("/v1/completions"));
  ASSERT_TRUE(rs.ok()) << rs.status().ToString();
  ASSERT_EQ(rs->size(), 10u);
  std::map<std::vector<int32_t>, int> prefixes;
  std::set<std::vector<int32_t>> suffixes;
  for (const GenerationRequest& r : *rs) {
    ASSERT_EQ(r.prompt_ids.size(), 17u);
    EXPECT_EQ(r.max_tokens, 7);
    EXPECT_EQ(r.prompt_len, 17);
    ++prefixes[std::vector<int32_t>(r.prompt_ids.begin(), r.prompt_ids.begin() + 12)];
    suffixes.insert(std::vector<int32_t>(r.prompt_ids.begin() + 12, r.prompt_ids.end()));
  }
  ASSERT_EQ(prefixes.size(), 3u);
  for (const auto& [p, n] : prefixes) EXPECT_GE(n, 3);  // 10 over 3: 4, 3, 3
  EXPECT_EQ(suffixes.size(), 10u);
  auto again = PrefixRepetitionRequests(spec, 10, 1, 1000, Base("/v1/completions"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[4].prompt_ids, (*rs)[4].prompt_ids) << "deterministic for a seed";

  auto chat = PrefixRepetitionRequests(spec, 4, 1, 1000, Base("/v1/chat/completions"));
  ASSERT_TRUE(chat.ok());
  EXPECT_TRUE((*chat)[0].prompt_ids.empty());
  EXPECT_FALSE((*chat)[0].prompt_text.empty());

  auto too_long = PrefixRepetitionRequests(spec, 4, 1, 20, Base("/v1/completions"));
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  spec.num_prefixes = 0;
  auto none = PrefixRepetitionRequests(spec, 4, 1, 1000, Base("/v1/completions"));
  EXPECT_THAT(none.status().message(), HasSubstr("--prefix-repetition-num-prefixes"));
}

TEST(MultiTurnTest, RequestsAreTurnsOfConversations) {
  MultiTurnSpec spec{.num_turns = 3, .user_len = 6, .output_len = 4};
  auto rs = MultiTurnRequests(spec, 7, 2, 1000, Base("/v1/chat/completions"));
  ASSERT_TRUE(rs.ok());
  ASSERT_EQ(rs->size(), 7u);
  EXPECT_EQ((*rs)[4].conversation, 1);
  EXPECT_EQ((*rs)[4].turn, 1);
  EXPECT_EQ((*rs)[6].conversation, 2);  // the last conversation has one turn
  EXPECT_EQ((*rs)[6].turn, 0);
  auto too_long = MultiTurnRequests(spec, 7, 2, 40, Base("/v1/chat/completions"));
  EXPECT_THAT(too_long.status().message(), HasSubstr("--multi-turn-num-turns"));
}

// A stub chat server that replies "r<N>" (N counts its calls) and records each request's
// messages; the bench must resend each conversation with the replies it got, turn after turn.
TEST(MultiTurnTest, EachTurnResendsTheConversationWithTheServersReplies) {
  httplib::Server server;
  Mutex mu;
  std::vector<nlohmann::json> seen;  // GUARDED_BY(mu)
  server.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"data":[{"id":"stub","max_model_len":4096}]})", "application/json");
  });
  server.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    auto body = nlohmann::json::parse(req.body);
    std::string reply;
    {
      MutexLock lock(&mu);
      reply = "r" + std::to_string(seen.size());
      seen.push_back(body["messages"]);
    }
    std::string sse = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    sse += "data: {\"choices\":[{\"delta\":{\"content\":\"" + reply + "\"}}]}\n\n";
    sse += "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\n";
    sse += "data: [DONE]\n\n";
    res.set_content(sse, "text/event-stream");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread t([&] { server.listen_after_bind(); });
  BenchOptions o;
  o.endpoint.port = port;
  o.endpoint_path = "/v1/chat/completions";
  o.dataset.name = "multi_turn";
  o.multi_turn = {.num_turns = 3, .user_len = 4, .output_len = 1};
  o.num_prompts = 6;  // 2 conversations
  o.max_concurrency = 2;
  auto s = RunBenchmark(o);
  server.stop();
  t.join();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->json["completed"], 6);
  MutexLock lock(&mu);
  ASSERT_EQ(seen.size(), 6u);
  // Each request's messages: its turn's history (user, assistant)... then its own user message.
  std::map<std::string, int> by_first_user;  // a conversation's first message -> turns seen
  for (size_t i = 0; i < seen.size(); ++i) {
    const nlohmann::json& m = seen[i];
    ASSERT_EQ(m.size() % 2, 1u);
    const int turn = static_cast<int>(m.size() / 2);
    EXPECT_EQ(by_first_user[m[0]["content"]]++, turn) << "turns in order, each once";
    for (int k = 0; k < turn; ++k) {
      EXPECT_EQ(m[2 * k]["role"], "user");
      EXPECT_EQ(m[2 * k + 1]["role"], "assistant");
      // The reply is one the server gave earlier.
      const std::string reply = m[2 * k + 1]["content"];
      ASSERT_EQ(reply[0], 'r');
      EXPECT_LT(std::stoul(reply.substr(1)), i);
    }
  }
  EXPECT_EQ(by_first_user.size(), 2u);
}

}  // namespace
}  // namespace pd::bench
