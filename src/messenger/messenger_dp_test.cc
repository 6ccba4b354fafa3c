// Data-parallel instances (engine/dp_engine.h) of deepseek_v3 through the messenger: on a decode
// instance a request goes to the least loaded DP rank and its latent is written into that rank's
// pages only, from one source rank of the prefill instance; on a prefill instance of DP ranks the
// request's rank computes it and its region is the source.
//   - golden: prefill TP {1,2} -> decode DP {2,4}, concurrent requests, chunked prefill, on a
//     tiny MLA + MoE model: greedy tokens equal a colocated TP 1 engine's; the KV bytes are one
//     copy per request (one DP rank written), and every DP rank held requests;
//   - faults: aborted requests and a lost prefill instance leave every page of every DP rank free;
//   - prefill DP 2 -> decode TP 1 / DP 2: each request computed and sent by one prefill rank;
//   - DP shape in the handshake: the decode instance's Hello says dp_size N and each request its
//     dp_rank; a DP shape the other side cannot pair with is refused naming dp_size or dp_rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

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
using ::testing::HasSubstr;
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

// A prefill instance of `dp` data-parallel ranks: each prompt computed by the least loaded rank.
std::unique_ptr<testing::PrefillInstance> StartDpPrefill(int dp) {
  PrefillMessengerOptions o = testing::BasePrefillOptions();
  o.instance_name = "prefill-dp" + std::to_string(dp);
  o.model_hash = ModelFingerprint(DpModel().weights);
  return testing::LaunchPrefill(DpModelEngine(1, dp), o);
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

// The greedy outcomes of a colocated TP 1 engine for prompts.
std::vector<Outcome> Colocated(const std::vector<std::vector<int32_t>>& prompts, int tokens) {
  auto colocated = Async(DpModelEngine(1, 1));
  std::vector<Outcome> want;
  for (const auto& p : prompts)
    want.push_back(testing::Generate(*colocated, p, tokens, nullptr, kDpDeadlineS));
  colocated->Shutdown();
  return want;
}

TEST(MessengerDpTest, TpPrefillToDpDecodeGivesTheColocatedTp1GreedyTokens) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(testing::PromptOf(i % 2 == 0 ? 13 : 6, i + 1));
  constexpr int kTokens = 4;
  const std::vector<Outcome> want = Colocated(prompts, kTokens);
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

// A prefill instance of DP 2 ranks: each request's latent is computed by one rank (chunked: the
// 13-token prompts in two steps of that rank) and written from that rank's region once its own
// progress says a layer is final, to decode TP 1 and DP 2; tokens equal a colocated TP 1 engine's,
// both prefill ranks wrote, and every page of both instances comes back.
TEST(MessengerDpTest, DpPrefillToTpAndDpDecodeGivesTheColocatedTp1GreedyTokens) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(testing::PromptOf(i % 2 == 0 ? 13 : 6, i + 7));
  constexpr int kTokens = 4;
  const std::vector<Outcome> want = Colocated(prompts, kTokens);
  auto prefill = StartDpPrefill(2);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  const TransferMetrics& m = prefill->messenger->metrics();
  size_t transfers = 0;
  for (int dp : {1, 2}) {
    SCOPED_TRACE("prefill DP 2 -> decode " + std::string(dp == 1 ? "TP 1" : "DP 2"));
    auto decode = StartDpDecode(dp, prefill->messenger->fabric_address());
    ASSERT_TRUE(decode->WaitForPeers(kDpDeadlineS).ok());
    std::vector<std::unique_ptr<PendingRequest>> pending;  // at once: spread over the ranks
    for (const auto& p : prompts)
      pending.push_back(
          std::make_unique<PendingRequest>(*decode, p, testing::GreedyParams(kTokens)));
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Outcome got = pending[i]->Wait(kDpDeadlineS);
      ASSERT_TRUE(got.error.ok()) << got.error.ToString();
      EXPECT_EQ(got.tokens, want[i].tokens) << "prompt " << i;
    }
    EXPECT_TRUE(testing::AllPagesFree(*decode, kDpDeadlineS));
    // The prefill side counts a transfer once its last write's completion is back, which can be
    // after decode has answered: a decode instance shut down before then fails the completion.
    transfers += prompts.size();
    EXPECT_TRUE(WaitUntil([&] { return m.succeeded() == transfers; }, kDpDeadlineS));
    decode->Shutdown();
  }
  EXPECT_GT(m.rank_writes(0), 0u);
  EXPECT_GT(m.rank_writes(1), 0u);
  EXPECT_TRUE(testing::AllPagesFree(*prefill->engine, kDpDeadlineS));
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
      EXPECT_EQ(hello->dp_size, 2) << "the Hello names the decode instance's DP ranks";
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
  std::set<int> dp_ranks;
  for (int i = 0; i < 3; ++i) {
    auto req = prefill->Next();
    ASSERT_TRUE(req.has_value());
    const auto* pr = std::get_if<PrefillRequest>(&req->message);
    ASSERT_NE(pr, nullptr);
    EXPECT_EQ(pr->rank_regions.size(), 1u) << "only the request's DP rank is written";
    EXPECT_EQ(pr->decode_scheme.tp_size, 1);
    for (int32_t p : pr->dst_pages) EXPECT_LT(p, 32) << "page ids are the rank's own";
    dp_ranks.insert(pr->dp_rank);
  }
  // Three requests at once over two ranks, least loaded first: each request names its rank.
  EXPECT_EQ(dp_ranks, (std::set<int>{0, 1}));
  prefill.reset();  // lost mid-transfer
  for (auto& r : requests) {
    const Outcome got = r->Wait(kDpDeadlineS);
    EXPECT_EQ(got.finish, engine::FinishReason::kError);
  }
  EXPECT_TRUE(WaitUntil([&] { return decode->num_active_transfers() == 0; }, kDpDeadlineS));
  EXPECT_TRUE(testing::AllPagesFree(*decode, kDpDeadlineS));
}

// ------------------------------------------------------------------ DP shape in the handshake

TEST(MessengerDpHandshakeTest, CheckDataParallelNamesTheSideAndTheField) {
  const ShardScheme tp1{1, 1, true}, tp2{2, 1, true}, gqa{1, 2, false};
  EXPECT_TRUE(CheckDataParallel(1, tp2, 4, tp1).ok());  // TP prefill -> DP decode
  EXPECT_TRUE(CheckDataParallel(1, tp1, 1, tp2).ok());  // no DP at all
  Status st = CheckDataParallel(1, tp1, 2, tp2);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("decode dp_size 2 with tp_size 2"));
  EXPECT_THAT(CheckDataParallel(1, tp1, 2, gqa).message(),
              HasSubstr("decode dp_size 2: data-parallel ranks need a replicated (MLA latent)"));
  EXPECT_TRUE(CheckDataParallel(2, tp1, 2, tp1).ok());  // DP prefill -> DP decode
  EXPECT_THAT(CheckDataParallel(2, tp2, 1, tp1).message(),
              HasSubstr("prefill dp_size 2 with tp_size 2"));
}

// A real TP 1 prefill instance against a scripted decode instance: a Hello of dp_size 2 over TP 2
// is refused naming the field; one of dp_size 2 over TP 1 is accepted, and then a request naming
// DP rank 2 is refused naming dp_rank (its pages are freed: nothing was admitted).
TEST(MessengerDpHandshakeTest, APrefillInstanceRefusesDpShapesItCannotServe) {
  auto prefill = StartPrefill(1);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  const KvFormat& format = prefill->messenger->format();
  // 8 pages of every layer's f32 latent.
  std::vector<uint8_t> kv(size_t{8} * format.num_layers * format.page_size * format.head_dim * 4),
      meta(4096);
  auto fake =
      testing::FakePeer::Create([](testing::FakePeer& self, const Frame& f) { self.Record(f); });
  ASSERT_NE(fake, nullptr);
  const std::string to = prefill->messenger->fabric_address();
  auto kv_mr = fake->domain().RegisterMemory(kv.data(), kv.size());
  auto meta_mr = fake->domain().RegisterMemory(meta.data(), meta.size());
  ASSERT_TRUE(kv_mr.ok() && meta_mr.ok());
  auto hello = [&](ShardScheme scheme, uint16_t dp_size) {
    Hello h{"fake-dp-decode",
            prefill->messenger->format(),
            scheme,
            fake->address(),
            "",
            kDefaultMessageBytes,
            {},
            dp_size};
    fake->Send(to, h);
    auto reply = fake->Next();
    EXPECT_TRUE(reply.has_value());
    return reply.has_value() ? std::get<HelloReply>(reply->message) : HelloReply{};
  };
  const HelloReply refused = hello({2, 1, true}, 2);
  EXPECT_FALSE(refused.accepted);
  EXPECT_THAT(refused.reason, HasSubstr("decode dp_size 2 with tp_size 2"));
  const HelloReply accepted = hello({1, 1, true}, 2);
  ASSERT_TRUE(accepted.accepted) << accepted.reason;
  EXPECT_EQ(accepted.dp_size, 1);

  PrefillRequest r;
  r.request_id = 77;
  r.transfer_imm = 77;
  r.metadata_imm = 78;
  r.token_ids = testing::PromptOf(8, 1);
  r.num_tokens = 8;
  r.num_pages = 2;
  r.dst_pages = {0, 1};
  r.decode_scheme = {1, 1, true};
  r.rank_regions = {kv_mr->descriptor.ToBytes()};
  r.metadata_region = meta_mr->descriptor.ToBytes();
  r.metadata_bytes = 4 * DpModel().weights.config.hidden_size;
  r.deadline_ms = 5000;
  r.dp_rank = 2;
  fake->Send(to, r);
  auto done = fake->Next();
  ASSERT_TRUE(done.has_value());
  const auto* d = std::get_if<PrefillDone>(&done->message);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->status_code, static_cast<uint16_t>(StatusCode::kInvalidArgument));
  EXPECT_THAT(d->message, HasSubstr("dp_rank 2 is not below the decode instance's dp_size 2"));
  EXPECT_TRUE(testing::AllPagesFree(*prefill->engine, kDpDeadlineS));
}

// A scripted prefill instance that says it has DP ranks over TP 2: the DP decode instance refuses
// it, the reason naming dp_size.
TEST(MessengerDpHandshakeTest, ADpDecodeInstanceRefusesAPrefillInstanceOfDpRanksWithTpInside) {
  auto prefill = testing::FakePeer::Create([](testing::FakePeer& self, const Frame& f) {
    if (const auto* hello = std::get_if<Hello>(&f.message)) {
      HelloReply r;
      r.accepted = true;
      r.instance_name = "prefill-dp2";
      r.format = hello->format;
      r.scheme = {2, 1, true};
      r.fabric_address = self.address();
      r.dp_size = 2;
      self.Send(hello->fabric_address, r);
    }
  });
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDpDecode(2, prefill->address());
  const Status st = decode->WaitForPeers(kDpDeadlineS);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("prefill dp_size 2 with tp_size 2"));
  ASSERT_EQ(decode->peers().size(), 1u);
  EXPECT_EQ(decode->peers()[0].state, PeerStatus::State::kRefused);
  decode->Shutdown();
}

}  // namespace
}  // namespace pd::messenger
