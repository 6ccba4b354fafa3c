// Speculative decoding across the split: `pdserve up --speculative-config` with n-gram drafts (1
// prefill + 1 decode + router, the demo model) in three tensor-parallel shapes (prefill TP 1 ->
// decode TP 1, 1 -> 2, 2 -> 1), and with the demo model as its own draft model (TP 1), answers
// every greedy request token for token as a colocated instance without speculation does: prompts
// that invite copying (so drafts are accepted), stop strings cut at several points of the output
// (so some end inside a verified draft), and small max_tokens. The decode instance drafts and
// verifies (its pdserve:spec_decode_* counters grow, with accepted tokens); the prefill instance
// never samples, so it counts no draft; every page ends free. With the draft model (TP 1 -> 1,
// 1 -> 2, 2 -> 1, every prompt's KV crossing), the prefill instance computes the draft's KV of each
// prompt and sends it with the target's: decode's draft computes one prompt token per request (its
// last), and, the draft being the target, nearly every draft is kept (a wrong draft KV would keep
// few).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/up_deployment.h"

namespace pd {
namespace {

using json = nlohmann::json;
using testing::UpDeployment;

const std::string kBinary = PDSERVE_BINARY;
const std::string kModel = PD_DEMO_MODEL_DIR;
const std::string kNgram =
    R"({"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":3})";
constexpr int kMaxTokens = 48;

const std::vector<std::string> kPrompts = {
    "A fool and his money are soon parted. A fool and his money are soon parted. A fool",
    "You will be successful in your work. You will be successful in your work. You will",
    "The",
};

// One greedy completion: the token ids (from logprobs, as "token_id:N"), the text and why it ended.
struct Answer {
  int status = -1;
  std::vector<std::string> tokens;
  std::string text, finish_reason;
  int completion_tokens = -1;
  bool operator==(const Answer&) const = default;
};

std::string Describe(const Answer& a) {
  return "status " + std::to_string(a.status) + " finish " + a.finish_reason + " tokens " +
         std::to_string(a.completion_tokens) + " text " + json(a.text).dump();
}

Answer Complete(int port, const json& body) {
  httplib::Client c(testing::kUpHost, port);
  c.set_read_timeout(120, 0);
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  Answer a;
  if (!r) return a;
  a.status = r->status;
  const json reply = json::parse(r->body, nullptr, false);
  if (r->status != 200 || !reply.is_object()) return a;
  const json& choice = reply["choices"][0];
  a.text = choice.value("text", "");
  a.finish_reason = choice.value("finish_reason", "");
  a.completion_tokens = reply["usage"].value("completion_tokens", -1);
  for (const json& t : choice["logprobs"]["tokens"]) a.tokens.push_back(t.get<std::string>());
  return a;
}

json Body(const std::string& prompt, int max_tokens) {
  return {{"model", "m"},       {"prompt", prompt}, {"max_tokens", max_tokens},
          {"temperature", 0.0}, {"logprobs", 1},    {"return_tokens_as_token_ids", true}};
}

// The requests: each prompt with kMaxTokens; then, from a first answer without speculation, stop
// strings that first occur a quarter, half and three quarters into its text; then max_tokens 1, 2,
// 5 and 11 (the last verification of a request is cut to what max_tokens leaves).
std::vector<json> Requests(int port) {
  std::vector<json> out;
  for (const std::string& p : kPrompts) {
    out.push_back(Body(p, kMaxTokens));
    const Answer a = Complete(port, out.back());
    EXPECT_EQ(a.status, 200) << Describe(a);
    for (int quarter = 1; quarter <= 3; ++quarter) {
      // Three whole UTF-8 characters (a random model's text has multi-byte ones).
      auto continuation = [&](size_t i) { return (a.text[i] & 0xC0) == 0x80; };
      size_t at = a.text.size() * quarter / 4, end = at;
      while (at < a.text.size() && continuation(at)) ++at;
      for (int chars = 0; chars < 3 && end < a.text.size(); ++chars)
        for (end = std::max(end, at) + 1; end < a.text.size() && continuation(end);) ++end;
      if (a.text.size() < 8 || end > a.text.size() || end - at < 3) continue;
      json b = Body(p, kMaxTokens);
      b["stop"] = json::array({a.text.substr(at, end - at)});
      out.push_back(b);
    }
    for (int m : {1, 2, 5, 11}) out.push_back(Body(p, m));
  }
  return out;
}

struct Expected {
  std::vector<json> requests;
  std::vector<Answer> answers;
};

// The answers of a colocated TP 1 instance without speculation, computed once.
const Expected& Baseline() {
  static const Expected e = [] {
    Expected x;
    std::mt19937 rng(static_cast<unsigned>(::getpid()) * 4099u);
    const int port = testing::PickPortBlock(rng, 25000);
    testing::Process serve;
    const bool started =
        testing::StartAndWaitFor(serve, testing::ServeArgv(kBinary, kModel, port, 2048, {}),
                                 "serving m on", std::chrono::seconds(60));
    EXPECT_TRUE(started) << serve.output();
    if (!started) return x;
    x.requests = Requests(port);
    for (const json& r : x.requests) x.answers.push_back(Complete(port, r));
    return x;
  }();
  return e;
}

struct Shape {
  int prefill_tp, decode_tp;
  bool draft_model = false;  // the demo model as its own draft model instead of n-gram drafts
};

// A draft model that is the target itself: every draft it makes is the target's greedy token.
std::string DraftModelConfig() {
  return R"({"method":"draft_model","num_speculative_tokens":3,"model":")" + kModel + R"("})";
}

class UpSpecTest : public ::testing::TestWithParam<Shape> {};

TEST_P(UpSpecTest, GreedyOutputsEqualNoSpeculationAndDecodeCountsDrafts) {
  const Expected& want = Baseline();
  ASSERT_FALSE(want.requests.empty());
  int stopped = 0;
  for (const Answer& a : want.answers) stopped += a.finish_reason == "stop" ? 1 : 0;
  EXPECT_GE(stopped, 3) << "the stop strings should end some requests";
  const Shape s = GetParam();
  std::vector<std::string> args = {
      "--speculative-config", s.draft_model ? DraftModelConfig() : kNgram,
      "--prefill-tp",         std::to_string(s.prefill_tp),
      "--decode-tp",          std::to_string(s.decode_tp)};
  // Every prompt's KV (and the draft's) crosses; the repeated prompts' come from the prefix cache.
  if (s.draft_model) args.insert(args.end(), {"--local-prefill-max-tokens", "0"});
  UpDeployment up(kBinary, kModel, 1, 1, args);
  ASSERT_TRUE(up.started());
  for (size_t i = 0; i < want.requests.size(); ++i) {
    const Answer got = Complete(up.router_port(), want.requests[i]);
    EXPECT_EQ(got, want.answers[i]) << "request " << want.requests[i].dump() << "\n  got  "
                                    << Describe(got) << "\n  want " << Describe(want.answers[i]);
  }
  const int decode = up.port("decode 0"), prefill = up.port("prefill 0");
  const std::string p = "pdserve:spec_decode_";
  EXPECT_GT(testing::MetricSum(testing::kUpHost, decode, p + "num_drafts_total"), 0);
  EXPECT_GT(testing::MetricSum(testing::kUpHost, decode, p + "num_draft_tokens_total"), 0);
  EXPECT_GT(testing::MetricSum(testing::kUpHost, decode, p + "num_accepted_tokens_total"), 0);
  EXPECT_GT(testing::MetricSum(testing::kUpHost, decode, p + "num_accepted_tokens_per_pos_total",
                               "position=\"0\""),
            0);
  EXPECT_GT(testing::MetricSum(testing::kUpHost, decode, "pdserve:kv_transfer_pages_total"), 0)
      << "the prompts' KV should cross from the prefill instance";
  // The prefill instance never samples: it has no such counter (-1) or a zero one.
  EXPECT_LE(testing::MetricSum(testing::kUpHost, prefill, p + "num_drafts_total"), 0);
  std::printf("[ measured ] decode: %.0f drafts, %.0f draft tokens, %.0f accepted\n",
              testing::MetricSum(testing::kUpHost, decode, p + "num_drafts_total"),
              testing::MetricSum(testing::kUpHost, decode, p + "num_draft_tokens_total"),
              testing::MetricSum(testing::kUpHost, decode, p + "num_accepted_tokens_total"));
  if (s.draft_model) {
    const double drafted =
        testing::MetricSum(testing::kUpHost, decode, p + "num_draft_tokens_total");
    const double kept =
        testing::MetricSum(testing::kUpHost, decode, p + "num_accepted_tokens_total");
    const double decode_prompt =
        testing::MetricSum(testing::kUpHost, decode, p + "draft_prompt_tokens_total");
    const double prefill_prompt =
        testing::MetricSum(testing::kUpHost, prefill, p + "draft_prompt_tokens_total");
    EXPECT_EQ(decode_prompt, static_cast<double>(want.requests.size()))
        << "decode's draft should compute only each prompt's last token";
    EXPECT_GT(prefill_prompt, 0) << "the prefill instance should compute the draft's KV";
    EXPECT_GE(kept, 0.9 * drafted) << "the draft is the target: a right draft KV keeps nearly all";
    std::printf("[ measured ] draft prompt tokens: decode %.0f, prefill %.0f; kept %.0f of %.0f\n",
                decode_prompt, prefill_prompt, kept, drafted);
  }
  up.ExpectPagesFree();
  if (HasFailure()) ADD_FAILURE() << up.up().output();
}

INSTANTIATE_TEST_SUITE_P(Shapes, UpSpecTest,
                         ::testing::Values(Shape{1, 1}, Shape{1, 2}, Shape{2, 1}, Shape{1, 1, true},
                                           Shape{1, 2, true}, Shape{2, 1, true}),
                         [](const auto& info) {
                           return "Prefill" + std::to_string(info.param.prefill_tp) + "Decode" +
                                  std::to_string(info.param.decode_tp) +
                                  (info.param.draft_model ? "DraftModel" : "Ngram");
                         });

// The answers of a colocated TP 1 instance of `model` with `extra` flags, and its decode counters.
Expected ColocatedAnswers(const std::string& model, const std::vector<std::string>& extra,
                          const std::vector<json>* requests, double* drafts) {
  Expected x;
  std::mt19937 rng(static_cast<unsigned>(::getpid()) * 7919u + extra.size());
  const int port = testing::PickPortBlock(rng, 26000);
  testing::Process serve;
  const bool started =
      testing::StartAndWaitFor(serve, testing::ServeArgv(kBinary, model, port, 2048, extra),
                               "serving m on", std::chrono::seconds(60));
  EXPECT_TRUE(started) << serve.output();
  if (!started) return x;
  x.requests = requests != nullptr ? *requests : Requests(port);
  for (const json& r : x.requests) x.answers.push_back(Complete(port, r));
  if (drafts != nullptr)
    *drafts = testing::MetricSum(testing::kUpHost, port, "pdserve:spec_decode_num_drafts_total");
  return x;
}

// method "mtp" with a deepseek_v3 checkpoint (make-model's tiny preset: one MTP layer): colocated
// (the MTP layer drafts) and through `pdserve up` at prefill TP 1 -> decode TP 1, 1 -> 2 and
// 2 -> 1, every greedy answer equals a colocated instance's without speculation. Across the split
// the prefill instance computes the MTP layer's KV of each prompt and sends it with the target's
// (spec_mtp.h), and the decode instance drafts from the first step; pages free on both sides.
TEST(UpSpecMtpTest, GreedyOutputsEqualNoSpeculation) {
  const std::string dir =
      ::testing::TempDir() + "pd_up_mtp_" + std::to_string(static_cast<int>(::getpid()));
  testing::MakeModel(kBinary, "tiny", 5, dir, "deepseek_v3");
  const std::string mtp = R"({"method":"mtp","num_speculative_tokens":3})";
  const Expected want = ColocatedAnswers(dir, {}, nullptr, nullptr);
  ASSERT_FALSE(want.requests.empty());
  double drafts = 0;
  const Expected colocated =
      ColocatedAnswers(dir, {"--speculative-config", mtp}, &want.requests, &drafts);
  EXPECT_GT(drafts, 0);
  int stopped = 0;
  for (const Answer& a : want.answers) stopped += a.finish_reason == "stop" ? 1 : 0;
  EXPECT_GE(stopped, 3) << "the stop strings should end some requests";
  std::printf("[ measured ] %zu requests (%d stopped), colocated mtp: %.0f drafts\n",
              want.requests.size(), stopped, drafts);
  for (size_t i = 0; i < want.requests.size(); ++i)
    EXPECT_EQ(colocated.answers[i], want.answers[i]) << "colocated: " << want.requests[i].dump();
  for (auto [prefill_tp, decode_tp] : {std::pair{1, 1}, {1, 2}, {2, 1}}) {
    SCOPED_TRACE("prefill TP " + std::to_string(prefill_tp) + " -> decode TP " +
                 std::to_string(decode_tp));
    // Every prompt's KV (and its MTP KV) crosses from the prefill instance.
    UpDeployment up(kBinary, dir, 1, 1,
                    {"--speculative-config", mtp, "--prefill-tp", std::to_string(prefill_tp),
                     "--decode-tp", std::to_string(decode_tp), "--local-prefill-max-tokens", "0"});
    ASSERT_TRUE(up.started());
    for (size_t i = 0; i < want.requests.size(); ++i) {
      const Answer got = Complete(up.router_port(), want.requests[i]);
      EXPECT_EQ(got, want.answers[i]) << "request " << want.requests[i].dump() << "\n  got  "
                                      << Describe(got) << "\n  want " << Describe(want.answers[i]);
    }
    const int decode = up.port("decode 0"), prefill = up.port("prefill 0");
    const std::string p = "pdserve:spec_decode_";
    const double drafts_up = testing::MetricSum(testing::kUpHost, decode, p + "num_drafts_total");
    const double prefill_prompt =
        testing::MetricSum(testing::kUpHost, prefill, p + "draft_prompt_tokens_total");
    EXPECT_GT(drafts_up, 0) << "the decode instance should draft with the MTP KV it received";
    EXPECT_GT(prefill_prompt, 0) << "the prefill instance should compute the MTP layer's KV";
    EXPECT_GT(testing::MetricSum(testing::kUpHost, decode, "pdserve:kv_transfer_pages_total"), 0);
    std::printf(
        "[ measured ] up mtp: decode %.0f drafts; MTP prompt tokens prefill %.0f, "
        "decode %.0f\n",
        drafts_up, prefill_prompt,
        testing::MetricSum(testing::kUpHost, decode, p + "draft_prompt_tokens_total"));
    up.ExpectPagesFree();
    if (HasFailure()) ADD_FAILURE() << up.up().output();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace pd
