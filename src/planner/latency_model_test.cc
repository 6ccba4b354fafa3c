#include "planner/latency_model.h"

#include <gtest/gtest.h>

#include "planner/fit.h"
#include "planner/test_data.h"

namespace pd::planner {
namespace {

const char* kProfile = R"({"m": {"1": {"decoding_large_small_bs_threshold": 4,
  "prefill": [10, 0.1, 0.001], "decoding_smallbs": [5, 0.01, 1], "decoding_largebs": [2, 0.02, 3]}}})";

TEST(StepCoeffs, PrefillAndDecodeForms) {
  auto m = ParseDistServeProfile(kProfile, "m", "test.json");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto c = (*m)->Coeffs(1);
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->PrefillMs(100, 10000), 10 + 10 + 10);
  EXPECT_DOUBLE_EQ(c->PrefillMs(0, 0), 0.0);
  EXPECT_DOUBLE_EQ(c->DecodeMs(3, 300), 5 + 3 + 3);   // small batch
  EXPECT_DOUBLE_EQ(c->DecodeMs(4, 400), 2 + 8 + 12);  // at the threshold: large batch
  StepShape mixed{100, 10000, 3, 300};
  EXPECT_DOUBLE_EQ(c->StepMs(mixed), 30 + 3 + 3);  // decode part without its constant
}

TEST(StepCoeffs, PipelineSplitsStages) {
  StepCoeffs c;
  c.prefill = {10, 0, 0};
  c.decode_small = c.decode_large = {8, 0, 0};
  StepShape prefill{10, 100, 0, 0};
  StepShape decode{0, 0, 2, 20};
  EXPECT_DOUBLE_EQ(PipelineTimes(c, prefill, 1).step_s, 0.010);
  const StageTimes p2 = PipelineTimes(c, prefill, 2);
  EXPECT_DOUBLE_EQ(p2.stage_s, (5 + kPpStageOverheadMs) * 1e-3);
  EXPECT_DOUBLE_EQ(p2.step_s, 2 * p2.stage_s);
  const StageTimes d4 = PipelineTimes(c, decode, 4);
  EXPECT_DOUBLE_EQ(d4.stage_s, 0.002);
  EXPECT_DOUBLE_EQ(d4.step_s, 0.008);
}

TEST(LatencyModel, ParseErrorsNameTheProblem) {
  EXPECT_EQ(ParseDistServeProfile("{", "m", "f.json").status().code(),
            StatusCode::kInvalidArgument);
  auto missing = ParseDistServeProfile(kProfile, "other", "f.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("has: m"), std::string::npos);
  auto short_triple = ParseDistServeProfile(
      R"({"m": {"1": {"prefill": [1, 2], "decoding_smallbs": [1,2,3], "decoding_largebs": [1,2,3]}}})",
      "m", "f.json");
  EXPECT_EQ(short_triple.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_triple.status().message().find("prefill"), std::string::npos);
  auto bad_tp = ParseDistServeProfile(R"({"m": {"x": {}}})", "m", "f.json");
  EXPECT_NE(bad_tp.status().message().find("not a TP degree"), std::string::npos);
  auto m = ParseDistServeProfile(kProfile, "m", "f.json");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->Coeffs(2).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ParsePdserveProfile(R"({"format": "other"})", "p.json").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadProfile("/nonexistent/profile.json", "m").status().code(), StatusCode::kNotFound);
}

TEST(LatencyModel, PdserveProfileRoundTrip) {
  TableLatencyModel model("tiny");
  StepCoeffs c;
  c.prefill = {1.5, 0.25, 1e-6};
  c.decode_small = {2, 0.001, 0.5};
  c.decode_large = {3, 0.002, 0.75};
  c.decode_threshold = 17;
  model.Set(2, c);
  const std::string text = ToPdserveProfileJson(model, "cpu");
  auto back = ParsePdserveProfile(text, "p.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  auto c2 = (*back)->Coeffs(2);
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->prefill, c.prefill);
  EXPECT_EQ(c2->decode_small, c.decode_small);
  EXPECT_EQ(c2->decode_large, c.decode_large);
  EXPECT_EQ(c2->decode_threshold, 17);
  EXPECT_EQ((*back)->Describe(), "tiny");
}

TEST(LatencyModel, LoadsDistServeA100Profile) {
  PD_REQUIRE_DISTSERVE_DATA();
  auto m = LoadProfile(testing::DistServePath("a100-profile/profiler-a100-80g.distserve.json"),
                       "facebook/opt-13b");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto c = (*m)->Coeffs(1);
  ASSERT_TRUE(c.ok());
  EXPECT_NEAR(c->prefill[0], 18.1025, 1e-3);
  EXPECT_EQ(c->decode_threshold, 95);
  // A 512-token prompt on one A100 takes ~72 ms under this profile.
  EXPECT_NEAR(c->PrefillMs(512, 512.0 * 512), 18.10 + 52.18 + 1.87, 0.05);
  EXPECT_EQ((*m)->Coeffs(8).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pd::planner
