#include "engine/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace pd::engine {
namespace {

using ::testing::HasSubstr;

SamplingParams Params(float temperature, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

std::vector<double> Softmax(const std::vector<float>& logits, double temperature = 1.0) {
  double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((logits[i] - max) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

// Draws n tokens and returns their frequencies.
std::vector<double> Frequencies(RequestSampler& sampler, const std::vector<float>& logits, int n) {
  std::vector<double> freq(logits.size(), 0.0);
  for (int i = 0; i < n; ++i) freq[sampler.Sample(logits).token_id] += 1.0 / n;
  return freq;
}

// Each frequency is within 5 standard deviations of its probability (fixed seeds: deterministic).
void ExpectMatches(const std::vector<double>& freq, const std::vector<double>& probs, int n) {
  ASSERT_EQ(freq.size(), probs.size());
  for (size_t i = 0; i < probs.size(); ++i) {
    double sigma = std::sqrt(probs[i] * (1 - probs[i]) / n) + 1e-12;
    EXPECT_NEAR(freq[i], probs[i], 5 * sigma + 1e-9) << "token " << i;
  }
}

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  RequestSampler sampler(Params(0.0f), 0);
  EXPECT_EQ(sampler.Sample(std::vector<float>{0.1f, 2.0f, -1.0f, 1.9f}).token_id, 1);
  EXPECT_EQ(sampler.Sample(std::vector<float>{3.0f, 1.0f, 3.0f}).token_id, 0);
  EXPECT_EQ(ArgMax(std::vector<float>{-5.0f, -2.0f, -2.0f}), 1);
}

TEST(SamplerTest, LogprobIsLogSoftmaxOfRawLogits) {
  std::vector<float> logits = {1.0f, 3.0f, 0.5f, 2.0f, -1.0f};
  SamplingParams p = Params(0.7f);  // temperature does not change the reported logprob
  p.logprobs = 3;
  RequestSampler sampler(p, 0);
  SampleResult r = sampler.Sample(logits);
  std::vector<double> probs = Softmax(logits);
  EXPECT_NEAR(r.logprob, std::log(probs[r.token_id]), 1e-6);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].first, 1);
  EXPECT_EQ(r.top[1].first, 3);
  EXPECT_EQ(r.top[2].first, 0);
  for (auto [id, lp] : r.top) EXPECT_NEAR(lp, std::log(probs[id]), 1e-6);
}

TEST(SamplerTest, LogprobsZeroGivesChosenOnlyAndTopIsCappedByVocab) {
  SamplingParams p = Params(0.0f);
  p.logprobs = 0;
  RequestSampler sampler(p, 0);
  SampleResult r = sampler.Sample(std::vector<float>{0.0f, 1.0f});
  EXPECT_TRUE(r.top.empty());
  EXPECT_NEAR(r.logprob, -std::log1p(std::exp(-1.0)), 1e-6);
  auto top = TopLogprobs(std::vector<float>{2.0f, 2.0f, 1.0f}, 20);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].first, 0);  // ties: lower id first
  EXPECT_EQ(top[1].first, 1);
}

TEST(SamplerTest, LogSoftmaxIsStableForHugeLogits) {
  std::vector<float> logits = {1000.0f, 999.0f, -1000.0f};
  EXPECT_NEAR(LogSoftmaxAt(logits, 0), -std::log1p(std::exp(-1.0)), 1e-5);
  EXPECT_TRUE(std::isfinite(LogSoftmaxAt(logits, 2)));
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::vector<float> logits = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f};
  RequestSampler a(Params(1.0f, 42), 0), b(Params(1.0f, 42), 0), c(Params(1.0f, 43), 0);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 64; ++i) {
    ta.push_back(a.Sample(logits).token_id);
    tb.push_back(b.Sample(logits).token_id);
    tc.push_back(c.Sample(logits).token_id);
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(SamplerTest, SeedWinsOverDefaultSeedAndDefaultSeedIsUsedOtherwise) {
  std::vector<float> logits(16, 0.0f);
  SamplingParams unseeded = Params(1.0f);
  unseeded.seed.reset();
  RequestSampler a(Params(1.0f, 7), 100), b(Params(1.0f, 7), 200);
  RequestSampler c(unseeded, 100), d(unseeded, 100), e(unseeded, 200);
  std::vector<int32_t> ta, tb, tc, td, te;
  for (int i = 0; i < 32; ++i) {
    ta.push_back(a.Sample(logits).token_id);
    tb.push_back(b.Sample(logits).token_id);
    tc.push_back(c.Sample(logits).token_id);
    td.push_back(d.Sample(logits).token_id);
    te.push_back(e.Sample(logits).token_id);
  }
  EXPECT_EQ(ta, tb);
  EXPECT_EQ(tc, td);
  EXPECT_NE(tc, te);
}

TEST(SamplerTest, OneDrawPerTokenWhateverTheLogits) {
  // Same seed, different logits in between: every token consumes exactly one draw, so a nearly
  // certain token does not shift the later random ones.
  std::vector<float> flat(8, 0.0f);
  RequestSampler a(Params(1.0f, 5), 0), b(Params(1.0f, 5), 0);
  std::vector<int32_t> ta, tb;
  for (int i = 0; i < 16; ++i) {
    ta.push_back(a.Sample(flat).token_id);
    if (i % 2 == 0)
      b.Sample(std::vector<float>{0.0f, 50.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f});
    else
      tb.push_back(b.Sample(flat).token_id);
  }
  for (int i = 0; i < 8; ++i) EXPECT_EQ(tb[i], ta[2 * i + 1]);
}

TEST(SamplerTest, TemperatureOneMatchesSoftmax) {
  std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f};
  RequestSampler sampler(Params(1.0f, 123), 0);
  const int n = 20000;
  ExpectMatches(Frequencies(sampler, logits, n), Softmax(logits), n);
}

TEST(SamplerTest, LowTemperatureSharpensHighFlattens) {
  std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f};
  const int n = 20000;
  RequestSampler cold(Params(0.5f, 9), 0), hot(Params(2.0f, 9), 0);
  ExpectMatches(Frequencies(cold, logits, n), Softmax(logits, 0.5), n);
  ExpectMatches(Frequencies(hot, logits, n), Softmax(logits, 2.0), n);
}

TEST(SamplerTest, TopKKeepsOnlyTheKBestRenormalised) {
  std::vector<float> logits = {0.0f, 2.0f, 1.0f, 1.5f, -3.0f};
  SamplingParams p = Params(1.0f, 77);
  p.top_k = 2;
  RequestSampler sampler(p, 0);
  const int n = 20000;
  std::vector<double> expect(5, 0.0);
  double z = std::exp(2.0) + std::exp(1.5);
  expect[1] = std::exp(2.0) / z;
  expect[3] = std::exp(1.5) / z;
  ExpectMatches(Frequencies(sampler, logits, n), expect, n);
}

TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  // probabilities 0.5, 0.3, 0.15, 0.05 (ids 2, 0, 3, 1)
  std::vector<float> logits = {std::log(0.3f), std::log(0.05f), std::log(0.5f), std::log(0.15f)};
  SamplingParams p = Params(1.0f, 99);
  p.top_p = 0.7f;  // 0.5 < 0.7 <= 0.8: keeps ids 2 and 0
  RequestSampler sampler(p, 0);
  const int n = 20000;
  ExpectMatches(Frequencies(sampler, logits, n), {0.3 / 0.8, 0.0, 0.5 / 0.8, 0.0}, n);

  p.top_p = 0.45f;  // the best token alone already reaches it
  RequestSampler only_best(p, 0);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(only_best.Sample(logits).token_id, 2);
}

TEST(SamplerTest, TopKAndTopPCombine) {
  std::vector<float> logits = {std::log(0.3f), std::log(0.05f), std::log(0.5f), std::log(0.15f)};
  SamplingParams p = Params(1.0f, 3);
  p.top_k = 3;     // ids 2, 0, 3 renormalised: 0.526, 0.316, 0.158
  p.top_p = 0.6f;  // then 0.526 < 0.6: keeps 2 and 0
  RequestSampler sampler(p, 0);
  const int n = 20000;
  ExpectMatches(Frequencies(sampler, logits, n), {0.3 / 0.8, 0.0, 0.5 / 0.8, 0.0}, n);
}

TEST(SamplerTest, ValidateNamesFieldAndValue) {
  struct Case {
    void (*mutate)(SamplingParams*);
    const char* field;
    const char* value;
  };
  const Case cases[] = {
      {[](SamplingParams* p) { p->temperature = -0.5f; }, "temperature", "-0.5"},
      {[](SamplingParams* p) { p->temperature = NAN; }, "temperature", "nan"},
      {[](SamplingParams* p) { p->top_p = 0.0f; }, "top_p", "got 0"},
      {[](SamplingParams* p) { p->top_p = 1.5f; }, "top_p", "1.5"},
      {[](SamplingParams* p) { p->top_k = -2; }, "top_k", "-2"},
      {[](SamplingParams* p) { p->max_tokens = 0; }, "max_tokens", "got 0"},
      {[](SamplingParams* p) { p->logprobs = 21; }, "logprobs", "21"},
      {[](SamplingParams* p) { p->logprobs = -2; }, "logprobs", "-2"},
      {[](SamplingParams* p) {
         p->stop_token_ids = {3, 100};
       },
       "stop_token_ids", "100"},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.mutate(&p);
    Status s = ValidateSamplingParams(p, 100);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(s.message(), HasSubstr(c.field));
    EXPECT_THAT(s.message(), HasSubstr(c.value));
  }
  SamplingParams ok;
  ok.temperature = 0.0f;
  ok.top_k = -1;
  ok.logprobs = 20;
  ok.stop_token_ids = {0, 99};
  EXPECT_TRUE(ValidateSamplingParams(ok, 100).ok());
}

TEST(SamplerTest, CheckStopRules) {
  SamplingParams p;
  p.max_tokens = 4;
  p.stop_token_ids = {7};
  StopContext ctx{.eos_token_id = 2, .max_model_len = 10};
  EXPECT_EQ(CheckStop(p, ctx, 5, 1, 3).reason, FinishReason::kNone);
  StopCheck stop = CheckStop(p, ctx, 7, 1, 3);
  EXPECT_EQ(stop.reason, FinishReason::kStop);
  EXPECT_EQ(stop.stop_token_id, 7);
  stop = CheckStop(p, ctx, 2, 1, 3);
  EXPECT_EQ(stop.reason, FinishReason::kStop);
  EXPECT_EQ(stop.stop_token_id, 2);
  EXPECT_EQ(CheckStop(p, ctx, 5, 4, 6).reason, FinishReason::kLength);
  EXPECT_EQ(CheckStop(p, ctx, 7, 4, 6).reason, FinishReason::kStop);     // stop wins over length
  EXPECT_EQ(CheckStop(p, ctx, 5, 2, 10).reason, FinishReason::kLength);  // max_model_len
  p.ignore_eos = true;
  EXPECT_EQ(CheckStop(p, ctx, 2, 1, 3).reason, FinishReason::kNone);
  EXPECT_EQ(CheckStop(p, ctx, 7, 1, 3).reason, FinishReason::kStop);  // stop ids still apply
  StopContext no_eos{.eos_token_id = -1, .max_model_len = 0};
  p.ignore_eos = false;
  EXPECT_EQ(CheckStop(p, no_eos, 2, 1, 1000).reason, FinishReason::kNone);
}

TEST(SamplerTest, FinishReasonNames) {
  EXPECT_EQ(FinishReasonName(FinishReason::kNone), "");
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonName(FinishReason::kAbort), "abort");
  EXPECT_EQ(FinishReasonName(FinishReason::kError), "error");
}

}  // namespace
}  // namespace pd::engine
