// The draft KV region across the split: with a draft model on both sides, the prefill instance
// computes the draft's KV of the prompt (less its last token) beside the target's and writes it
// into the decode instance's draft region under the same page ids; decode's draft then never runs
// the prompt and drafts at its first decode step. Checked here: the handshake's description of the
// region and its refusals, the write counts and bytes per token, the wire fields, and over
// loopback libfabric (TP 1 -> 1, 1 -> 2, 2 -> 1) greedy tokens equal to no speculation with the
// target as its own draft (so a draft token is kept only when the draft KV that crossed is right),
// decode's draft computing one prompt token per request, and every page free after lost draft
// writes and after the prefill instance is killed mid-transfer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/disagg_hooks.h"
#include "engine/spec_draft_model.h"
#include "messenger/messenger_test_util.h"
#include "transfer/fault_injection.h"

namespace pd::messenger {
namespace {

using testing::AllPagesFree;
using testing::Async;
using testing::Generate;
using ::testing::HasSubstr;
using testing::kDeadlineS;
using testing::LaunchPrefill;
using testing::Model;
using testing::Outcome;
using testing::PrefillInstance;
using testing::PromptOf;
using testing::Shape;
using testing::WaitUntil;

constexpr int kMaxTokens = 9;
const Shape kShape{engine::KvLayout::kHND, 4, 8};  // budget 8: the prefill runs in chunks

const model::ModelWeights& FirstLayer() {
  static auto* view = new model::ModelWeights(engine::FirstLayersOf(Model().weights, 1).value());
  return *view;
}

// An engine of 48 pages (each a target and a draft page) with `draft` as its draft model (K 3;
// null: no speculation), on `tp` ranks.
std::unique_ptr<engine::Engine> DraftEngine(const model::ModelWeights* draft, int tp = 1) {
  engine::EngineOptions o;
  o.runner.kv.page_size = kShape.page_size;
  o.runner.kv.layout = kShape.layout;
  o.runner.num_pages = 48;
  o.runner.num_threads = 1;
  o.runner.tensor_parallel_size = tp;
  o.scheduler.max_num_batched_tokens = kShape.budget;
  o.scheduler.max_num_seqs = kShape.budget;
  o.scheduler.max_model_len = 128;
  if (draft != nullptr) {
    o.speculative.method = engine::SpecMethod::kDraftModel;
    o.speculative.num_speculative_tokens = 3;
    o.speculative.model = "in-memory draft";
    o.draft_weights = draft;
  }
  auto e = engine::Engine::Create(Model().weights, o);
  PD_CHECK(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

const char kSpeculative[] = "draft_model k=3 draft=0000000000000001";

// A prefill instance and a decode instance, both with the draft (or only the prefill instance's
// when decode_draft is false).
struct DraftSplit {
  std::shared_ptr<transfer::FaultInjector> prefill_faults =
      std::make_shared<transfer::FaultInjector>();
  std::unique_ptr<PrefillInstance> prefill;
  Result<std::unique_ptr<DecodeMessenger>> decode = Internal("not started");

  // False only where the fabric provider is absent.
  bool Start(const model::ModelWeights* draft, int prefill_tp, int decode_tp,
             bool decode_draft = true) {
    PrefillMessengerOptions po = testing::BasePrefillOptions();
    po.speculative = kSpeculative;
    po.domain.faults = prefill_faults;
    auto pe = DraftEngine(draft, prefill_tp);
    po.draft_kv = pe->disagg_hooks()->DraftKvRunner();
    prefill = LaunchPrefill(std::move(pe), po);
    if (prefill == nullptr) return false;
    DecodeMessengerOptions o =
        testing::BaseDecodeOptions({{"p0", prefill->messenger->fabric_address()}});
    o.speculative = kSpeculative;
    o.transfer_timeout_ms = 2000;
    o.fence_grace_s = 1.0;
    auto e = DraftEngine(decode_draft ? draft : nullptr, decode_tp);
    engine::DisaggHooks& hooks = *e->disagg_hooks();
    o.draft_kv = hooks.DraftKvRunner();
    hooks.SetRemoteDraftKv(o.draft_kv != nullptr);
    engine::ModelRunner& runner = e->runner();
    decode = DecodeMessenger::Create(o, runner, Async(std::move(e)));
    EXPECT_TRUE(decode.ok()) << decode.status().ToString();
    return true;
  }
};

// The greedy tokens of a colocated engine without speculation.
std::vector<int32_t> NoSpeculation(const std::vector<int32_t>& prompt) {
  auto engine = Async(DraftEngine(nullptr));
  Outcome o = Generate(*engine, prompt, kMaxTokens);
  engine->Shutdown();
  return o.tokens;
}

TEST(DraftKvFormatTest, WritesAndBytesPerTokenIncludeTheDraftRegion) {
  engine::KvCacheSpec spec;
  spec.num_layers = 3;
  spec.num_kv_heads = 2;
  spec.head_dim = 8;
  spec.page_size = 4;
  const KvFormat plain = MakeKvFormat(1, spec);
  KvFormat f = plain;
  f.draft_kv = {1, 8, 2, 0, 0, 0, 0};  // one layer, 2 KV heads of 8, f32
  const ShardScheme tp1{1, 2, false}, tp2{2, 2, false};
  ASSERT_TRUE(ExpectedWrites(tp1, tp1, f, 5, 7).ok());
  EXPECT_EQ(*ExpectedWrites(tp1, tp1, f, 5, 7), (3u + 1u) * 5u);
  for (const auto& [p, d] : {std::pair{tp1, tp2}, std::pair{tp2, tp1}, std::pair{tp2, tp2}}) {
    auto target = PlanTransfer(p, d, f, 7);
    auto draft = PlanDraftTransfer(p, d, f, 7);
    ASSERT_TRUE(target.ok() && draft.ok());
    EXPECT_EQ(*ExpectedWrites(p, d, f, 5, 7), ExpectedWrites(*target, 5, 3).total_writes +
                                                  ExpectedWrites(*draft, 5, 1).total_writes);
  }
  // One draft layer: 2 heads x (K, V) x 8 floats per token more.
  EXPECT_EQ(KvBytesPerToken(f, tp1), KvBytesPerToken(plain, tp1) + 2u * 2u * 8u * 4u);
  // A draft model's region, described from its runner.
  auto engine = DraftEngine(&FirstLayer());
  const DraftKvFormat d = MakeDraftKvFormat(engine->disagg_hooks()->DraftKvRunner());
  EXPECT_EQ(d.num_layers, 1u);
  EXPECT_EQ(d.num_kv_heads, Model().weights.config.num_kv_heads);
  EXPECT_EQ(d.head_dim, static_cast<uint32_t>(Model().weights.config.head_dim));
  EXPECT_EQ(MakeDraftKvFormat(nullptr), DraftKvFormat{});
}

TEST(DraftKvFormatTest, AMismatchIsRefusedNamingTheDraftRegion) {
  const engine::KvCacheSpec spec;
  const KvFormat none = MakeKvFormat(1, spec);
  KvFormat one = none, two = none;
  one.draft_kv = {1, 8, 2, 0, 0, 0, 0};
  two.draft_kv = {2, 8, 1, 0, 0, 1, 0};
  EXPECT_TRUE(CheckCompatible(one, one).ok());
  EXPECT_THAT(CheckCompatible(one, none).message(),
              HasSubstr("draft_kv: ours a draft KV region, theirs none"));
  const std::string m = CheckCompatible(one, two).message();
  EXPECT_THAT(m, HasSubstr("draft_kv.num_layers: ours 1, theirs 2"));
  EXPECT_THAT(m, HasSubstr("draft_kv.num_kv_heads: ours 2, theirs 1"));
  EXPECT_THAT(m, HasSubstr("draft_kv.kv_dtype"));
}

TEST(DraftKvFormatTest, TheRegionAndItsDescriptorsTravelOnTheWire) {
  Hello h;
  h.format.draft_kv = {2, 36, 1, 36, 0, 1, 0};  // a latent cache, bf16
  Frame frame;
  frame.message = h;
  std::vector<uint8_t> bytes = EncodeFrame(frame, "s");
  auto back = DecodeFrame(bytes.data(), bytes.size(), "s");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(std::get<Hello>(back->message).format.draft_kv, h.format.draft_kv);
  h.format.draft_kv = {0, 8, 0, 0, 0, 0, 0};  // a region of no layers with a head_dim
  frame.message = h;
  bytes = EncodeFrame(frame, "s");
  EXPECT_THAT(DecodeFrame(bytes.data(), bytes.size(), "s").status().message(),
              HasSubstr("format.draft_kv describes a region of 0 layers"));

  PrefillRequest r;
  r.request_id = 5;
  r.num_tokens = 1;
  r.num_pages = 1;
  r.token_ids = {3};
  r.dst_pages = {0};
  r.decode_scheme = {2, 2, false};
  r.rank_regions = {"a", "b"};
  r.draft_rank_regions = {"c", "d"};
  frame.message = r;
  bytes = EncodeFrame(frame, "s");
  auto req = DecodeFrame(bytes.data(), bytes.size(), "s");
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_EQ(std::get<PrefillRequest>(req->message).draft_rank_regions, r.draft_rank_regions);
  r.draft_rank_regions = {"c"};
  frame.message = r;
  bytes = EncodeFrame(frame, "s");
  EXPECT_THAT(DecodeFrame(bytes.data(), bytes.size(), "s").status().message(),
              HasSubstr("draft_rank_regions has 1 entries for a decode tp_size of 2"));
}

// (prefill tp, decode tp)
class MessengerDraftTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(MessengerDraftTest, DecodeDraftsFromTheSentKvAndMatchesNoSpeculation) {
  const auto [prefill_tp, decode_tp] = GetParam();
  DraftSplit split;
  if (!split.Start(&Model().weights, prefill_tp, decode_tp))
    GTEST_SKIP() << "libfabric unavailable";
  ASSERT_TRUE(split.decode.ok());
  DecodeMessenger& decode = **split.decode;
  ASSERT_TRUE(decode.WaitForPeers(kDeadlineS).ok());
  int64_t prefilled = 0;
  const std::vector<int> lengths = {2, 9, 23};
  for (int len : lengths) {
    const std::vector<int32_t> prompt = PromptOf(len, len);
    prefilled += len - 1;
    Outcome got = Generate(decode, prompt, kMaxTokens);
    EXPECT_EQ(got.tokens, NoSpeculation(prompt))
        << "prompt of " << len << ": " << got.error.ToString();
  }
  const engine::SpecDecodeCounters d = decode.stats().spec_decode;
  EXPECT_GT(d.num_drafts, 0);
  // The target drafts its own greedy tokens: all are kept when the draft KV that came is right
  // (nearly all across TP shapes, whose sums round apart); a wrong one would keep few.
  if (prefill_tp == decode_tp) {
    EXPECT_EQ(d.num_accepted_tokens, d.num_draft_tokens);
  } else {
    EXPECT_GE(10 * d.num_accepted_tokens, 9 * d.num_draft_tokens);
  }
  // Decode's draft computed only each prompt's last token; the prefill's the rest.
  EXPECT_EQ(d.num_draft_prompt_tokens, static_cast<int64_t>(lengths.size()));
  EXPECT_EQ(split.prefill->engine->stats().spec_decode.num_draft_prompt_tokens, prefilled);
  EXPECT_TRUE(AllPagesFree(decode));
  EXPECT_TRUE(AllPagesFree(*split.prefill->engine));
}

INSTANTIATE_TEST_SUITE_P(Tp, MessengerDraftTest,
                         ::testing::Values(std::tuple{1, 1}, std::tuple{1, 2}, std::tuple{2, 1}),
                         [](const auto& info) {
                           return "Prefill" + std::to_string(std::get<0>(info.param)) + "Decode" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Bytes per token count both regions: with the target as its own draft, twice the target's.
TEST(MessengerDraftMetricsTest, BytesPerTokenCountTheDraftRegion) {
  DraftSplit split;
  if (!split.Start(&Model().weights, 1, 1)) GTEST_SKIP() << "libfabric unavailable";
  ASSERT_TRUE(split.decode.ok());
  auto plain = testing::StartPrefill(kShape);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(split.prefill->messenger->metrics().bytes_per_token(),
            2 * plain->messenger->metrics().bytes_per_token());
  EXPECT_EQ((*split.decode)->metrics().bytes_per_token(),
            split.prefill->messenger->metrics().bytes_per_token());
}

TEST(MessengerDraftTest, AHandshakeWithoutTheDraftRegionIsRefusedNamingIt) {
  DraftSplit split;
  if (!split.Start(&FirstLayer(), 1, 1, /*decode_draft=*/false))
    GTEST_SKIP() << "libfabric unavailable";
  ASSERT_TRUE(split.decode.ok());
  const Status st = (*split.decode)->WaitForPeers(kDeadlineS);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("draft_kv: ours a draft KV region, theirs none"));
  EXPECT_EQ(split.prefill->messenger->num_peers(), 0);
}

// The draft KV's writes are lost (a one-layer draft: the 6 writes posted after the target's 6 pages
// x 3 layers): the decode side, which counts them, never sees its KV complete and fails the request
// at the transfer timeout (a lone prefill instance: nowhere to retry); every page comes back on
// both sides, and the next request goes through.
TEST(MessengerDraftFaultTest, LostDraftWritesFailTheRequestAndFreeEveryPage) {
  DraftSplit split;
  if (!split.Start(&FirstLayer(), 1, 1)) GTEST_SKIP() << "libfabric unavailable";
  ASSERT_TRUE(split.decode.ok());
  DecodeMessenger& decode = **split.decode;
  ASSERT_TRUE(decode.WaitForPeers(kDeadlineS).ok());
  transfer::FaultRule rule;
  rule.site = transfer::FaultSite::kWrite;
  rule.kind = transfer::FaultKind::kDrop;
  rule.nth = 19;
  rule.count = 6;
  split.prefill_faults->Arm(rule);
  Outcome got = Generate(decode, PromptOf(23, 1), kMaxTokens);
  EXPECT_EQ(split.prefill_faults->num_applied(), 6u);
  EXPECT_EQ(got.finish, engine::FinishReason::kError);
  EXPECT_EQ(got.error.code(), StatusCode::kDeadlineExceeded) << got.error.ToString();
  EXPECT_THAT(got.error.message(), HasSubstr("did not complete the KV transfer"));
  EXPECT_TRUE(got.tokens.empty());
  EXPECT_TRUE(AllPagesFree(decode));
  EXPECT_TRUE(AllPagesFree(*split.prefill->engine));
  EXPECT_TRUE(WaitUntil([&] { return split.prefill->messenger->num_active_transfers() == 0; }));
  split.prefill_faults->Disarm();
  const std::vector<int32_t> prompt = PromptOf(23, 2);
  Outcome next = Generate(decode, prompt, kMaxTokens);
  EXPECT_EQ(next.tokens, NoSpeculation(prompt)) << next.error.ToString();
}

// The prefill instance is killed while its draft KV writes are held back (delayed past the
// transfer timeout), after the target's were posted: the decode instance fails the request once
// it finds the instance unreachable (nowhere to retry; at the latest at the transfer timeout), and
// every one of its pages comes back.
TEST(MessengerDraftFaultTest, APrefillKilledMidTransferLeavesEveryDecodePageFree) {
  DraftSplit split;
  if (!split.Start(&FirstLayer(), 1, 1)) GTEST_SKIP() << "libfabric unavailable";
  ASSERT_TRUE(split.decode.ok());
  DecodeMessenger& decode = **split.decode;
  ASSERT_TRUE(decode.WaitForPeers(kDeadlineS).ok());
  transfer::FaultRule rule;
  rule.site = transfer::FaultSite::kWrite;
  rule.kind = transfer::FaultKind::kDelay;
  rule.nth = 19;  // the draft's 6 writes, after the target's 18
  rule.count = 6;
  rule.delay_ms = 10000;
  split.prefill_faults->Arm(rule);
  testing::PendingRequest request(decode, PromptOf(23, 3), testing::GreedyParams(kMaxTokens));
  ASSERT_TRUE(request.submitted());
  ASSERT_TRUE(WaitUntil([&] { return split.prefill_faults->num_applied() == 6; }));
  split.prefill.reset();  // killed mid-transfer: its domain closes with the draft writes held
  const Outcome got = request.Wait();
  EXPECT_EQ(got.finish, engine::FinishReason::kError);
  EXPECT_TRUE(got.tokens.empty());
  EXPECT_TRUE(AllPagesFree(decode));
  EXPECT_EQ(decode.num_active_transfers(), 0);
}

}  // namespace
}  // namespace pd::messenger
