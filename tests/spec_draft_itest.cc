// Speculative decoding with a draft model over HTTP (`pdserve serve --speculative-config
// '{"method": "draft_model", ...}'`, colocated): greedy completions of the trained demo model are
// those of a server without speculation, text, finish reason and token count, also when a stop
// string or max_tokens lands inside a run of accepted drafts (the draft is the demo model itself,
// so its drafts are kept and a step yields up to K + 1 tokens), streamed or not; the drafts are
// counted on /metrics and every page comes back.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/disagg_process.h"

namespace pd {
namespace {

using json = nlohmann::json;
const std::string kBinary = PDSERVE_BINARY;
const std::string kDemo = PD_DEMO_MODEL_DIR;

json Complete(int port, json body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  body["model"] = "m";
  body["temperature"] = 0.0;
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return json();
  EXPECT_EQ(r->status, 200) << r->body;
  return json::parse(r->body, nullptr, false);
}

// The text and finish reason of a streamed completion.
std::pair<std::string, std::string> StreamedText(int port, json body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  body["model"] = "m";
  body["temperature"] = 0.0;
  body["stream"] = true;
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return {};
  std::string text, finish;
  size_t at = 0;
  while ((at = r->body.find("data: ", at)) != std::string::npos) {
    const size_t end = r->body.find("\n", at);
    const std::string data = r->body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") break;
    const json e = json::parse(data, nullptr, false);
    if (!e.is_object() || e["choices"].empty()) continue;
    text += e["choices"][0].value("text", "");
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  return {text, finish};
}

TEST(SpecDraftItest, GreedyCompletionsEqualNoSpeculationWithStopsMidDraft) {
  std::mt19937 rng(static_cast<unsigned>(::getpid()) * 7919u);
  const int port = testing::PickPortBlock(rng, 26000);
  testing::Process plain, spec;
  ASSERT_TRUE(testing::StartAndWaitFor(plain, testing::ServeArgv(kBinary, kDemo, port, 512, {}),
                                       "serving m on", std::chrono::seconds(60)));
  const json config = {{"method", "draft_model"}, {"model", kDemo}, {"num_speculative_tokens", 3}};
  ASSERT_TRUE(testing::StartAndWaitFor(
      spec,
      testing::ServeArgv(kBinary, kDemo, port + 1, 512, {"--speculative-config", config.dump()}),
      "serving m on", std::chrono::seconds(60)));
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog",
                                            "She opened the door and"};
  for (const std::string& prompt : prompts) {
    SCOPED_TRACE(prompt);
    // Lengths 1 + 3k land at the end of a draft run, the others inside one.
    for (int max_tokens : {7, 9, 30}) {
      const json body = {{"prompt", prompt}, {"max_tokens", max_tokens}};
      const json want = Complete(port, body), got = Complete(port + 1, body);
      EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]) << max_tokens;
      EXPECT_EQ(got["choices"][0]["finish_reason"], want["choices"][0]["finish_reason"]);
      EXPECT_EQ(got["usage"]["completion_tokens"], want["usage"]["completion_tokens"]);
    }
    // A stop string taken from the middle of the text, so that it ends a multi-token step early.
    const std::string full =
        Complete(port, {{"prompt", prompt}, {"max_tokens", 30}})["choices"][0]["text"];
    ASSERT_GT(full.size(), 16u) << full;
    const std::string stop = full.substr(full.size() / 2, 3);
    const json body = {{"prompt", prompt}, {"max_tokens", 30}, {"stop", {stop}}};
    const json want = Complete(port, body), got = Complete(port + 1, body);
    EXPECT_EQ(want["choices"][0]["finish_reason"], "stop") << stop;
    EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]) << stop;
    EXPECT_EQ(got["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(got["usage"]["completion_tokens"], want["usage"]["completion_tokens"]);
    const auto streamed = StreamedText(port + 1, body);
    EXPECT_EQ(streamed.first, want["choices"][0]["text"]);
    EXPECT_EQ(streamed.second, "stop");
  }
  const double drafts =
      testing::MetricSum("127.0.0.1", port + 1, "pdserve:spec_decode_num_draft_tokens_total");
  const double accepted =
      testing::MetricSum("127.0.0.1", port + 1, "pdserve:spec_decode_num_accepted_tokens_total");
  EXPECT_GT(drafts, 0);
  EXPECT_GT(accepted, 0.9 * drafts);  // the draft is the target: (nearly) every draft is kept
  EXPECT_TRUE(testing::PagesFreeAt("127.0.0.1", port + 1, std::chrono::seconds(10)));
}

}  // namespace
}  // namespace pd
