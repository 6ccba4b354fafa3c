// deepseek_v3's latent KV cache cannot be transferred yet (engine/disagg_models.h): both
// messengers refuse an MLA model up front, naming it and saying to serve it colocated.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/mla_test_util.h"
#include "messenger/messenger_test_util.h"

namespace pd::messenger {
namespace {

std::unique_ptr<engine::Engine> MlaEngine(const model::ModelWeights& w) {
  engine::EngineOptions o;
  o.runner.kv.page_size = 4;
  o.runner.num_pages = 16;
  o.runner.num_threads = 1;
  o.scheduler.max_model_len = 64;
  auto e = engine::Engine::Create(w, o);
  PD_CHECK(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

void ExpectRefused(const Status& s) {
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
  EXPECT_NE(s.message().find("deepseek_v3"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("colocated"), std::string::npos) << s.ToString();
}

TEST(MessengerMlaTest, PrefillAndDecodeMessengersRefuseALatentCache) {
  auto model = engine::testing::MakeTinyMlaModel({});
  auto prefill_engine = MlaEngine(model->weights);
  PrefillMessengerOptions po = testing::BasePrefillOptions();
  po.model_hash = ModelFingerprint(model->weights);
  auto p = PrefillMessenger::Create(po, prefill_engine->runner());
  ASSERT_FALSE(p.ok());
  ExpectRefused(p.status());

  auto decode_engine = MlaEngine(model->weights);
  engine::ModelRunner& runner = decode_engine->runner();
  DecodeMessengerOptions dopt = testing::BaseDecodeOptions({PrefillPeer{"prefill", "addr"}});
  dopt.model_hash = po.model_hash;
  auto d = DecodeMessenger::Create(dopt, runner, testing::Async(std::move(decode_engine)));
  ASSERT_FALSE(d.ok());
  ExpectRefused(d.status());
}

}  // namespace
}  // namespace pd::messenger
