// `up` refuses a model it cannot disaggregate before it starts anything (engine/disagg_models.h):
// deepseek_v3's latent KV cache has no transfer yet.
#include <gtest/gtest.h>

#include <fstream>

#include "deploy/local_deployment.h"
#include "model/config.h"
#include "model/model_writer.h"
#include "model/test_util.h"

namespace pd::deploy {
namespace {

TEST(LocalDeploymentMlaTest, RefusesDeepseekV3BeforeStartingAnything) {
  model::testing::ScratchDir dir;
  ASSERT_FALSE(dir.path().empty());
  auto config = model::PresetConfig(model::Arch::kDeepseekV3, "tiny");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  std::ofstream(dir / "config.json") << model::ModelConfigToJson(*config);
  LocalDeploymentOptions o;
  o.model = dir.path();
  o.num_prefill = 1;
  o.num_decode = 1;
  const Status s = RunLocalDeployment(o);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
  EXPECT_NE(s.message().find("deepseek_v3"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(dir.path()), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace pd::deploy
