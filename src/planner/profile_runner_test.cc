// Profiles a tiny synthetic model on the real runner (a second or so with the quick sweep).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "engine/model_runner.h"
#include "model/model_writer.h"
#include "model/weights.h"
#include "planner/profiler.h"

namespace pd::planner {
namespace {

class ProfileRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "pd_profile_runner_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    model::SyntheticModelOptions o;
    o.arch = model::Arch::kQwen3;
    o.preset = "tiny";
    o.seed = 3;
    o.out_dir = dir_;
    ASSERT_TRUE(model::WriteSyntheticModel(o).ok());
    auto w = model::LoadModelWeights(dir_);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    weights_ = std::make_unique<model::ModelWeights>(std::move(*w));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<engine::ModelRunner> MakeRunner(int num_pages) {
    engine::ModelRunnerOptions ro;
    ro.num_threads = 1;
    ro.num_pages = num_pages;
    auto r = engine::ModelRunner::Create(*weights_, ro);
    PD_CHECK(r.ok());
    return std::move(*r);
  }

  std::string dir_;
  std::unique_ptr<model::ModelWeights> weights_;
};

TEST_F(ProfileRunnerTest, QuickSweepFitsNonNegativeCoefficients) {
  ProfileOptions o = DefaultProfileOptions(/*quick=*/true, 512, 512);
  int calls = 0;
  o.progress = [&](const std::string&) { ++calls; };
  auto runner = MakeRunner(PagesNeeded(o, 16));
  auto r = ProfileRunner(*runner, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(calls, static_cast<int>(o.prefill_shapes.size() + o.decode_shapes.size()));
  ASSERT_EQ(r->prefill.size(), o.prefill_shapes.size());
  ASSERT_EQ(r->decode.size(), o.decode_shapes.size());
  for (double v : r->coeffs.prefill) EXPECT_GE(v, 0.0);
  for (double v : r->coeffs.decode_small) EXPECT_GE(v, 0.0);
  // More tokens cost more: the per-token prefill term and some decode growth are positive.
  EXPECT_GT(r->coeffs.prefill[1] + r->coeffs.prefill[2], 0.0);
  EXPECT_GT(r->coeffs.decode_small[1] + r->coeffs.decode_small[2], 0.0);
  for (const auto& s : r->prefill) EXPECT_GT(s.ms, 0.0);
  // Σ context of decode samples is batch x context.
  EXPECT_EQ(r->decode[0].context, int64_t(o.decode_shapes[0].batch) * o.decode_shapes[0].length);
}

TEST_F(ProfileRunnerTest, ShapesBeyondTheRegionOrTheModelAreErrors) {
  ProfileOptions o = DefaultProfileOptions(/*quick=*/true, 512, 512);
  auto small = MakeRunner(4);  // 64 positions
  auto r = ProfileRunner(*small, o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("KV pages"), std::string::npos);
  ProfileOptions too_few;
  too_few.prefill_shapes = {{1, 8}};
  too_few.decode_shapes = {{1, 8}};
  EXPECT_EQ(ProfileRunner(*small, too_few).status().code(), StatusCode::kInvalidArgument);
  ProfileOptions too_long;
  const int max_pos = weights_->config.max_position_embeddings;
  ASSERT_GT(max_pos, 0);
  too_long.prefill_shapes = {{1, max_pos + 1}, {1, 8}, {2, 8}};
  too_long.decode_shapes = {{1, 8}, {2, 8}, {4, 8}};
  auto big = MakeRunner((max_pos + 1) / 16 + 2);
  auto e = ProfileRunner(*big, too_long);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("positions"), std::string::npos);
}

}  // namespace
}  // namespace pd::planner
