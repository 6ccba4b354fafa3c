// Data-parallel decode instances (engine/dp_engine.h) of deepseek_v3 through the messenger: a
// request goes to the least loaded DP rank and its latent is written into that rank's pages only,
// from one source rank of the prefill instance.
//   - golden: prefill TP {1,2} -> decode DP {2,4}, concurrent requests, chunked prefill, on a
//     tiny MLA + MoE model: greedy tokens equal a colocated TP 1 engine's; the KV bytes are one
//     copy per request (one DP rank written), and every DP rank held requests;
//   - faults: aborted requests and a lost prefill instance leave every page of every DP rank free.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/dp_engine.h"
#include "engine/engine.h"
#include "engine/mla_test_util.h"
#include "engine/moe_test_util.h"
#include "messenger/handshake.h"
#include "messenger/messenger_test_util.h"

namespace pd::messenger {
namespace {

using testing::Async;
using testing::Outcome;
using testing::PendingRequest;
using testing::WaitUntil;
constexpr double kDpDeadlineS = 60.0;

// 2 layers of MLA (latent 40 + 6), the second a MoE layer of 8 experts (top 2, a shared one).
const engine::testing::TinyModel& DpModel() {
  static auto* model = [] {
    engine::testing::TinyMlaOptions o;
    o.layers = 2;
    auto m = engine::testing::MakeTinyMlaModel(o);
    model::MoeConfig c;
    c.scoring = model::MoeConfig::Scoring::kSigmoid;
    c.num_experts = 8, c.num_experts_per_tok = 2, c.moe_intermediate_size = 12;
    c.n_group = 4, c.topk_group = 2, c.n_shared_experts = 1, c.first_k_dense_replace = 1;
    c.norm_topk_prob = true, c.routed_scaling_factor = 2.5;
    engine::testing::AddMoeLayers(m.get(), c, 5);
    return m.release();
  }();
  return *model;
}
constexpr int kLatentDim = 46;
constexpr int kPageSize = 4;

std::unique_ptr<engine::Engine> DpModelEngine(int tp, int dp) {
  engine::EngineOptions o;
  o.runner.kv.page_size = kPageSize;
  o.runner.num_pages = 32;
  o.runner.num_threads = 1;
  o.runner.tensor_parallel_size = tp;
  o.scheduler.max_num_batched_tokens = 8;  // a 13-token prompt prefills in two chunks
  o.scheduler.max_num_seqs = 4;
  o.scheduler.max_model_len = 96;
  auto e = dp == 1 ? engine::Engine::Create(DpModel().weights, o)
                   : engine::CreateDpEngine(DpModel().weights, o, dp);
  PD_CHECK(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

std::unique_ptr<testing::PrefillInstance> StartPrefill(int tp) {
  PrefillMessengerOptions o = testing::BasePrefillOptions();
  o.instance_name = "prefill-tp" + std::to_string(tp);
  o.model_hash = ModelFingerprint(DpModel().weights);
  return testing::LaunchPrefill(DpModelEngine(tp, 1), o);
}

std::unique_ptr<DecodeMessenger> StartDpDecode(int dp, const std::string& peer,
                                               uint32_t timeout_ms = 30000) {
  auto e = DpModelEngine(1, dp);
  engine::ModelRunner& runner = e->runner();
  EXPECT_EQ(engine::DataParallelSize(runner), dp);
  DecodeMessengerOptions o = testing::BaseDecodeOptions({PrefillPeer{"p0", peer}});
  o.instance_name = "decode-dp" + std::to_string(dp);
  o.model_hash = ModelFingerprint(DpModel().weights);
  o.transfer_timeout_ms = timeout_ms;
  auto d = DecodeMessenger::Create(o, runner, Async(std::move(e)));
  PD_CHECK(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

TEST(MessengerDpTest, TpPrefillToDpDecodeGivesTheColocatedTp1GreedyTokens) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(testing::PromptOf(i % 2 == 0 ? 13 : 6, i + 1));
  constexpr int kTokens = 4;
  std::vector<Outcome> want;
  {
    auto colocated = Async(DpModelEngine(1, 1));
    for (const auto& p : prompts)
      want.push_back(testing::Generate(*colocated, p, kTokens, nullptr, kDpDeadlineS));
    colocated->Shutdown();
  }
  for (int ptp : {1, 2}) {
    auto prefill = StartPrefill(ptp);
    if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
    for (int dp : {2, 4}) {
      SCOPED_TRACE("prefill TP " + std::to_string(ptp) + " -> decode DP " + std::to_string(dp));
      auto decode = StartDpDecode(dp, prefill->messenger->fabric_address());
      ASSERT_TRUE(decode->WaitForPeers(kDpDeadlineS).ok());
      std::vector<std::unique_ptr<PendingRequest>> pending;  // at once: spread over the ranks
      for (const auto& p : prompts)
        pending.push_back(
            std::make_unique<PendingRequest>(*decode, p, testing::GreedyParams(kTokens)));
      uint64_t want_kv_bytes = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const Outcome got = pending[i]->Wait(kDpDeadlineS);
        ASSERT_TRUE(got.error.ok()) << got.error.ToString();
        EXPECT_EQ(got.tokens, want[i].tokens) << "prompt " << i;
        // One DP rank gets every layer's latent pages: one copy, whatever dp is.
        const uint64_t pages = PagesForTokens(prompts[i].size() - 1, kPageSize);
        want_kv_bytes += pages * 2 * kPageSize * kLatentDim * 4;
      }
      EXPECT_EQ(decode->metrics().succeeded(), prompts.size());
      EXPECT_EQ(decode->metrics().kv_bytes(), want_kv_bytes);
      EXPECT_TRUE(testing::AllPagesFree(*decode, kDpDeadlineS));
    }
  }
}

TEST(MessengerDpTest, AbortedRequestsFreeEveryPageOnEveryRank) {
  auto prefill = StartPrefill(2);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDpDecode(2, prefill->messenger->fabric_address());
  ASSERT_TRUE(decode->WaitForPeers(kDpDeadlineS).ok());
  std::vector<std::unique_ptr<PendingRequest>> requests;
  for (int i = 0; i < 6; ++i)
    requests.push_back(std::make_unique<PendingRequest>(*decode, testing::PromptOf(40, i),
                                                        testing::GreedyParams(20)));
  // Abort at different points: at once, once a transfer started, once one decoded.
  for (int i = 0; i < 6; ++i) {
    if (i == 2) WaitUntil([&] { return decode->num_active_transfers() > 0; }, 5);
    if (i == 4) WaitUntil([&] { return decode->metrics().succeeded() > 0; }, 5);
    decode->Abort(requests[i]->id());
  }
  for (auto& r : requests) {
    const engine::FinishReason finish = r->Wait(kDpDeadlineS).finish;
    EXPECT_TRUE(finish == engine::FinishReason::kAbort || finish == engine::FinishReason::kLength);
  }
  EXPECT_TRUE(testing::AllPagesFree(*decode, kDpDeadlineS));
  EXPECT_TRUE(testing::AllPagesFree(*prefill->engine, kDpDeadlineS));
  EXPECT_TRUE(WaitUntil([&] { return prefill->messenger->num_active_transfers() == 0; }));
}

// A prefill instance that accepts the DP decode instance, takes its requests and is lost before it
// writes anything: each request fails at the transfer timeout, every page of every rank comes back.
TEST(MessengerDpTest, ALostPrefillInstanceFreesEveryPageOnEveryRank) {
  auto prefill = testing::FakePeer::Create([](testing::FakePeer& self, const Frame& f) {
    if (const auto* hello = std::get_if<Hello>(&f.message)) {
      HelloReply r;
      r.accepted = true;
      r.instance_name = "prefill-tp2";
      r.format = hello->format;
      r.scheme = {2, 1, true};
      r.fabric_address = self.address();
      self.Send(hello->fabric_address, r);
      return;
    }
    self.Record(f);
  });
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDpDecode(2, prefill->address(), /*timeout_ms=*/300);
  ASSERT_TRUE(decode->WaitForPeers(kDpDeadlineS).ok());
  std::vector<std::unique_ptr<PendingRequest>> requests;
  for (int i = 0; i < 3; ++i) {
    requests.push_back(std::make_unique<PendingRequest>(*decode, testing::PromptOf(17, i),
                                                        testing::GreedyParams(4)));
    ASSERT_TRUE(requests.back()->submitted());
  }
  for (int i = 0; i < 3; ++i) {
    auto req = prefill->Next();
    ASSERT_TRUE(req.has_value());
    const auto* pr = std::get_if<PrefillRequest>(&req->message);
    ASSERT_NE(pr, nullptr);
    EXPECT_EQ(pr->rank_regions.size(), 1u) << "only the request's DP rank is written";
    EXPECT_EQ(pr->decode_scheme.tp_size, 1);
    for (int32_t p : pr->dst_pages) EXPECT_LT(p, 32) << "page ids are the rank's own";
  }
  prefill.reset();  // lost mid-transfer
  for (auto& r : requests) {
    const Outcome got = r->Wait(kDpDeadlineS);
    EXPECT_EQ(got.finish, engine::FinishReason::kError);
  }
  EXPECT_TRUE(WaitUntil([&] { return decode->num_active_transfers() == 0; }, kDpDeadlineS));
  EXPECT_TRUE(testing::AllPagesFree(*decode, kDpDeadlineS));
}

}  // namespace
}  // namespace pd::messenger
