// Speculative decoding: the config parser, the n-gram proposer, the rejection sampler's output
// distribution, and the engine's verification on a fake model (spec_runner_test.cc runs a real
// one): outputs identical to no speculation, cut at max_tokens / EOS / stop ids mid-draft, also
// under an output constraint, KV pages all free after rejections, preemptions and aborts.
#include "engine/spec_decode.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/sampler.h"

namespace pd::engine {
namespace {

using ::pd::engine::testing::FakeEngineOptions;
using ::pd::engine::testing::FakeRunner;
using ::pd::engine::testing::Greedy;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SpecConfigTest, ParsesVllmShapeWithNgramDefaults) {
  auto c = ParseSpeculativeConfig(
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->method, SpecMethod::kNgram);
  EXPECT_EQ(c->num_speculative_tokens, 3);
  EXPECT_EQ(c->prompt_lookup_min, 4);
  EXPECT_EQ(c->prompt_lookup_max, 4);
  c = ParseSpeculativeConfig(R"({"method": "ngram", "num_speculative_tokens": 2})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->prompt_lookup_min, 5);
  EXPECT_EQ(c->prompt_lookup_max, 5);
  c = ParseSpeculativeConfig(
      R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 3})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->prompt_lookup_min, 1);
  EXPECT_EQ(c->prompt_lookup_max, 3);
  c = ParseSpeculativeConfig(R"({"method": "draft_model", "num_speculative_tokens": 4,
                                 "model": "/models/small"})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->method, SpecMethod::kDraftModel);
  EXPECT_EQ(c->model, "/models/small");
}

TEST(SpecConfigTest, ErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"not json", "not valid JSON"},
      {"[1]", "must be a JSON object"},
      {R"({"num_speculative_tokens": 3})", "method is required"},
      {R"({"method": "eagle", "num_speculative_tokens": 3})", "\"eagle\" is not one of"},
      {R"({"method": "ngram"})", "num_speculative_tokens is required"},
      {R"({"method": "ngram", "num_speculative_tokens": 0})", "num_speculative_tokens must be"},
      {R"({"method": "ngram", "num_speculative_tokens": 2.5})", "must be an integer"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
           "prompt_lookup_max": 2})",
       "prompt_lookup_max (2) must be >= prompt_lookup_min (4)"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0})",
       "prompt_lookup_min must be >= 1"},
      {R"({"method": "draft_model", "num_speculative_tokens": 2})", "model is required"},
      {R"({"method": "mtp", "num_speculative_tokens": 1, "prompt_lookup_min": 2})",
       "apply to method \"ngram\" only"},
      {R"({"method": "ngram", "num_speculative_tokens": 2, "acceptance": 1})",
       "field \"acceptance\" is not supported"},
  };
  for (const auto& [json, want] : cases) {
    auto c = ParseSpeculativeConfig(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(c.status().message(), HasSubstr(want)) << json;
    EXPECT_THAT(c.status().message(), HasSubstr("--speculative-config")) << json;
  }
}

TEST(NgramProposeTest, LongestMatchEarliestOccurrence) {
  // vLLM's docstring example: [4,2,3] has no earlier match, [2,3] has: propose what followed it.
  EXPECT_THAT(NgramPropose(std::vector<int32_t>{1, 2, 3, 4, 2, 3}, 2, 3, 4), ElementsAre(4, 2, 3));
  // The longest n wins over a shorter, and the earliest occurrence of it.
  const std::vector<int32_t> t = {7, 1, 2, 9, 5, 1, 2, 8, 6, 1, 2};
  EXPECT_THAT(NgramPropose(t, 1, 2, 2), ElementsAre(9, 5));
  EXPECT_THAT(NgramPropose(std::vector<int32_t>{5, 1, 2, 8, 9, 0, 1, 2}, 1, 3, 3),
              ElementsAre(8, 9, 0));
  EXPECT_THAT(NgramPropose(std::vector<int32_t>{1, 2, 3, 2, 3}, 2, 2, 5), ElementsAre(2, 3));
  // A match may overlap the suffix (a repeated token).
  EXPECT_THAT(NgramPropose(std::vector<int32_t>{4, 4, 4}, 2, 2, 3), ElementsAre(4));
  EXPECT_TRUE(NgramPropose(std::vector<int32_t>{1, 2, 3, 4}, 1, 3, 3).empty());
  EXPECT_TRUE(NgramPropose(std::vector<int32_t>{1, 2, 1, 2}, 3, 3, 3).empty());  // too short
  EXPECT_TRUE(NgramPropose(std::vector<int32_t>{1, 1}, 1, 1, 0).empty());
}

// Pearson's chi-square of observed counts against probabilities.
double ChiSquare(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  double chi2 = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double expect = p[i] * static_cast<double>(n);
    if (expect == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has no probability";
      continue;
    }
    chi2 += (counts[i] - expect) * (counts[i] - expect) / expect;
  }
  return chi2;
}

// The 0.999 quantile of chi-square with 4 degrees of freedom: a correct sampler fails one seed in
// a thousand (the seeds are fixed, so the test is deterministic); a sampler off by 1% of mass on
// one token over 200k draws gives chi2 in the hundreds.
constexpr double kChi2Df4At999 = 18.467;

TEST(SpecCountersTest, SumAddsEveryCounterAndPosition) {
  SpecDecodeCounters a{2, 6, 3, {2, 1, 0}};
  a += SpecDecodeCounters{1, 4, 4, {1, 1, 1, 1}};
  EXPECT_EQ(a.num_drafts, 3);
  EXPECT_EQ(a.num_draft_tokens, 10);
  EXPECT_EQ(a.num_accepted_tokens, 7);
  EXPECT_THAT(a.accepted_per_pos, ElementsAre(3, 2, 1, 1));
  a += SpecDecodeCounters{};
  EXPECT_THAT(a.accepted_per_pos, ElementsAre(3, 2, 1, 1));
}

TEST(RejectionSampleTest, OutputFollowsTheTargetDistribution) {
  const std::vector<double> p = {0.05, 0.40, 0.25, 0.10, 0.20};
  const std::vector<double> q = {0.30, 0.10, 0.30, 0.25, 0.05};
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::discrete_distribution<int> draft_dist(q.begin(), q.end());
  constexpr int64_t kN = 200000;
  std::vector<int64_t> counts(p.size(), 0);
  int64_t accepted = 0;
  for (int64_t i = 0; i < kN; ++i) {
    const int32_t draft = draft_dist(rng);
    const RejectionResult r = RejectionSample(p, q, draft, u(rng), u(rng));
    ++counts[r.token_id];
    accepted += r.accepted ? 1 : 0;
  }
  EXPECT_LT(ChiSquare(counts, p, kN), kChi2Df4At999);
  // Acceptance rate is sum(min(p, q)) = 0.05 + 0.10 + 0.25 + 0.10 + 0.05 = 0.55.
  EXPECT_NEAR(static_cast<double>(accepted) / kN, 0.55, 0.01);
  // A point mass q at the draft: kept with probability p(draft), else drawn from p without it.
  std::vector<double> point(p.size(), 0.0);
  point[2] = 1.0;
  EXPECT_TRUE(RejectionSample(p, point, 2, 0.24, 0.5).accepted);
  const RejectionResult r = RejectionSample(p, point, 2, 0.26, 0.0);
  EXPECT_FALSE(r.accepted);
  EXPECT_EQ(r.token_id, 0);
}

// The engine's path for a one-token draft (spec_decode.h): sample the target, keep it while it
// equals the draft. Its first token must follow the target's processed distribution (temperature,
// top-k, top-p) whatever the draft is.
TEST(RejectionSampleTest, PointMassDraftsKeepTheProcessedTargetDistribution) {
  const std::vector<float> logits = {1.0f, 2.5f, 0.3f, 1.8f, 2.2f, -1.0f};
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = 5;  // drops token 5
  // Expected: softmax(logits / 0.8) over the top 5.
  std::vector<double> p(6, 0.0);
  double sum = 0.0;
  for (int i = 0; i < 5; ++i) sum += p[i] = std::exp(logits[i] / 0.8);
  for (double& x : p) x /= sum;
  for (int32_t draft : {1, 2, 5}) {
    constexpr int64_t kN = 100000;
    std::vector<int64_t> counts(6, 0);
    int64_t accepted = 0;
    for (int64_t i = 0; i < kN; ++i) {
      RequestSampler sampler(params, /*default_seed=*/7919 * i + draft);
      const int32_t t = sampler.Sample(logits).token_id;
      ++counts[t];
      accepted += t == draft ? 1 : 0;
    }
    std::vector<int64_t> kept(counts.begin(), counts.begin() + 5);  // 5 degrees of freedom - 1
    std::vector<double> pk(p.begin(), p.begin() + 5);
    EXPECT_LT(ChiSquare(kept, pk, kN), kChi2Df4At999) << "draft " << draft;
    EXPECT_EQ(counts[5], 0);
    EXPECT_NEAR(static_cast<double>(accepted) / kN, p[draft], 0.01) << "draft " << draft;
  }
}

// ---- The engine: verification on a fake model -------------------------------------------------

struct Out {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::kNone;
  int32_t stop_token_id = -1;
};

// Steps until idle, checking the pages after every step; `abort_at` aborts ids at given steps.
std::map<int64_t, Out> RunSteps(Engine& engine, const std::map<int, int64_t>& abort_at = {}) {
  std::map<int64_t, Out> results;
  for (int step = 0; engine.HasWork() && step < 10000; ++step) {
    if (auto it = abort_at.find(step); it != abort_at.end()) engine.Abort(it->second);
    auto outputs = engine.Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status().ToString();
    if (!outputs.ok()) break;
    for (RequestOutput& o : *outputs) {
      Out& r = results[o.request_id];
      EXPECT_EQ(r.finish, FinishReason::kNone) << "output after the final one";
      r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      r.logprobs.insert(r.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      EXPECT_EQ(o.num_generated_tokens, static_cast<int>(r.tokens.size()));
      r.finish = o.finish_reason;
      r.stop_token_id = o.stop_token_id;
    }
    const Status pages = engine.CheckPages();
    EXPECT_TRUE(pages.ok()) << pages.ToString();
  }
  EXPECT_FALSE(engine.HasWork());
  return results;
}

SpeculativeConfig Ngram(int k, int min_n = 1, int max_n = 3) {
  SpeculativeConfig c;
  c.method = SpecMethod::kNgram;
  c.num_speculative_tokens = k;
  c.prompt_lookup_min = min_n;
  c.prompt_lookup_max = max_n;
  return c;
}

std::unique_ptr<Engine> MakeSpecEngine(const FakeRunner::Options& ro, EngineOptions eo,
                                       const SpeculativeConfig& spec) {
  eo.speculative = spec;
  auto engine = Engine::CreateWithRunner(FakeRunner::Make(ro), eo);
  PD_CHECK(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

// A prompt that repeats itself, so that n-gram lookup finds drafts from the first step.
std::vector<int32_t> RepeatingPrompt(int len, int salt, int vocab) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = ((i % (3 + salt % 4)) * 5 + salt) % vocab;
  return p;
}

// All free or cached (evictable) once nothing runs.
void ExpectPagesFree(const Engine& engine) {
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.num_free_pages, s.num_total_pages);
}

struct SpecCase {
  int page_size;
  int budget;
  int copy_period;  // 0: a random-looking model (drafts mostly rejected)
  int k;
};

class SpecEngineTest : public ::testing::TestWithParam<SpecCase> {};

// Many requests at once, max_tokens from 1 to 12 (landing anywhere in a draft), an EOS token:
// every output is token for token the one without speculation, and so are the finish reasons.
TEST_P(SpecEngineTest, GreedyOutputsAreIdenticalToNoSpeculation) {
  const SpecCase c = GetParam();
  FakeRunner::Options ro;
  ro.vocab_size = 7;
  ro.page_size = c.page_size;
  ro.num_pages = 600 / c.page_size + 8;
  ro.copy_period = c.copy_period;
  ro.eos_token_id = 6;
  const EngineOptions eo = FakeEngineOptions(c.budget, 6);
  auto plain = MakeSpecEngine(ro, eo, SpeculativeConfig{});
  auto spec = MakeSpecEngine(ro, eo, Ngram(c.k));
  for (int i = 0; i < 12; ++i) {
    Request r = Greedy(i, RepeatingPrompt(3 + (i * 5) % 17, i, 6), 1 + i);
    r.sampling.ignore_eos = i % 3 == 0;
    r.sampling.logprobs = i % 2 == 0 ? 2 : -1;
    ASSERT_TRUE(plain->AddRequest(r).ok());
    ASSERT_TRUE(spec->AddRequest(r).ok());
  }
  auto want = RunSteps(*plain);
  auto got = RunSteps(*spec);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << "request " << i;
    EXPECT_EQ(got[i].stop_token_id, want[i].stop_token_id) << "request " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << "request " << i;
    for (size_t j = 0; j < got[i].logprobs.size(); ++j) {
      EXPECT_EQ(got[i].logprobs[j].token_id, want[i].logprobs[j].token_id);
      EXPECT_NEAR(got[i].logprobs[j].logprob, want[i].logprobs[j].logprob, 1e-6);
      EXPECT_EQ(got[i].logprobs[j].top, want[i].logprobs[j].top);
    }
  }
  const SpecDecodeCounters& n = spec->stats().spec_decode;
  EXPECT_GT(n.num_drafts, 0);
  EXPECT_GE(n.num_draft_tokens, n.num_drafts);
  EXPECT_LE(n.num_accepted_tokens, n.num_draft_tokens);
  ASSERT_EQ(n.accepted_per_pos.size(), static_cast<size_t>(c.k));
  int64_t per_pos = 0;
  for (int j = 0; j < c.k; ++j) {
    per_pos += n.accepted_per_pos[j];
    if (j > 0) {
      EXPECT_LE(n.accepted_per_pos[j], n.accepted_per_pos[j - 1]);
    }
  }
  EXPECT_EQ(per_pos, n.num_accepted_tokens);
  if (c.copy_period > 0) {  // a copying model: most drafts are right
    EXPECT_GT(n.num_accepted_tokens, n.num_draft_tokens / 2);
    EXPECT_LT(spec->runner().steps_done(), plain->runner().steps_done());
  } else {  // a random-looking one: some are right, most are not
    EXPECT_GT(n.num_accepted_tokens, 0);
    EXPECT_GT(n.num_draft_tokens, 2 * n.num_accepted_tokens);
  }
  ExpectPagesFree(*spec);
  EXPECT_EQ(plain->stats().spec_decode.num_drafts, 0);
}

INSTANTIATE_TEST_SUITE_P(PagesBudgetsModels, SpecEngineTest,
                         ::testing::Values(SpecCase{1, 512, 5, 3}, SpecCase{3, 512, 5, 4},
                                           SpecCase{16, 512, 4, 2}, SpecCase{3, 9, 5, 4},
                                           SpecCase{4, 512, 0, 3}, SpecCase{3, 7, 0, 1}));

// With a seed, speculation draws one random number per output token, exactly as without it: the
// sampled tokens are the same (temperature, top-k, top-p), so their distribution is the target's.
TEST(SpecEngineSamplingTest, SeededSamplingIsIdenticalToNoSpeculation) {
  FakeRunner::Options ro;
  ro.vocab_size = 6;
  ro.copy_period = 4;
  const EngineOptions eo = FakeEngineOptions(64, 8);
  auto plain = MakeSpecEngine(ro, eo, SpeculativeConfig{});
  auto spec = MakeSpecEngine(ro, eo, Ngram(3));
  for (int i = 0; i < 8; ++i) {
    Request r = Greedy(i, RepeatingPrompt(5 + i, i, 6), 20);
    r.sampling.temperature = 0.7f + 0.2f * (i % 3);
    r.sampling.top_k = i % 2 == 0 ? 3 : 0;
    r.sampling.top_p = i % 4 == 1 ? 0.8f : 1.0f;
    r.sampling.seed = 77 + i;
    ASSERT_TRUE(plain->AddRequest(r).ok());
    ASSERT_TRUE(spec->AddRequest(r).ok());
  }
  auto want = RunSteps(*plain);
  auto got = RunSteps(*spec);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  EXPECT_GT(spec->stats().spec_decode.num_accepted_tokens, 0);
  ExpectPagesFree(*spec);
}

// A pool too small for everyone: sequences with drafts are preempted and recomputed, others are
// aborted mid-draft; outputs stay those of no speculation and every page comes back.
TEST(SpecEnginePagesTest, PreemptionAndAbortsLeaveEveryPageFree) {
  FakeRunner::Options ro;
  ro.vocab_size = 5;
  ro.page_size = 3;
  ro.num_pages = 14;
  ro.copy_period = 3;
  const EngineOptions eo = FakeEngineOptions(16, 8);
  auto plain = MakeSpecEngine(ro, eo, SpeculativeConfig{});
  auto spec = MakeSpecEngine(ro, eo, Ngram(4));
  for (int i = 0; i < 6; ++i) {
    Request r = Greedy(i, RepeatingPrompt(4 + 2 * i, i, 5), 14);
    ASSERT_TRUE(plain->AddRequest(r).ok());
    ASSERT_TRUE(spec->AddRequest(r).ok());
  }
  auto plain_out = RunSteps(*plain);
  auto got = RunSteps(*spec, {{3, 4}, {6, 1}});  // abort 4 at step 3, 1 at step 6
  EXPECT_GT(spec->stats().num_preemptions, 0);
  for (int i : {0, 2, 3, 5}) EXPECT_EQ(got[i].tokens, plain_out[i].tokens) << "request " << i;
  for (int i : {1, 4}) {
    EXPECT_EQ(got[i].finish, FinishReason::kAbort) << "request " << i;
    const auto& full = plain_out[i].tokens;
    ASSERT_LE(got[i].tokens.size(), full.size());
    EXPECT_TRUE(std::equal(got[i].tokens.begin(), got[i].tokens.end(), full.begin()));
  }
  EXPECT_GT(spec->stats().spec_decode.num_drafts, 0);
  ExpectPagesFree(*spec);
}

// Only verified tokens reach the prefix cache: a request whose prompt is an earlier request's
// prompt and output (found cached) continues exactly as the oracle does.
TEST(SpecEnginePagesTest, PrefixCacheHoldsOnlyVerifiedTokens) {
  FakeRunner::Options ro;
  ro.vocab_size = 6;
  ro.page_size = 2;
  ro.num_pages = 64;
  ro.copy_period = 5;
  auto spec = MakeSpecEngine(ro, FakeEngineOptions(64, 4), Ngram(4));
  const std::vector<int32_t> prompt = RepeatingPrompt(9, 2, 6);
  ASSERT_TRUE(spec->AddRequest(Greedy(1, prompt, 17)).ok());
  auto first = RunSteps(*spec);
  std::vector<int32_t> second_prompt = prompt;
  second_prompt.insert(second_prompt.end(), first[1].tokens.begin(), first[1].tokens.end());
  ASSERT_TRUE(spec->AddRequest(Greedy(2, second_prompt, 9)).ok());
  auto second = RunSteps(*spec);
  EXPECT_GT(spec->stats().prefix_cache_hits, 0);
  EXPECT_EQ(first[1].tokens, FakeRunner::GreedyOracle(prompt, 6, 17, -1, 5));
  EXPECT_EQ(second[2].tokens, FakeRunner::GreedyOracle(second_prompt, 6, 9, -1, 5));
  ExpectPagesFree(*spec);
}

// Constrained outputs (one JSON object) on a copying model: n-gram drafts come from the context,
// the sampler masks each verified position, and the drafts the constraint would refuse are cut
// before verification (RequestSampler::NumAllowedDrafts). Greedy and seeded outputs are those
// without speculation, token for token, and each is one whole object.
TEST(SpecEngineConstraintTest, ConstrainedOutputsAreIdenticalToNoSpeculation) {
  auto texts = std::make_shared<TokenTexts>();
  for (const char* t : {"{", "}", "\"a\"", ":", "1", ",", " ", "<eos>"}) {
    texts->bytes.push_back(t);
    texts->writes.push_back(std::string(t) != "<eos>");
  }
  auto object =
      std::make_shared<JsonCallConstraint>(texts, std::vector<std::string>{""}, std::string(""));
  FakeRunner::Options ro;
  ro.vocab_size = 8;
  ro.eos_token_id = 7;
  ro.copy_period = 4;
  const EngineOptions eo = FakeEngineOptions(64, 8);
  auto plain = MakeSpecEngine(ro, eo, SpeculativeConfig{});
  auto spec = MakeSpecEngine(ro, eo, Ngram(3));
  for (int i = 0; i < 8; ++i) {
    Request r = Greedy(i, RepeatingPrompt(6 + i, i, 7), 8 + 3 * i);
    r.sampling.constraint = object;
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = 5 + i;
    }
    ASSERT_TRUE(plain->AddRequest(r).ok());
    ASSERT_TRUE(spec->AddRequest(r).ok());
  }
  auto want = RunSteps(*plain);
  auto got = RunSteps(*spec);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << "request " << i;
    auto state = object->Start();
    for (int32_t t : got[i].tokens)
      if (t != ro.eos_token_id) state->Advance(texts->bytes[t]);
    EXPECT_TRUE(state->complete()) << "request " << i << " is not one whole object";
  }
  const SpecDecodeCounters& n = spec->stats().spec_decode;
  EXPECT_GT(n.num_drafts, 0);
  EXPECT_GT(n.num_accepted_tokens, 0);
  // The constraint refuses most drafts the context offers on this model (uncut, 127 draft tokens
  // were verified for 16 accepted); cut, only drafts the sampler could pick are verified (25).
  EXPECT_LT(n.num_draft_tokens, 2 * n.num_accepted_tokens);
  ExpectPagesFree(*spec);
}

TEST(SpecEngineConfigTest, CreateRefusesMethodsNotBuiltAndBadRanges) {
  FakeRunner::Options ro;
  EngineOptions eo = FakeEngineOptions();
  eo.speculative.method = SpecMethod::kMtp;
  eo.speculative.num_speculative_tokens = 1;
  auto e = Engine::CreateWithRunner(FakeRunner::Make(ro), eo);
  ASSERT_FALSE(e.ok());
  // mtp needs the checkpoint's MTP layer: an engine on a given runner has none.
  EXPECT_THAT(e.status().message(), HasSubstr("\"mtp\" runs in an engine made by"));
  eo.speculative = Ngram(kMaxSpeculativeTokens + 1);
  e = Engine::CreateWithRunner(FakeRunner::Make(ro), eo);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("num_speculative_tokens"));
}

}  // namespace
}  // namespace pd::engine
