#include "engine/output_constraint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "engine/sampler.h"

namespace pd::engine {
namespace {

// Whether `text` is accepted byte by byte and closes the object.
bool ScansWhole(std::string_view text) {
  JsonObjectScanner s;
  for (char c : text) {
    if (!s.Push(static_cast<unsigned char>(c))) return false;
  }
  return s.done();
}

TEST(JsonObjectScannerTest, AcceptsObjects) {
  for (std::string_view ok : {
           R"({})",
           R"({"a":1})",
           R"({ "a" : [1, -2.5e+3, 0, 0.25, 1E9, true, false, null, "x\u00e9\n\"\\/"] })",
           R"({"b": {"c": {}, "d": []}, "e": [[], [{}]]})",
           "{\"\xc3\xa9\": \"\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\"}",
           "{\n  \"k\": -0\n}",
       }) {
    EXPECT_TRUE(ScansWhole(ok)) << ok;
  }
}

TEST(JsonObjectScannerTest, RejectsWhatNoObjectContinues) {
  for (std::string_view bad : {
           R"([])",
           R"( {})",
           R"({"a"})",
           R"({"a":01})",
           R"({"a":tru})",
           R"({,})",
           R"({"a":1,})",
           R"({"a":1}})",
           R"({"a":-})",
           R"({"a":1.})",
           R"({"a":1e})",
           R"({"a":"\x"})",
           R"({"a":"\u12G4"})",
           R"({'a':1})",
           R"({"a":[1,]})",
           R"({a:1})",
           "{\"a\":\"\x01\"}",          // a control character inside a string
           "{\"a\":\"\xc0\xaf\"}",      // an overlong form
           "{\"a\":\"\xed\xa0\x80\"}",  // a surrogate
           "{\"a\":\"\xe6\x97\"}",      // a truncated character
       }) {
    EXPECT_FALSE(ScansWhole(bad)) << bad;
  }
}

TEST(JsonObjectScannerTest, NumberEndsOnWhatFollows) {
  JsonObjectScanner s;
  for (char c : std::string_view(R"({"a":12)")) ASSERT_TRUE(s.Push(c));
  JsonObjectScanner t = s;
  EXPECT_TRUE(t.Push('}'));
  EXPECT_TRUE(t.done());
  EXPECT_FALSE(s.Push('x'));  // neither part of the number nor what may follow it
  EXPECT_TRUE(s.Push(','));
  EXPECT_FALSE(s.done());
}

TEST(JsonObjectScannerTest, BoundsWhitespaceRuns) {
  JsonObjectScanner s;
  ASSERT_TRUE(s.Push('{'));
  for (int i = 0; i < JsonCallConstraint::kMaxWhitespaceRun; ++i) ASSERT_TRUE(s.Push(' '));
  EXPECT_FALSE(s.Push('\n'));
  EXPECT_TRUE(s.Push('}'));
}

std::shared_ptr<const TokenTexts> Texts(const std::vector<std::string>& tokens) {
  auto t = std::make_shared<TokenTexts>();
  for (const std::string& s : tokens) {
    t->bytes.push_back(s);
    t->writes.push_back(s != "<eos>");
  }
  return t;
}

TEST(JsonCallConstraintTest, PrefixAlternativesObjectSuffix) {
  JsonCallConstraint c(Texts({}), {"<call>a:", "<call>bc:"}, "</call>");
  auto state = c.Start();
  EXPECT_TRUE(state->Allows("<ca"));
  EXPECT_TRUE(state->Allows("<call>b"));
  EXPECT_FALSE(state->Allows("<call>d"));
  EXPECT_FALSE(state->Allows("{"));
  state->Advance("<call>bc");
  EXPECT_TRUE(state->Allows(":{\"x\""));  // a token may straddle prefix and object
  state->Advance(":{\"x\":[1]");
  EXPECT_FALSE(state->Allows("</call>"));
  EXPECT_TRUE(state->Allows("}</ca"));
  state->Advance("}</call");
  EXPECT_FALSE(state->complete());
  EXPECT_FALSE(state->Allows(">x"));
  state->Advance(">");
  EXPECT_TRUE(state->complete());
  EXPECT_FALSE(state->Allows(" "));
}

// The same choice made by masking the whole vocabulary first, then taking the argmax.
int32_t MaskedArgMax(const std::vector<float>& logits, const ConstraintState& state,
                     const TokenTexts& texts, bool eos_allowed, int32_t eos) {
  int32_t best = -1;
  for (int32_t id = 0; id < static_cast<int32_t>(logits.size()); ++id) {
    const bool ok = id == eos ? eos_allowed
                              : texts.writes[id] && !texts.bytes[id].empty() && !state.complete() &&
                                    state.Allows(texts.bytes[id]);
    if (ok && (best < 0 || logits[id] > logits[best])) best = id;
  }
  return best;
}

const std::vector<std::string> kVocab = {
    "<eos>", "<t>",   "{",   "}",   "\"", "k", ":",     "1", "2", " ", ",",   "</t>",
    "x",     "}</t>", "{\"", "\":", "[",  "]", "\"k\"", "e", "-", ".", "true"};

// Greedy under the constraint equals masking every token and taking the argmax, step by step,
// on random logits; the text is a whole call and EOS follows it.
TEST(ConstrainedSamplerTest, GreedyMatchesFullMaskOnRandomLogits) {
  auto texts = Texts(kVocab);
  auto constraint = std::make_shared<JsonCallConstraint>(texts, std::vector<std::string>{"<t>"},
                                                         std::string("</t>"));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  int completed = 0;
  for (int trial = 0; trial < 50; ++trial) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 1000;  // never binding here
    p.constraint = constraint;
    RequestSampler sampler(p, 1, /*eos_token_id=*/0);
    auto reference = constraint->Start();
    std::string text;
    for (int step = 0; step < 60; ++step) {
      std::vector<float> logits(kVocab.size());
      for (float& l : logits) l = normal(rng);
      const int32_t want = MaskedArgMax(logits, *reference, *texts, reference->complete(), 0);
      const int32_t got = sampler.Sample(logits).token_id;
      ASSERT_EQ(got, want) << "trial " << trial << " step " << step << " after " << text;
      if (got == 0) {
        ++completed;
        break;
      }
      reference->Advance(kVocab[got]);
      text += kVocab[got];
    }
    EXPECT_FALSE(sampler.constraint_released());
  }
  EXPECT_GT(completed, 0);
}

// Sampling draws from the masked distribution: at the start only "<t>" fits, after "<t>" only
// "{" and "{\""; their frequencies follow softmax over the allowed tokens alone (both with and
// without top-k, i.e. the lazy rejection path and the full scan).
TEST(ConstrainedSamplerTest, SamplingFollowsTheMaskedDistribution) {
  auto texts = Texts(kVocab);
  auto constraint = std::make_shared<JsonCallConstraint>(texts, std::vector<std::string>{"<t>"},
                                                         std::string("</t>"));
  std::vector<float> logits(kVocab.size(), 2.0f);
  logits[2] = 0.0f;   // "{"
  logits[14] = 1.0f;  // "{\""
  const double p_brace = 1.0 / (1.0 + std::exp(1.0));
  for (int top_k : {0, 20}) {
    int brace = 0;
    const int n = 4000;
    for (int i = 0; i < n; ++i) {
      SamplingParams p;
      p.temperature = 1.0f;
      p.top_k = top_k;
      p.seed = i;
      p.constraint = constraint;
      RequestSampler sampler(p, 0, 0);
      ASSERT_EQ(sampler.Sample(logits).token_id, 1);  // "<t>"
      const int32_t second = sampler.Sample(logits).token_id;
      ASSERT_TRUE(second == 2 || second == 14) << second;
      brace += second == 2;
    }
    EXPECT_NEAR(static_cast<double>(brace) / n, p_brace, 0.03) << "top_k " << top_k;
  }
}

// A model that would write a string forever: the call still closes by max_tokens, the last token
// being EOS; with max_tokens below the shortest call, the text is a cut-short prefix instead.
TEST(ConstrainedSamplerTest, ClosesTheCallWithinMaxTokens) {
  auto texts = Texts(kVocab);
  auto constraint = std::make_shared<JsonCallConstraint>(texts, std::vector<std::string>{"<t>"},
                                                         std::string("</t>"));
  std::vector<float> logits(kVocab.size(), 0.0f);
  logits[12] = 9.0f;  // "x": only ever allowed inside a string
  logits[14] = 8.0f;  // "{""
  logits[4] = 1.0f;   // """
  for (int max_tokens : {12, 13, 20, 40}) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = max_tokens;
    p.constraint = constraint;
    RequestSampler sampler(p, 1, 0);
    auto check = constraint->Start();
    std::string text;
    int32_t id = -1;
    for (int i = 0; i < max_tokens && id != 0; ++i) {
      id = sampler.Sample(logits).token_id;
      if (id != 0) {
        ASSERT_TRUE(check->Allows(kVocab[id])) << text << " + " << kVocab[id];
        check->Advance(kVocab[id]);
        text += kVocab[id];
      }
    }
    EXPECT_EQ(id, 0) << "max_tokens " << max_tokens << ": " << text;
    EXPECT_TRUE(check->complete()) << text;
    EXPECT_TRUE(text.starts_with("<t>{\"x")) << text;
  }
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 5;  // "<t>{}</t>" and EOS need more (counted a byte a token)
  p.constraint = constraint;
  RequestSampler sampler(p, 1, 0);
  std::string text;
  for (int i = 0; i < 5; ++i) text += kVocab[sampler.Sample(logits).token_id];
  EXPECT_EQ(text, "<t>{\"xxx");
  EXPECT_FALSE(sampler.constraint_released());
}

// Drafts are checked position by position on a clone: the count stops at the first token the
// sampler could not pick there, an end token counts once the text is whole, and the sampler's own
// state does not move.
TEST(ConstrainedSamplerTest, NumAllowedDraftsChecksEachPositionOnAClone) {
  auto texts = Texts(kVocab);
  auto constraint = std::make_shared<JsonCallConstraint>(texts, std::vector<std::string>{"<t>"},
                                                         std::string("</t>"));
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 64;
  p.constraint = constraint;
  RequestSampler sampler(p, 1, 0);
  // <t> { "k" : 1 } </t> <eos>: all allowed.
  const std::vector<int32_t> whole = {1, 2, 18, 6, 7, 3, 11, 0};
  EXPECT_EQ(sampler.NumAllowedDrafts(whole), 8);
  EXPECT_EQ(sampler.NumAllowedDrafts(std::vector<int32_t>{1, 2, 3, 12, 11}), 3);  // x after {}
  EXPECT_EQ(sampler.NumAllowedDrafts(std::vector<int32_t>{2, 3}), 0);             // no <t> first
  EXPECT_EQ(sampler.NumAllowedDrafts(std::vector<int32_t>{1, 0}), 1);  // EOS before the end
  EXPECT_EQ(sampler.NumAllowedDrafts({}), 0);
  std::vector<float> logits(kVocab.size(), 0.0f);
  logits[1] = 1.0f;
  EXPECT_EQ(sampler.Sample(logits).token_id, 1) << "the sampler's state is still at the start";
  EXPECT_EQ(sampler.NumAllowedDrafts(std::vector<int32_t>{2, 18, 6, 7, 3}), 5);
  SamplingParams free = p;
  free.constraint = nullptr;
  EXPECT_EQ(RequestSampler(free, 1, 0).NumAllowedDrafts(std::vector<int32_t>{2, 3, 12}), 3);
}

TEST(ConstrainedSamplerTest, NothingFitsReleasesTheConstraint) {
  auto texts = Texts({"<eos>", "a", "b"});
  auto constraint =
      std::make_shared<JsonCallConstraint>(texts, std::vector<std::string>{"{"}, std::string(""));
  SamplingParams p;
  p.temperature = 0.0f;
  p.constraint = constraint;
  RequestSampler sampler(p, 1, 0);
  EXPECT_EQ(sampler.Sample(std::vector<float>{0.0f, 1.0f, 2.0f}).token_id, 2);
  EXPECT_TRUE(sampler.constraint_released());
}

TEST(ConstrainedSamplerTest, CompleteTextEndsWithEosOrAStopToken) {
  auto texts = Texts({"<eos>", "{}", "x", "<stop>"});
  auto constraint =
      std::make_shared<JsonCallConstraint>(texts, std::vector<std::string>{""}, std::string(""));
  SamplingParams p;
  p.temperature = 0.0f;
  p.constraint = constraint;
  p.stop_token_ids = {3};
  p.ignore_eos = true;  // only the stop token ends it then
  RequestSampler sampler(p, 1, 0);
  const std::vector<float> logits = {5.0f, 1.0f, 4.0f, 0.0f};
  EXPECT_EQ(sampler.Sample(logits).token_id, 1);
  EXPECT_EQ(sampler.Sample(logits).token_id, 3);
}

}  // namespace
}  // namespace pd::engine
