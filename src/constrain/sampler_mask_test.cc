// The sampler's mask fast path (AllowedTokens) chooses exactly what masking every token through
// Allows would, including states that are whole sentences and may still go on (EOS competes with
// the tokens that continue).
#include <gtest/gtest.h>

#include <random>

#include "constrain/constrain_test_util.h"
#include "constrain/structured_output.h"
#include "engine/sampler.h"

namespace pd::constrain {
namespace {

const std::vector<std::string> kVocab = {"<eos>", "1", "23", ".", "4.", "x", "5", ".6", "7x"};

int32_t MaskedArgMax(const std::vector<float>& logits, const engine::ConstraintState& state) {
  int32_t best = -1;
  for (int32_t id = 0; id < static_cast<int32_t>(logits.size()); ++id) {
    const bool ok = id == 0 ? state.accepting() : !state.complete() && state.Allows(kVocab[id]);
    if (ok && (best < 0 || logits[id] > logits[best])) best = id;
  }
  return best;
}

TEST(SamplerMaskTest, GreedyEqualsTheFullMaskAndEosOnlyWhenAccepting) {
  auto texts = testing::TextsOf(kVocab);
  StructuredOutputCompiler compiler(texts);
  auto constraint = compiler.Compile({StructuredOutput::Kind::kRegex, R"([0-9]+(\.[0-9]+)?)", ""});
  ASSERT_TRUE(constraint.ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int ended = 0;
  for (int trial = 0; trial < 100; ++trial) {
    engine::SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 1000;
    p.constraint = *constraint;
    engine::RequestSampler sampler(p, 1, /*eos_token_id=*/0);
    auto reference = (*constraint)->Start();
    std::string text;
    for (int step = 0; step < 30; ++step) {
      ASSERT_NE(reference->AllowedTokens(), nullptr);
      std::vector<float> logits(kVocab.size());
      for (float& l : logits) l = normal(rng);
      const int32_t want = MaskedArgMax(logits, *reference);
      const int32_t got = sampler.Sample(logits).token_id;
      ASSERT_EQ(got, want) << "trial " << trial << " after '" << text << "'";
      if (got == 0) {
        ++ended;
        break;
      }
      reference->Advance(kVocab[got]);
      text += kVocab[got];
    }
    EXPECT_FALSE(sampler.constraint_released());
  }
  EXPECT_GT(ended, 10);
}

// Sampling with a temperature draws only allowed tokens, and max_tokens still closes the text.
TEST(SamplerMaskTest, SampledTextsMatchAndCloseWithinMaxTokens) {
  auto texts = testing::TextsOf(kVocab);
  StructuredOutputCompiler compiler(texts);
  auto constraint = compiler.Compile({StructuredOutput::Kind::kRegex, R"([0-9]{2,}\.[0-9]+)", ""});
  ASSERT_TRUE(constraint.ok());
  for (int seed = 0; seed < 50; ++seed) {
    engine::SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = seed % 2 == 0 ? 0 : 4;
    p.seed = seed;
    p.max_tokens = 6;
    p.constraint = *constraint;
    engine::RequestSampler sampler(p, 1, 0);
    std::vector<float> logits(kVocab.size(), 0.0f);
    logits[5] = 6.0f;  // "x": never allowed
    std::string text;
    int32_t id = -1;
    for (int i = 0; i < p.max_tokens && id != 0; ++i) {
      id = sampler.Sample(logits).token_id;
      if (id != 0) text += kVocab[id];
    }
    EXPECT_EQ(id, 0) << "seed " << seed << ": " << text;
    auto check = (*constraint)->Start();
    check->Advance(text);
    EXPECT_TRUE(check->accepting()) << text;
  }
}

}  // namespace
}  // namespace pd::constrain
