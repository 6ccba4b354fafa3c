// deepseek_v3's latent KV cache through the messenger. Every rank of an MLA instance holds the
// whole (page_size, latent_dim) latent, so the handshake describes the cache as replicated with one
// "head" and the latent geometry; each destination rank's page is written whole from one source
// rank, chosen per request by the shard plan's seeded permutation (the wire request id).
//   - golden: prefill TP {1,2,4} -> decode TP {1,2,4}, chunked prefill, greedy tokens equal a
//     colocated TP 1 engine's; the decode side counted the planner's writes; /metrics bytes;
//   - spread: over 200 requests from a TP 4 prefill instance every source rank writes, none above
//     1.5x its fair share (planner), and the per-rank write counters add up (end to end);
//   - handshake: latent_dim and KV dtype mismatches are refused naming the field;
//   - faults: aborted requests and a lost prefill instance leave every page free.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/mla_test_util.h"
#include "messenger/handshake.h"
#include "messenger/messenger_test_util.h"

namespace pd::messenger {
namespace {

using testing::Async;
using testing::Generate;
using ::testing::HasSubstr;
using testing::Outcome;
using testing::PendingRequest;
using testing::PrefillInstance;
using testing::WaitUntil;
constexpr double kMlaDeadlineS = 60.0;  // a TP 4 instance runs 4 ranks on one thread each

// kv_lora_rank 40 + rope 6: a 46-value latent row per token; 4 query heads split over TP 1, 2, 4.
const engine::testing::TinyModel& MlaModel() {
  static auto* model = [] {
    engine::testing::TinyMlaOptions o;
    o.layers = 2;
    return engine::testing::MakeTinyMlaModel(o).release();
  }();
  return *model;
}
constexpr int kLatentDim = 46;

struct MlaShape {
  int page_size = 4;
  int budget = 8;  // prefill tokens per step: a 13-token prompt is prefilled in two chunks
  engine::KvDType dtype = engine::KvDType::kF32;
  bool kv_checksum = false;  // --kv-checksum on both sides
};

std::unique_ptr<engine::Engine> MlaEngine(const MlaShape& s, int tp) {
  engine::EngineOptions o;
  o.runner.kv.page_size = s.page_size;
  o.runner.kv.dtype = s.dtype;
  o.runner.num_pages = 32;
  o.runner.num_threads = 1;
  o.runner.tensor_parallel_size = tp;
  o.scheduler.max_num_batched_tokens = s.budget;
  o.scheduler.max_num_seqs = 4;
  o.scheduler.max_model_len = 96;
  auto e = engine::Engine::Create(MlaModel().weights, o);
  PD_CHECK(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

std::unique_ptr<PrefillInstance> StartMlaPrefill(const MlaShape& s, int tp) {
  PrefillMessengerOptions o = testing::BasePrefillOptions();
  o.instance_name = "prefill-tp" + std::to_string(tp);
  o.model_hash = ModelFingerprint(MlaModel().weights);
  o.kv_checksum = s.kv_checksum;
  return testing::LaunchPrefill(MlaEngine(s, tp), o);
}

std::unique_ptr<DecodeMessenger> StartMlaDecode(const MlaShape& s, int tp, const std::string& peer,
                                                uint32_t timeout_ms = 30000) {
  auto e = MlaEngine(s, tp);
  engine::ModelRunner& runner = e->runner();
  DecodeMessengerOptions o = testing::BaseDecodeOptions({PrefillPeer{"p0", peer}});
  o.instance_name = "decode-tp" + std::to_string(tp);
  o.model_hash = ModelFingerprint(MlaModel().weights);
  o.transfer_timeout_ms = timeout_ms;
  o.kv_checksum = s.kv_checksum;
  auto d = DecodeMessenger::Create(o, runner, Async(std::move(e)));
  PD_CHECK(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

bool AllPagesFree(const engine::AsyncEngine& e) { return testing::AllPagesFree(e, kMlaDeadlineS); }

// ------------------------------------------------------------------ golden, every TP pairing

class MessengerMlaGoldenTest : public ::testing::TestWithParam<MlaShape> {};

TEST_P(MessengerMlaGoldenTest, EveryTpPairingGivesTheColocatedTp1GreedyTokens) {
  const MlaShape s = GetParam();
  // The third extends the second: the decode instance holds its leading pages (prefix cache)
  // and asks only for the rest.
  std::vector<int32_t> extended = testing::PromptOf(13, 2);
  for (int32_t t : testing::PromptOf(6, 3)) extended.push_back(t);
  const std::vector<std::vector<int32_t>> prompts = {testing::PromptOf(6, 1),
                                                     testing::PromptOf(13, 2), extended};
  constexpr int kTokens = 3;
  std::vector<Outcome> want;
  {
    auto colocated = Async(MlaEngine(s, 1));
    for (const auto& p : prompts)
      want.push_back(Generate(*colocated, p, kTokens, nullptr, kMlaDeadlineS));
    colocated->Shutdown();
  }
  for (int ptp : {1, 2, 4}) {
    auto prefill = StartMlaPrefill(s, ptp);
    if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
    EXPECT_EQ(prefill->messenger->format().latent_dim, static_cast<uint32_t>(kLatentDim));
    for (int dtp : {1, 2, 4}) {
      SCOPED_TRACE("prefill TP " + std::to_string(ptp) + " -> decode TP " + std::to_string(dtp));
      auto decode = StartMlaDecode(s, dtp, prefill->messenger->fabric_address());
      ASSERT_TRUE(decode->WaitForPeers(kMlaDeadlineS).ok());
      const uint64_t before = prefill->messenger->metrics().succeeded();
      const uint64_t kv_before = prefill->messenger->metrics().kv_bytes();
      uint64_t want_kv_bytes = 0, tokens = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const uint64_t cached_before = decode->metrics().pages_cached();
        Outcome got = Generate(*decode, prompts[i], kTokens, nullptr, kMlaDeadlineS);
        ASSERT_TRUE(got.error.ok()) << got.error.ToString();
        EXPECT_EQ(got.tokens, want[i].tokens) << "prompt " << i;
        // Every decode rank gets every layer's whole latent page, but for those its cache held.
        const uint64_t cached = decode->metrics().pages_cached() - cached_before;
        if (i == 2) {
          EXPECT_GE(cached, 13u / s.page_size) << "the second prompt's pages";
        }
        const uint64_t pages = PagesForTokens(prompts[i].size() - 1, s.page_size) - cached;
        want_kv_bytes += pages * 2 * dtp * s.page_size * kLatentDim * 4;
        tokens += prompts[i].size() - 1 - cached * s.page_size;
      }
      EXPECT_EQ(decode->metrics().succeeded(), prompts.size());
      EXPECT_EQ(decode->metrics().failed(), 0u);
      EXPECT_EQ(decode->metrics().kv_bytes(), want_kv_bytes);
      EXPECT_EQ(decode->metrics().tokens(), tokens);
      EXPECT_EQ(decode->metrics().bytes_per_token(), 2u * kLatentDim * 4);  // 2 layers, f32
      EXPECT_TRUE(AllPagesFree(*decode));
      EXPECT_TRUE(WaitUntil(
          [&] { return prefill->messenger->metrics().succeeded() == before + prompts.size(); },
          kMlaDeadlineS));
      EXPECT_EQ(prefill->messenger->metrics().kv_bytes() - kv_before, want_kv_bytes);
      decode->Shutdown();
    }
    EXPECT_TRUE(AllPagesFree(*prefill->engine));
    EXPECT_EQ(prefill->messenger->metrics().failed(), 0u);
  }
}

// Page sizes 1, 4 and 16; the 13-token prompt prefilled in chunks of 8 or whole; and with a
// CRC32C per layer over the latent pages (--kv-checksum), checked on the decode side.
INSTANTIATE_TEST_SUITE_P(PagesAndChunks, MessengerMlaGoldenTest,
                         ::testing::Values(MlaShape{4, 8}, MlaShape{1, 8}, MlaShape{16, 64},
                                           MlaShape{4, 8, engine::KvDType::kF32, true}),
                         [](const ::testing::TestParamInfo<MlaShape>& info) {
                           return "page" + std::to_string(info.param.page_size) + "_budget" +
                                  std::to_string(info.param.budget) +
                                  (info.param.kv_checksum ? "_checksum" : "");
                         });

// ------------------------------------------------------------------ source ranks spread

KvFormat LatentFormat(engine::KvDType dtype = engine::KvDType::kF32) {
  engine::KvCacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = kLatentDim;
  spec.latent_dim = kLatentDim;
  spec.page_size = 16;
  spec.dtype = dtype;
  return MakeKvFormat(7, spec);
}

TEST(MessengerMlaPlanTest, EachDestinationRankGetsWholePagesFromOneSourceRank) {
  const KvFormat f = LatentFormat();
  const ShardScheme prefill{4, 1, true}, decode{2, 1, true};
  auto plan = PlanTransfer(prefill, decode, f, 12345);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->slices.size(), 2u);
  for (const ShardSlice& s : plan->slices) {
    ASSERT_EQ(s.runs.size(), 1u);
    EXPECT_EQ(s.runs[0], (PageRun{0, 0, 16u * kLatentDim * 4}));
  }
  EXPECT_NE(plan->slices[0].src_rank, plan->slices[1].src_rank);  // a permutation of sources
  // Decode counts exactly one write per (destination rank, layer, page).
  EXPECT_EQ(*ExpectedWrites(prefill, decode, f, 5, 12345), 2u * 2 * 5);
  EXPECT_EQ(*ExpectedWrites(prefill, {4, 1, true}, f, 5, 1), 4u * 2 * 5);
  // A latent cache cannot be paired with a sharded scheme.
  auto bad = PlanTransfer(prefill, {2, 1, false}, f, 1);
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(bad.status().message(), HasSubstr("latent (MLA) cache must be replicated"));
}

TEST(MessengerMlaPlanTest, TwoHundredRequestsFromTp4SpreadWritesOverEverySourceRank) {
  const KvFormat f = LatentFormat();
  const ShardScheme prefill{4, 1, true};
  const uint64_t prefix = uint64_t{0x5eed1234} << 32;  // as a decode instance draws its wire ids
  for (int dtp : {1, 2, 4}) {
    SCOPED_TRACE("decode TP " + std::to_string(dtp));
    std::vector<uint64_t> writes(4, 0);
    uint64_t total = 0;
    for (uint64_t n = 0; n < 200; ++n) {
      auto plan = PlanTransfer(prefill, {static_cast<uint16_t>(dtp), 1, true}, f, prefix | n);
      ASSERT_TRUE(plan.ok());
      const WriteCounts c = ExpectedWrites(*plan, 3, f.num_layers);
      for (int r = 0; r < 4; ++r) writes[r] += c.writes_per_src_rank[r];
      total += c.total_writes;
    }
    const double fair = static_cast<double>(total) / 4;
    for (int r = 0; r < 4; ++r) {
      EXPECT_GT(writes[r], 0u) << "rank " << r;
      EXPECT_LE(static_cast<double>(writes[r]), 1.5 * fair) << "rank " << r;
    }
  }
}

TEST(MessengerMlaTest, TwoHundredRequestsFromTp4WriteFromEverySourceRankEvenly) {
  const MlaShape s;
  auto prefill = StartMlaPrefill(s, 4);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartMlaDecode(s, 1, prefill->messenger->fabric_address());
  ASSERT_TRUE(decode->WaitForPeers(kMlaDeadlineS).ok());
  // TP 1 decode: one source rank per request, chosen at random. Over 200 requests a rank's count
  // is Binomial(200, 1/4) (mean 50, sd 6.1): one idle has odds 4 * 0.75^200, one above 1.5x its
  // fair share (75, 4.1 sd) about 1e-4 (the false-alarm rate of the bound below).
  constexpr int kRequests = 200;
  for (int i = 0; i < kRequests; ++i) {
    Outcome got = Generate(*decode, testing::PromptOf(5, i), 1, nullptr, kMlaDeadlineS);
    ASSERT_TRUE(got.error.ok()) << got.error.ToString();
  }
  ASSERT_TRUE(
      WaitUntil([&] { return prefill->messenger->metrics().succeeded() == uint64_t{kRequests}; },
                kMlaDeadlineS));
  const TransferMetrics& m = prefill->messenger->metrics();
  uint64_t sum = 0;
  for (int r = 0; r < 4; ++r) {
    EXPECT_GT(m.rank_writes(r), 0u) << "rank " << r;
    sum += m.rank_writes(r);
  }
  EXPECT_EQ(sum, uint64_t{kRequests} * 1 * 2);  // 4 tokens: one page, two layers each
  const double fair = static_cast<double>(sum) / 4;
  for (int r = 0; r < 4; ++r) {
    EXPECT_LE(static_cast<double>(m.rank_writes(r)), 1.5 * fair) << "rank " << r;
  }
  std::printf("[ measured ] %d requests from TP 4: writes per source rank %llu %llu %llu %llu\n",
              kRequests, static_cast<unsigned long long>(m.rank_writes(0)),
              static_cast<unsigned long long>(m.rank_writes(1)),
              static_cast<unsigned long long>(m.rank_writes(2)),
              static_cast<unsigned long long>(m.rank_writes(3)));
  EXPECT_THAT(m.PrometheusText("prefill"),
              HasSubstr("pdserve:kv_transfer_rank_writes_total{role=\"prefill\",rank=\"3\"}"));
  decode->Shutdown();
}

// ------------------------------------------------------------------ handshake

TEST(MessengerMlaHandshakeTest, LatentGeometryAndDtypeMismatchesAreRefusedByName) {
  const KvFormat ours = LatentFormat();
  EXPECT_TRUE(CheckCompatible(ours, ours).ok());
  KvFormat theirs = ours;
  theirs.head_dim = theirs.latent_dim = 40;
  Status st = CheckCompatible(ours, theirs);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("latent_dim: ours 46, theirs 40"));
  theirs = LatentFormat(engine::KvDType::kBF16);
  EXPECT_THAT(CheckCompatible(ours, theirs).message(),
              HasSubstr("kv_dtype: ours f32, theirs bf16"));
  EXPECT_THAT(CheckCompatible(LatentFormat(engine::KvDType::kFP8E4M3), theirs).message(),
              HasSubstr("kv_dtype: ours fp8_e4m3, theirs bf16"));
  theirs = ours;
  theirs.latent_dim = 0;  // a per-head K/V cache of the same head_dim
  EXPECT_THAT(CheckCompatible(ours, theirs).message(),
              HasSubstr("kv_cache: ours MLA latent (latent_dim 46), theirs per-head K/V"));
  theirs = ours;
  theirs.page_size = 1;
  EXPECT_THAT(CheckCompatible(ours, theirs).message(), HasSubstr("page_size: ours 16, theirs 1"));
  // Layout does not apply to a latent page.
  theirs = ours;
  theirs.layout = 1 - ours.layout;
  EXPECT_TRUE(CheckCompatible(ours, theirs).ok());
}

TEST(MessengerMlaHandshakeTest, Bf16AndFp8LatentsHalveTheBytesOnTheWire) {
  std::map<engine::KvDType, uint64_t> bytes;
  for (engine::KvDType dtype :
       {engine::KvDType::kF32, engine::KvDType::kBF16, engine::KvDType::kFP8E4M3}) {
    MlaShape s;
    s.dtype = dtype;
    auto prefill = StartMlaPrefill(s, 2);
    if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
    auto decode = StartMlaDecode(s, 2, prefill->messenger->fabric_address());
    ASSERT_TRUE(decode->WaitForPeers(kMlaDeadlineS).ok());
    Outcome got = Generate(*decode, testing::PromptOf(13, 3), 2, nullptr, kMlaDeadlineS);
    ASSERT_TRUE(got.error.ok()) << got.error.ToString();
    ASSERT_TRUE(WaitUntil([&] { return prefill->messenger->metrics().succeeded() == 1; },
                          kMlaDeadlineS));  // its metadata write landed too
    bytes[dtype] = decode->metrics().kv_bytes();
    EXPECT_EQ(decode->metrics().bytes_per_token(), 2u * kLatentDim * engine::KvDTypeBytes(dtype));
    decode->Shutdown();
  }
  EXPECT_GT(bytes[engine::KvDType::kF32], 0u);
  EXPECT_EQ(bytes[engine::KvDType::kBF16] * 2, bytes[engine::KvDType::kF32]);
  EXPECT_EQ(bytes[engine::KvDType::kFP8E4M3] * 2, bytes[engine::KvDType::kBF16]);
}

// ------------------------------------------------------------------ faults

TEST(MessengerMlaFaultTest, AbortedRequestsFreeEveryPageOnBothSides) {
  MlaShape s;
  s.budget = 4;  // chunked: the prefill takes several steps
  auto prefill = StartMlaPrefill(s, 2);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartMlaDecode(s, 2, prefill->messenger->fabric_address());
  ASSERT_TRUE(decode->WaitForPeers(kMlaDeadlineS).ok());
  for (int i = 0; i < 6; ++i) {
    PendingRequest request(*decode, testing::PromptOf(40, i), testing::GreedyParams(20));
    ASSERT_TRUE(request.submitted());
    // Abort at different points: at once, once the transfer started, once decoding.
    if (i % 3 == 1) WaitUntil([&] { return decode->num_active_transfers() > 0; }, 5);
    if (i % 3 == 2) WaitUntil([&] { return decode->metrics().succeeded() > 0; }, 5);
    decode->Abort(request.id());
    const engine::FinishReason finish = request.Wait(kMlaDeadlineS).finish;
    EXPECT_TRUE(finish == engine::FinishReason::kAbort || finish == engine::FinishReason::kLength);
  }
  EXPECT_TRUE(AllPagesFree(*decode));
  EXPECT_TRUE(AllPagesFree(*prefill->engine));
  EXPECT_TRUE(WaitUntil([&] { return prefill->messenger->num_active_transfers() == 0; }));
}

// A TP 4 prefill instance that accepts the decode instance, takes its requests and is lost before
// it writes anything (a FakePeer answering as the MLA instance would): each request fails at the
// transfer timeout and every decode page comes back, on every rank.
TEST(MessengerMlaFaultTest, ALostPrefillInstanceFailsItsTransfersAndFreesEveryPage) {
  const MlaShape s;
  auto prefill = testing::FakePeer::Create([](testing::FakePeer& self, const Frame& f) {
    if (const auto* hello = std::get_if<Hello>(&f.message)) {
      HelloReply r;
      r.accepted = true;
      r.instance_name = "prefill-tp4";
      r.format = hello->format;
      r.scheme = {4, 1, true};
      r.fabric_address = self.address();
      self.Send(hello->fabric_address, r);
      return;
    }
    self.Record(f);
  });
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartMlaDecode(s, 2, prefill->address(), /*timeout_ms=*/300);
  ASSERT_TRUE(decode->WaitForPeers(kMlaDeadlineS).ok());
  std::vector<std::unique_ptr<PendingRequest>> requests;
  for (int i = 0; i < 2; ++i) {
    requests.push_back(std::make_unique<PendingRequest>(*decode, testing::PromptOf(17, i),
                                                        testing::GreedyParams(4)));
    ASSERT_TRUE(requests.back()->submitted());
  }
  for (int i = 0; i < 2; ++i) {
    auto req = prefill->Next();  // the decode instance asked for the latent
    ASSERT_TRUE(req.has_value());
    EXPECT_TRUE(std::holds_alternative<PrefillRequest>(req->message));
  }
  EXPECT_GT(decode->num_active_transfers(), 0);
  prefill.reset();  // lost mid-transfer
  for (auto& r : requests) {
    const Outcome got = r->Wait(kMlaDeadlineS);
    EXPECT_EQ(got.finish, engine::FinishReason::kError);
    // The transfer's deadline or the lost control channel, whichever the decode instance notices
    // first (on a loaded host the latter can come first).
    EXPECT_TRUE(got.error.code() == StatusCode::kDeadlineExceeded ||
                got.error.code() == StatusCode::kUnavailable)
        << got.error.ToString();
  }
  EXPECT_TRUE(WaitUntil([&] { return decode->num_active_transfers() == 0; }, kMlaDeadlineS));
  EXPECT_TRUE(AllPagesFree(*decode));
  EXPECT_EQ(decode->metrics().failed(), 2u);
}

}  // namespace
}  // namespace pd::messenger
