// Tensor-parallel instances through the KV messenger, in one process: a prefill instance at TP A
// streams its ranks' KV head-shards by the shard plan into a decode instance at TP B over real
// libfabric loopback domains. For every (A, B) in {1,2,4}^2, KV heads {1,2,4,8} and both layouts,
// greedy tokens must equal a TP 1 colocated engine's, the writes the decode side counted must be
// the planner's, and every page must come back on both sides. Schemes that cannot be paired are
// refused at the handshake, on either side, with a message that says why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "engine/engine.h"
#include "engine/model_runner_test_util.h"
#include "messenger/channel.h"
#include "messenger/decode_side.h"
#include "messenger/handshake.h"
#include "messenger/messenger_test_util.h"
#include "messenger/prefill_side.h"
#include "transfer/test_util.h"

namespace pd::messenger {
namespace {

using testing::Async;
using testing::FakePeer;
using testing::Generate;
using ::testing::HasSubstr;
using testing::kSecret;  // FakePeer speaks with it too
using testing::LaunchPrefill;
using testing::Outcome;
using testing::PrefillInstance;
using testing::WaitUntil;
// Twice the shared guard: a TP 4 instance runs 4 ranks' engines on one thread each.
constexpr double kTpDeadlineS = 60.0;

// One tiny model per KV head count: 8 query heads and 40 MLP columns split over TP 1, 2 and 4.
const engine::testing::TinyModel& Model(int kv_heads) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<engine::testing::TinyModel>> models;
  std::lock_guard<std::mutex> lock(mu);
  auto& m = models[kv_heads];
  if (m == nullptr) {
    engine::testing::TinyModelOptions o;
    o.layers = 2;
    o.heads = 8;
    o.kv_heads = kv_heads;
    o.head_dim = 6;
    o.hidden = 24;
    o.intermediate = 40;
    o.seed = 7 + static_cast<uint64_t>(kv_heads);
    m = engine::testing::MakeTinyModel(o);
  }
  return *m;
}

struct TpCase {
  int kv_heads = 2;
  engine::KvLayout layout = engine::KvLayout::kHND;
};

std::unique_ptr<engine::Engine> MakeEngine(const TpCase& s, int tp) {
  engine::EngineOptions o;
  o.runner.kv.page_size = 4;
  o.runner.kv.layout = s.layout;
  o.runner.num_pages = 24;
  o.runner.num_threads = 1;
  o.runner.tensor_parallel_size = tp;
  o.scheduler.max_num_batched_tokens = 8;  // a 13-token prompt is prefilled in two chunks
  o.scheduler.max_num_seqs = 4;
  o.scheduler.max_model_len = 64;
  auto e = engine::Engine::Create(Model(s.kv_heads).weights, o);
  PD_CHECK(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

std::unique_ptr<PrefillInstance> StartPrefill(const TpCase& s, int tp) {
  PrefillMessengerOptions o;
  o.instance_name = "prefill-tp" + std::to_string(tp);
  o.cluster_secret = kSecret;
  o.model_hash = ModelFingerprint(Model(s.kv_heads).weights);
  o.domain = transfer::testing::LoopbackOptions();
  return LaunchPrefill(MakeEngine(s, tp), o);
}

std::unique_ptr<DecodeMessenger> StartDecode(const TpCase& s, int tp, const std::string& peer) {
  auto e = MakeEngine(s, tp);
  engine::ModelRunner& runner = e->runner();
  DecodeMessengerOptions o;
  o.instance_name = "decode-tp" + std::to_string(tp);
  o.cluster_secret = kSecret;
  o.model_hash = ModelFingerprint(Model(s.kv_heads).weights);
  o.domain = transfer::testing::LoopbackOptions();
  o.peers = {{"p0", peer}};
  o.transfer_timeout_ms = 30000;
  o.hello_retry_s = 0.05;
  auto d = DecodeMessenger::Create(o, runner, Async(std::move(e)));
  PD_CHECK(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

std::vector<int32_t> PromptOf(int len, int salt) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = (i * 11 + salt * 5 + 1) % 67;
  return p;
}

bool AllPagesFree(const engine::AsyncEngine& e) { return testing::AllPagesFree(e, kTpDeadlineS); }

// ------------------------------------------------------------------ golden, every pairing

class MessengerTpGoldenTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(MessengerTpGoldenTest, EveryTpPairingGivesTheColocatedTp1GreedyTokens) {
  const TpCase s = GetParam();
  // The third extends the second: the decode instance holds its first 3 pages (prefix cache) and
  // asks only for the rest.
  std::vector<int32_t> extended = PromptOf(13, 2);
  for (int32_t t : PromptOf(6, 3)) extended.push_back(t);
  const std::vector<std::vector<int32_t>> prompts = {PromptOf(6, 1), PromptOf(13, 2), extended};
  constexpr int kTokens = 3;
  std::vector<Outcome> want;
  {
    auto colocated = Async(MakeEngine(s, 1));
    for (const auto& p : prompts)
      want.push_back(Generate(*colocated, p, kTokens, nullptr, kTpDeadlineS));
    colocated->Shutdown();
  }
  for (int ptp : {1, 2, 4}) {
    auto prefill = StartPrefill(s, ptp);
    if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
    for (int dtp : {1, 2, 4}) {
      SCOPED_TRACE("prefill TP " + std::to_string(ptp) + " -> decode TP " + std::to_string(dtp));
      auto decode = StartDecode(s, dtp, prefill->messenger->fabric_address());
      ASSERT_TRUE(decode->WaitForPeers(kTpDeadlineS).ok());
      const uint64_t before = prefill->messenger->metrics().succeeded();
      for (size_t i = 0; i < prompts.size(); ++i) {
        Outcome got = Generate(*decode, prompts[i], kTokens, nullptr, kTpDeadlineS);
        ASSERT_TRUE(got.error.ok()) << got.error.ToString();
        EXPECT_EQ(got.tokens, want[i].tokens) << "prompt " << i;
      }
      EXPECT_EQ(decode->metrics().succeeded(), prompts.size());
      EXPECT_EQ(decode->metrics().failed(), 0u);
      EXPECT_GE(decode->metrics().pages_cached(), 3u);
      // Pages that crossed: 2 + 3 + (5 less those cached).
      EXPECT_EQ(decode->metrics().pages_transferred(), 10u - decode->metrics().pages_cached());
      EXPECT_TRUE(AllPagesFree(*decode));
      EXPECT_TRUE(WaitUntil(
          [&] { return prefill->messenger->metrics().succeeded() == before + prompts.size(); },
          kTpDeadlineS));
      decode->Shutdown();
    }
    EXPECT_TRUE(AllPagesFree(*prefill->engine));
    EXPECT_EQ(prefill->messenger->metrics().failed(), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    HeadsAndLayouts, MessengerTpGoldenTest,
    ::testing::Values(TpCase{1, engine::KvLayout::kHND}, TpCase{1, engine::KvLayout::kNHD},
                      TpCase{2, engine::KvLayout::kHND}, TpCase{2, engine::KvLayout::kNHD},
                      TpCase{4, engine::KvLayout::kHND}, TpCase{4, engine::KvLayout::kNHD},
                      TpCase{8, engine::KvLayout::kHND}, TpCase{8, engine::KvLayout::kNHD}),
    [](const ::testing::TestParamInfo<TpCase>& info) {
      return "kv" + std::to_string(info.param.kv_heads) + "_" +
             std::string(engine::KvLayoutName(info.param.layout));
    });

// ------------------------------------------------------------------ write counts

TEST(MessengerTpExpectedWritesTest, ComeFromThePlannerOnBothSchemes) {
  KvFormat f;
  f.num_layers = 3;
  f.head_dim = 6;
  f.page_size = 4;
  f.layout = static_cast<uint8_t>(engine::KvLayout::kHND);
  // TP 1 -> 1: one write per (layer, page); the metadata write is counted apart.
  EXPECT_EQ(*ExpectedWrites({1, 2}, {1, 2}, f, 5, 9), 3u * 5);
  // HND, TP 2 -> 1: each decode page assembled from two head slices.
  EXPECT_EQ(*ExpectedWrites({2, 2}, {1, 2}, f, 5, 9), 2u * 3 * 5);
  // TP 1 -> 2: the prefill page split in two.
  EXPECT_EQ(*ExpectedWrites({1, 2}, {2, 2}, f, 5, 9), 2u * 3 * 5);
  // NHD, TP 2 -> 1: a head slice is strided: one run per token of the page.
  f.layout = static_cast<uint8_t>(engine::KvLayout::kNHD);
  EXPECT_EQ(*ExpectedWrites({2, 2}, {1, 2}, f, 5, 9), 2u * 4 * 3 * 5);
  // Replicas (TP 4 over 1 head): one source replica serves each destination rank.
  EXPECT_EQ(*ExpectedWrites({4, 1}, {2, 1}, f, 5, 9), 2u * 3 * 5);
  // The seed picks replicas, never the count.
  EXPECT_EQ(*ExpectedWrites({4, 1}, {2, 1}, f, 5, 1), *ExpectedWrites({4, 1}, {2, 1}, f, 5, 2));
}

TEST(MessengerTpExpectedWritesTest, UnpairableSchemesAreAFailedPreconditionThatSaysWhy) {
  KvFormat f;
  f.num_layers = 2;
  f.head_dim = 6;
  f.page_size = 4;
  auto bad = ExpectedWrites({3, 2}, {1, 2}, f, 1, 0);
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("cannot pair prefill tp_size 3 with decode tp_size 1"));
  EXPECT_THAT(bad.status().message(), HasSubstr("tensor-parallel size 3 exceeds the 2 KV heads"));
  auto heads = ExpectedWrites({1, 2}, {1, 4}, f, 1, 0);
  EXPECT_EQ(heads.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(heads.status().message(), HasSubstr("prefill has 2 KV heads but decode has 4"));
}

// ------------------------------------------------------------------ handshake refusals

// A bare wire-protocol peer that records every frame it receives (after `handler`, if any).
std::unique_ptr<FakePeer> RecordingPeer(FakePeer::Handler handler = {}) {
  return FakePeer::Create([handler](FakePeer& self, const Frame& f) {
    if (handler) handler(self, f);
    self.Record(f);
  });
}

TEST(MessengerTpHandshakeTest, PrefillRefusesADecodeSchemeItCannotPlanFor) {
  const TpCase s{2, engine::KvLayout::kHND};
  auto prefill = StartPrefill(s, 2);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = RecordingPeer();
  ASSERT_NE(decode, nullptr);
  Hello hello;
  hello.instance_name = "decode-tp3";
  hello.format = prefill->messenger->format();
  hello.scheme = {3, 2, false};  // TP 3 over 2 KV heads: neither divides the other
  hello.fabric_address = decode->address();
  decode->Send(prefill->messenger->fabric_address(), hello);
  auto reply = decode->Next();
  ASSERT_TRUE(reply.has_value());
  const auto* r = std::get_if<HelloReply>(&reply->message);
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->accepted);
  EXPECT_THAT(r->reason, HasSubstr("cannot pair prefill tp_size 2 with decode tp_size 3"));
  EXPECT_THAT(r->reason, HasSubstr("decode: tensor-parallel size 3 exceeds the 2 KV heads"));
  EXPECT_EQ(r->scheme, (ShardScheme{2, 2, false}));
  EXPECT_EQ(prefill->messenger->num_peers(), 0);
  // A plannable scheme from the same peer is accepted.
  hello.scheme = {4, 2, false};
  decode->Send(prefill->messenger->fabric_address(), hello);
  reply = decode->Next();
  ASSERT_TRUE(reply.has_value());
  EXPECT_TRUE(std::get<HelloReply>(reply->message).accepted);
  EXPECT_EQ(prefill->messenger->num_peers(), 1);
}

TEST(MessengerTpHandshakeTest, DecodeRefusesAPrefillSchemeItCannotPlanFor) {
  const TpCase s{2, engine::KvLayout::kNHD};
  // A prefill instance that says it runs TP 3 over the model's 2 KV heads.
  auto prefill = RecordingPeer([](FakePeer& self, const Frame& f) {
    if (const auto* hello = std::get_if<Hello>(&f.message)) {
      HelloReply r;
      r.accepted = true;
      r.instance_name = "prefill-tp3";
      r.format = hello->format;
      r.scheme = {3, hello->scheme.num_kv_heads, false};
      r.fabric_address = self.address();
      self.Send(hello->fabric_address, r);
    }
  });
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(s, 2, prefill->address());
  Status st = decode->WaitForPeers(kTpDeadlineS);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("cannot pair prefill tp_size 3 with decode tp_size 2"));
  Outcome o = Generate(*decode, PromptOf(5, 1), 2, nullptr, kTpDeadlineS);
  EXPECT_EQ(o.error.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(AllPagesFree(*decode));
}

// The decode side sends one descriptor per rank; the prefill side checks them all.
TEST(MessengerTpHandshakeTest, ARequestWithRankRegionsOfDifferentSizesIsRefused) {
  const TpCase s{2, engine::KvLayout::kHND};
  auto prefill = StartPrefill(s, 1);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = RecordingPeer();
  ASSERT_NE(decode, nullptr);
  Hello hello;
  hello.instance_name = "decode-tp2";
  hello.format = prefill->messenger->format();
  hello.scheme = {2, 2, false};
  hello.fabric_address = decode->address();
  decode->Send(prefill->messenger->fabric_address(), hello);
  ASSERT_TRUE(decode->Next().has_value());
  // Rank page blocks of TP 2 over 2 heads: one head of 2 x 4 tokens x 6 floats.
  const uint64_t page = 2 * 4 * 6 * 4, layers = 2;
  std::vector<char> a(page * layers * 8), b(page * layers * 4), meta(24 * 4);
  transfer::DomainOptions o = transfer::testing::LoopbackOptions();
  auto mrs = std::vector<transfer::MemoryRegion>();
  // Register on a domain whose address is not the peer's: the descriptors only need to parse.
  auto owner = transfer::Domain::Create(o);
  ASSERT_TRUE(owner.ok());
  auto ma = (*owner)->RegisterMemory(a.data(), a.size());
  auto mb = (*owner)->RegisterMemory(b.data(), b.size());
  auto mm = (*owner)->RegisterMemory(meta.data(), meta.size());
  ASSERT_TRUE(ma.ok() && mb.ok() && mm.ok());
  auto with_addr = [&](transfer::MemoryDescriptor d) {
    d.fabric_addr = decode->address();
    return d.ToBytes();
  };
  PrefillRequest req;
  req.request_id = 77;
  req.transfer_imm = 5;
  req.token_ids = PromptOf(5, 3);
  req.num_tokens = 5;
  req.num_pages = 2;
  req.decode_scheme = {2, 2, false};
  req.rank_regions = {with_addr(ma->descriptor), with_addr(mb->descriptor)};
  req.dst_pages = {0, 1};
  req.metadata_region = with_addr(mm->descriptor);
  req.metadata_bytes = 24 * 4;
  req.deadline_ms = 5000;
  req.metadata_imm = 6;
  decode->Send(prefill->messenger->fabric_address(), req);
  auto done = decode->Next();
  ASSERT_TRUE(done.has_value());
  const auto* d = std::get_if<PrefillDone>(&done->message);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->status_code, static_cast<uint16_t>(StatusCode::kInvalidArgument));
  EXPECT_THAT(d->message, HasSubstr("decode rank 1's region differs from rank 0's"));
  EXPECT_TRUE(AllPagesFree(*prefill->engine));
}

}  // namespace
}  // namespace pd::messenger
