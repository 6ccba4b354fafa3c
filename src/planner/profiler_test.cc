#include "planner/profiler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "planner/fit.h"

namespace pd::planner {
namespace {

// Samples of known coefficients for the default quick sweep.
ProfileResult FitKnown(const std::array<double, 3>& p, const std::array<double, 3>& d) {
  ProfileOptions o = DefaultProfileOptions(/*quick=*/true);
  std::vector<PrefillSample> prefill;
  std::vector<DecodeSample> decode;
  for (const ShapeSpec& s : o.prefill_shapes) {
    const double tokens = double(s.batch) * s.length, sq = double(s.batch) * s.length * s.length;
    prefill.push_back({int64_t(tokens), sq, p[0] + p[1] * tokens + p[2] * sq});
  }
  for (const ShapeSpec& s : o.decode_shapes) {
    const double ctx = double(s.batch) * s.length;
    decode.push_back({s.batch, int64_t(ctx), d[0] + d[1] * ctx + d[2] * s.batch});
  }
  auto r = FitProfile(prefill, decode, o.prefill_shapes, o.decode_shapes);
  PD_CHECK(r.ok());
  return *r;
}

TEST(Profiler, FitRecoversCoefficientsWithSmallResiduals) {
  const std::array<double, 3> p = {0.5, 0.02, 1e-5}, d = {0.3, 1e-4, 0.05};
  ProfileResult r = FitKnown(p, d);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(r.coeffs.prefill[i], p[i], 1e-6 * p[i]);
    EXPECT_NEAR(r.coeffs.decode_small[i], d[i], 1e-6 * d[i]);
  }
  EXPECT_EQ(r.coeffs.decode_small, r.coeffs.decode_large);
  EXPECT_LT(r.prefill_rel_rmse, 1e-9);
  EXPECT_LT(r.decode_rel_rmse, 1e-9);
  ASSERT_EQ(r.points.size(), r.prefill.size() + r.decode.size());
  for (const ProfilePoint& pt : r.points) EXPECT_NEAR(pt.rel_error(), 0.0, 1e-9);
  // Every profiled batch uses the one decode form.
  int max_batch = 0;
  for (const auto& s : r.decode) max_batch = std::max(max_batch, s.batch);
  EXPECT_GT(r.coeffs.decode_threshold, max_batch);
}

TEST(Profiler, NoisyQuadraticTermIsClampedAtZero) {
  // Linear prefill with a dip at the longest prompt: the free fit would take a negative c.
  std::vector<PrefillSample> prefill = {
      {16, 256, 1.16}, {64, 4096, 1.64}, {256, 65536, 3.5}, {512, 262144, 5.6}};
  std::vector<ShapeSpec> ps = {{1, 16}, {1, 64}, {1, 256}, {1, 512}};
  std::vector<DecodeSample> decode = {{1, 64, 1.0}, {4, 1024, 1.3}, {16, 1024, 2.2}};
  std::vector<ShapeSpec> ds = {{1, 64}, {4, 256}, {16, 64}};
  auto free_fit = FitPrefill(prefill, FitOptions{true, false});
  ASSERT_TRUE(free_fit.ok());
  EXPECT_LT((*free_fit)[2], 0.0);
  auto r = FitProfile(prefill, decode, ps, ds);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (double v : r->coeffs.prefill) EXPECT_GE(v, 0.0);
  EXPECT_GT(r->coeffs.prefill[1], 0.0);
}

TEST(Profiler, MismatchedShapesAreAnError) {
  std::vector<PrefillSample> prefill = {{16, 256, 1}, {64, 4096, 2}, {256, 65536, 4}};
  std::vector<DecodeSample> decode = {{1, 64, 1.0}, {4, 256, 1.3}, {16, 1024, 2.2}};
  auto r = FitProfile(prefill, decode, {{1, 16}}, {{1, 64}, {4, 64}, {16, 64}});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(Profiler, JsonRoundTripsThroughTheLatencyModelLoader) {
  ProfileResult r = FitKnown({0.5, 0.02, 1e-5}, {0.3, 1e-4, 0.05});
  const std::string json = ProfileToJson(r, "qwen3-small", "cpu, 1 thread(s)", 1);
  auto parsed = ParsePdserveProfile(json, "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  auto c = (*parsed)->Coeffs(1);
  ASSERT_TRUE(c.ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(c->prefill[i], r.coeffs.prefill[i]);
    EXPECT_DOUBLE_EQ(c->decode_small[i], r.coeffs.decode_small[i]);
    EXPECT_DOUBLE_EQ(c->decode_large[i], r.coeffs.decode_large[i]);
  }
  EXPECT_EQ(c->decode_threshold, r.coeffs.decode_threshold);
  EXPECT_EQ((*parsed)->Describe(), "qwen3-small");
  EXPECT_EQ((*parsed)->Coeffs(2).status().code(), StatusCode::kNotFound);
  auto j = nlohmann::json::parse(json);
  EXPECT_EQ(j["samples"].size(), r.points.size());
  EXPECT_EQ(j["threads"], 1);
  // Through a file, as `--profile FILE` reads it.
  std::string path = ::testing::TempDir() + "pd_profile_" + std::to_string(getpid()) + ".json";
  ASSERT_TRUE(WriteStringToFile(path, json).ok());
  auto loaded = LoadProfile(path, "ignored");
  std::remove(path.c_str());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_DOUBLE_EQ((*loaded)->Coeffs(1)->prefill[1], r.coeffs.prefill[1]);
}

TEST(Profiler, BadProfileFilesGiveClearErrors) {
  auto not_json = ParsePdserveProfile("{oops", "p.json");
  EXPECT_EQ(not_json.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(not_json.status().message().find("p.json: not valid JSON"), std::string::npos);
  auto no_tp = ParsePdserveProfile(R"({"format": "pdserve-profile-v1"})", "p.json");
  EXPECT_NE(no_tp.status().message().find("missing field 'tp'"), std::string::npos);
  auto short_triple = ParsePdserveProfile(
      R"({"format": "pdserve-profile-v1", "tp": {"1": {"prefill": [1, 2],
          "decoding_smallbs": [1, 2, 3], "decoding_largebs": [1, 2, 3]}}})",
      "p.json");
  EXPECT_NE(short_triple.status().message().find("'prefill' must be an array of 3 numbers"),
            std::string::npos);
  auto bad_tp = ParsePdserveProfile(R"({"format": "pdserve-profile-v1", "tp": {"x": {}}})", "p");
  EXPECT_NE(bad_tp.status().message().find("not a TP degree"), std::string::npos);
  auto missing = LoadProfile("/nonexistent/profile.json", "m");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/profile.json"), std::string::npos);
}

TEST(Profiler, DefaultSweepsStayWithinTheirLimits) {
  for (bool quick : {true, false}) {
    ProfileOptions o = DefaultProfileOptions(quick, 512, 256);
    EXPECT_GE(o.prefill_shapes.size(), 3u);
    EXPECT_GE(o.decode_shapes.size(), 3u);
    for (const auto& s : o.prefill_shapes) {
      EXPECT_LE(s.batch * s.length, 512);
      EXPECT_LE(s.length, 256);
    }
    for (const auto& s : o.decode_shapes) EXPECT_LE(s.length, 256);
  }
  ProfileOptions o;
  o.prefill_shapes = {{2, 17}};
  o.decode_shapes = {{3, 16}};
  EXPECT_EQ(PagesNeeded(o, 16), 4);  // 2 x ceil(17/16) = 4 > 3 x 1
}

TEST(Profiler, DecodeGridReplacesTheSweepsDecodeShapes) {
  ProfileOptions o = DefaultProfileOptions(true, 1024, 2048);
  const size_t prefill = o.prefill_shapes.size();
  ASSERT_TRUE(SetDecodeGrid(&o, {1, 2, 8}, {64, 240}, 2048).ok());
  ASSERT_EQ(o.decode_shapes.size(), 6u);
  EXPECT_EQ(o.decode_shapes[0].batch, 1);
  EXPECT_EQ(o.decode_shapes[0].length, 64);
  EXPECT_EQ(o.decode_shapes[5].batch, 8);
  EXPECT_EQ(o.decode_shapes[5].length, 240);
  EXPECT_EQ(o.prefill_shapes.size(), prefill);  // prefill untouched
  EXPECT_EQ(PagesNeeded(o, 16), 8 * 15);  // 8 sequences of 240 positions; more than any prompt
}

TEST(Profiler, DecodeGridRefusesEmptyOrOutOfRangeListsAndKeepsTheSweep) {
  ProfileOptions o = DefaultProfileOptions(true, 1024, 2048);
  const size_t n = o.decode_shapes.size();
  EXPECT_FALSE(SetDecodeGrid(&o, {}, {64}, 2048).ok());
  EXPECT_FALSE(SetDecodeGrid(&o, {1}, {}, 2048).ok());
  EXPECT_FALSE(SetDecodeGrid(&o, {0, 2}, {64}, 2048).ok());
  EXPECT_FALSE(SetDecodeGrid(&o, {1}, {64, 4096}, 2048).ok());
  EXPECT_FALSE(SetDecodeGrid(&o, {1}, {0}, 2048).ok());
  EXPECT_EQ(o.decode_shapes.size(), n);
}

}  // namespace
}  // namespace pd::planner
