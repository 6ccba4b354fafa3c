// The KV messenger end to end inside one process: real engines (a tiny random model), real
// libfabric domains over loopback (tcp;ofi_rxm), a prefill messenger streaming KV layer by layer
// into a decode messenger. Greedy tokens must equal a colocated engine's; every failure path must
// end with a clear error and every page free on both sides. A scripted fake peer (a bare domain)
// plays a stalled or failing prefill instance, or a decode instance sending bad requests.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

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

using testing::AllPagesFree;
using testing::Async;
using testing::FakePeer;
using testing::Generate;
using testing::Hash;
using ::testing::HasSubstr;
using testing::kDeadlineS;
using testing::kSecret;
using testing::MakeEngine;
using testing::Model;
using testing::Outcome;
using testing::PendingRequest;
using testing::PromptOf;
using testing::Shape;
using testing::StartDecode;
using testing::StartPrefill;
using testing::WaitUntil;

// ------------------------------------------------------------------ golden

class MessengerGoldenTest : public ::testing::TestWithParam<Shape> {};

TEST_P(MessengerGoldenTest, GreedyTokensEqualAColocatedEngines) {
  const Shape s = GetParam();
  auto prefill = StartPrefill(s);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(s, {{"p0", prefill->messenger->fabric_address()}});
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  auto colocated = Async(MakeEngine(s));
  for (int len : {1, 2, 3, 5, 9, 17, 30}) {
    SCOPED_TRACE("prompt of " + std::to_string(len) + " tokens");
    const auto prompt = PromptOf(len, len);
    Outcome want = Generate(*colocated, prompt, 6);
    Outcome got = Generate(*decode, prompt, 6);
    ASSERT_EQ(got.finish, engine::FinishReason::kLength) << got.error.ToString();
    EXPECT_EQ(got.tokens, want.tokens);
  }
  EXPECT_EQ(decode->metrics().succeeded(), 6u);  // every prompt but the 1-token one
  EXPECT_EQ(decode->metrics().failed(), 0u);
  EXPECT_TRUE(AllPagesFree(*decode));
  EXPECT_TRUE(AllPagesFree(*prefill->engine));
  EXPECT_TRUE(WaitUntil([&] { return prefill->messenger->metrics().succeeded() == 6; }));
}

TEST_P(MessengerGoldenTest, ConcurrentRequestsAllMatch) {
  const Shape s = GetParam();
  auto prefill = StartPrefill(s);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(s, {{"p0", prefill->messenger->fabric_address()}});
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  auto colocated = Async(MakeEngine(s));
  std::vector<std::thread> threads;
  std::vector<Outcome> got(6), want(6);
  for (int i = 0; i < 6; ++i) want[i] = Generate(*colocated, PromptOf(4 + 5 * i, i), 4);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] { got[i] = Generate(*decode, PromptOf(4 + 5 * i, i), 4); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  EXPECT_TRUE(AllPagesFree(*decode));
  EXPECT_TRUE(AllPagesFree(*prefill->engine));
}

INSTANTIATE_TEST_SUITE_P(Shapes, MessengerGoldenTest,
                         ::testing::Values(Shape{engine::KvLayout::kHND, 4, 64},
                                           Shape{engine::KvLayout::kNHD, 4, 64},
                                           Shape{engine::KvLayout::kHND, 1, 64},
                                           Shape{engine::KvLayout::kNHD, 16, 5},
                                           Shape{engine::KvLayout::kHND, 4, 3}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::string(engine::KvLayoutName(info.param.layout)) + "_page" +
                                  std::to_string(info.param.page_size) + "_budget" +
                                  std::to_string(info.param.budget);
                         });

// ------------------------------------------------------------------ handshake

TEST(MessengerHandshakeTest, AMismatchIsRefusedWithEveryDifference) {
  Shape p{engine::KvLayout::kHND, 4, 64};
  Shape d{engine::KvLayout::kNHD, 8, 64};
  auto prefill = StartPrefill(p);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(d, {{"p0", prefill->messenger->fabric_address()}});
  Status s = decode->WaitForPeers(kDeadlineS);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("refused the handshake"));
  EXPECT_THAT(s.message(), HasSubstr("page_size: ours 4, theirs 8"));
  EXPECT_THAT(s.message(), HasSubstr("kv_layout: ours hnd, theirs nhd"));
  Outcome o = Generate(*decode, PromptOf(5, 1), 2);
  EXPECT_EQ(o.error.code(), StatusCode::kUnavailable);
  EXPECT_EQ(prefill->messenger->num_peers(), 0);
}

TEST(MessengerHandshakeTest, ADifferentModelIsRefused) {
  EXPECT_THAT(CheckCompatible(MakeKvFormat(1, {}), MakeKvFormat(2, {})).message(),
              HasSubstr("not the same model"));
  engine::testing::TinyModelOptions o;
  o.layers = 4;
  auto other = engine::testing::MakeTinyModel(o);
  EXPECT_NE(ModelFingerprint(other->weights), Hash());
  EXPECT_EQ(ModelFingerprint(Model().weights), Hash());
}

// An fp8_e4m3 cache pairs only with fp8_e4m3 and the same per-layer scales; each mismatch is
// refused naming the field.
TEST(MessengerHandshakeTest, Fp8KvDtypeAndScalesMustMatch) {
  engine::KvCacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 2;
  spec.head_dim = 8;
  spec.dtype = engine::KvDType::kFP8E4M3;
  const KvFormat ours = MakeKvFormat(1, spec);
  EXPECT_TRUE(CheckCompatible(ours, ours).ok());
  engine::KvCacheSpec other = spec;
  other.dtype = engine::KvDType::kBF16;
  Status st = CheckCompatible(ours, MakeKvFormat(1, other));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("kv_dtype: ours fp8_e4m3, theirs bf16"));
  other = spec;
  other.scales = {{1.0f, 1.0f}, {1.0f, 0.5f}};  // layer 1's v_scale differs
  st = CheckCompatible(ours, MakeKvFormat(1, other));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("kv_scales: ours fp8 k_scale/v_scale fingerprint"));
  other.scales = {{1.0f, 1.0f}, {1.0f, 1.0f}};  // what no scales mean
  EXPECT_TRUE(CheckCompatible(ours, MakeKvFormat(1, other)).ok());
  const ShardScheme scheme{1, 2, false};
  engine::KvCacheSpec bf16 = spec;
  bf16.dtype = engine::KvDType::kBF16;
  EXPECT_EQ(KvBytesPerToken(ours, scheme) * 2, KvBytesPerToken(MakeKvFormat(1, bf16), scheme));
  EXPECT_EQ(KvBytesPerToken(ours, scheme), 2u * 2 * 2 * 8);  // layers * K,V * heads * head_dim
}

// Both sides must run the same speculative decoding: method and K, and the drafter's fingerprint
// for draft_model and mtp (an n-gram's lookup bounds are decode's alone). A mismatch is refused
// naming speculative_config with both values, from either side.
TEST(MessengerHandshakeTest, SpeculativeConfigMustMatch) {
  engine::SpeculativeConfig ngram;
  ngram.method = engine::SpecMethod::kNgram;
  ngram.num_speculative_tokens = 3;
  ngram.prompt_lookup_min = ngram.prompt_lookup_max = 2;
  EXPECT_EQ(SpeculativeIdentity({}), "");
  EXPECT_EQ(SpeculativeIdentity(ngram), "ngram k=3");
  engine::SpeculativeConfig other_lookup = ngram;
  other_lookup.prompt_lookup_max = 5;
  EXPECT_EQ(SpeculativeIdentity(other_lookup), "ngram k=3");
  engine::SpeculativeConfig draft;
  draft.method = engine::SpecMethod::kDraftModel;
  draft.num_speculative_tokens = 4;
  draft.model = "/models/draft";
  EXPECT_EQ(SpeculativeIdentity(draft, 0xab), "draft_model k=4 draft=00000000000000ab");
  const engine::KvCacheSpec spec;
  const KvFormat off = MakeKvFormat(1, spec), three = MakeKvFormat(1, spec, false, "ngram k=3");
  EXPECT_TRUE(CheckCompatible(three, MakeKvFormat(1, spec, false, "ngram k=3")).ok());
  Status st = CheckCompatible(off, three);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("speculative_config: ours off, theirs ngram k=3"));
  EXPECT_THAT(CheckCompatible(three, off).message(),
              HasSubstr("speculative_config: ours ngram k=3, theirs off"));
  EXPECT_THAT(CheckCompatible(MakeKvFormat(1, spec, false, SpeculativeIdentity(draft, 1)),
                              MakeKvFormat(1, spec, false, SpeculativeIdentity(draft, 2)))
                  .message(),
              HasSubstr("speculative_config: ours draft_model k=4 draft=0000000000000001, theirs "
                        "draft_model k=4 draft=0000000000000002"));
  // Over the wire: the prefill instance refuses the Hello and the decode instance gets its
  // reason; neither takes the other as a peer.
  for (const auto& [prefill_says, decode_says] :
       {std::pair<std::string, std::string>{"ngram k=3", "ngram k=2"}, {"", "ngram k=2"}}) {
    PrefillMessengerOptions po = testing::BasePrefillOptions();
    po.speculative = prefill_says;
    auto prefill = testing::LaunchPrefill(MakeEngine(Shape{}), po);
    if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
    DecodeMessengerOptions o =
        testing::BaseDecodeOptions({{"p0", prefill->messenger->fabric_address()}});
    o.speculative = decode_says;
    auto e = MakeEngine(Shape{});
    engine::ModelRunner& runner = e->runner();
    auto decode = DecodeMessenger::Create(o, runner, Async(std::move(e)));
    ASSERT_TRUE(decode.ok()) << decode.status().ToString();
    st = (*decode)->WaitForPeers(kDeadlineS);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("speculative_config: ours " +
                                        (prefill_says.empty() ? std::string("off") : prefill_says) +
                                        ", theirs " + decode_says));
    EXPECT_EQ(prefill->messenger->num_peers(), 0);
  }
}

TEST(MessengerHandshakeTest, AWrongClusterSecretGetsNoAnswer) {
  Shape s;
  auto prefill = StartPrefill(s, "the-real-secret");
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(s, {{"p0", prefill->messenger->fabric_address()}}, 20000, "guess");
  Status st = decode->WaitForPeers(0.5);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("cluster secret"));
  EXPECT_EQ(prefill->messenger->num_peers(), 0);
}

TEST(MessengerHandshakeTest, ExpectedWritesNeedsThePlannerBeyondTp1) {
  EXPECT_EQ(*ExpectedWrites({1, 2}, {1, 2}, 3, 5), 15u);  // KV writes only
  EXPECT_EQ(ExpectedWrites({2, 2}, {1, 2}, 3, 5).status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(ExpectedWrites({1, 2}, {1, 4}, 3, 5).status().code(), StatusCode::kFailedPrecondition);
}

// ------------------------------------------------------------------ a scripted peer

// A prefill instance that accepts the handshake, then answers requests with `reply` (or never).
FakePeer::Handler FakePrefill(std::optional<Status> reply) {
  return [reply](FakePeer& self, const Frame& f) {
    if (auto* hello = std::get_if<Hello>(&f.message)) {
      HelloReply r;
      r.accepted = true;
      r.instance_name = "fake";
      r.format = hello->format;
      r.scheme = hello->scheme;
      r.fabric_address = self.address();
      self.Send(hello->fabric_address, r);
    } else if (auto* req = std::get_if<PrefillRequest>(&f.message)) {
      self.num_requests++;
      if (!reply) return;  // stalled
      auto desc = transfer::MemoryDescriptor::FromBytes(req->rank_regions[0]);
      self.Send(
          desc->fabric_addr,
          PrefillDone{req->request_id, static_cast<uint16_t>(reply->code()), reply->message(), 0});
    }
  };
}

TEST(MessengerFailureTest, AStalledPrefillIsRetriedOnTheOtherInstance) {
  Shape s;
  auto stalled = FakePeer::Create(FakePrefill(std::nullopt));
  if (stalled == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto prefill = StartPrefill(s);
  auto decode = StartDecode(
      s, {{"stalled", stalled->address()}, {"good", prefill->messenger->fabric_address()}}, 400);
  ASSERT_TRUE(WaitUntil([&] {
    auto p = decode->peers();
    return p[0].state == PeerStatus::State::kAccepted && p[1].state == PeerStatus::State::kAccepted;
  }));
  auto colocated = Async(MakeEngine(s));
  const auto prompt = PromptOf(11, 2);
  Outcome got = Generate(*decode, prompt, 4);  // least outstanding, first: the stalled one
  EXPECT_EQ(got.finish, engine::FinishReason::kLength) << got.error.ToString();
  EXPECT_EQ(got.tokens, Generate(*colocated, prompt, 4).tokens);
  EXPECT_EQ(decode->metrics().retried(), 1u);
  EXPECT_TRUE(AllPagesFree(*decode));
  EXPECT_TRUE(AllPagesFree(*prefill->engine));
}

TEST(MessengerFailureTest, AStalledLonePrefillFailsTheRequestClearly) {
  Shape s;
  auto stalled = FakePeer::Create(FakePrefill(std::nullopt));
  if (stalled == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(s, {{"stalled", stalled->address()}}, 300);
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  Outcome got = Generate(*decode, PromptOf(9, 1), 4);
  EXPECT_EQ(got.finish, engine::FinishReason::kError);
  EXPECT_TRUE(got.tokens.empty());
  EXPECT_THAT(got.error.message(), HasSubstr("did not complete the KV transfer within 300 ms"));
  EXPECT_EQ(got.error.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(decode->metrics().failed(), 1u);
  EXPECT_TRUE(AllPagesFree(*decode));
  EXPECT_EQ(decode->num_active_transfers(), 0);
}

TEST(MessengerFailureTest, AnErrorFromPrefillIsRetriedThenReported) {
  Shape s;
  auto busy1 = FakePeer::Create(FakePrefill(ResourceExhausted("queue full")));
  if (busy1 == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto busy2 = FakePeer::Create(FakePrefill(ResourceExhausted("queue full too")));
  auto decode = StartDecode(s, {{"b1", busy1->address()}, {"b2", busy2->address()}});
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  Outcome got = Generate(*decode, PromptOf(9, 1), 4);
  EXPECT_EQ(got.finish, engine::FinishReason::kError);
  EXPECT_EQ(got.error.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(got.error.message(), HasSubstr("after 2 attempt(s)"));
  EXPECT_THAT(got.error.message(), HasSubstr("queue full"));
  EXPECT_TRUE(AllPagesFree(*decode));
}

TEST(MessengerFailureTest, AnAbortedRequestFreesPagesOnBothSides) {
  Shape s{engine::KvLayout::kHND, 4, 4};  // chunked: the prefill takes several steps
  auto prefill = StartPrefill(s);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(s, {{"p0", prefill->messenger->fabric_address()}});
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  for (int i = 0; i < 8; ++i) {
    engine::SamplingParams p;
    p.max_tokens = 50;
    PendingRequest request(*decode, PromptOf(40, i), p);
    ASSERT_TRUE(request.submitted());
    // Abort at different points: at once, once the transfer started, once decoding.
    if (i % 3 == 1) WaitUntil([&] { return decode->num_active_transfers() > 0; }, 5);
    if (i % 3 == 2) WaitUntil([&] { return decode->metrics().succeeded() > 0; }, 5);
    decode->Abort(request.id());
    const engine::FinishReason finish = request.Wait(30).finish;
    EXPECT_TRUE(finish == engine::FinishReason::kAbort || finish == engine::FinishReason::kLength);
  }
  EXPECT_TRUE(AllPagesFree(*decode));
  EXPECT_TRUE(AllPagesFree(*prefill->engine));
  EXPECT_TRUE(WaitUntil([&] { return prefill->messenger->num_active_transfers() == 0; }));
}

// A decode instance that sends malformed requests gets PrefillDone errors naming the field.
TEST(MessengerFailureTest, BadPrefillRequestsAreRefusedFieldByField) {
  Shape s;
  auto prefill = StartPrefill(s);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  // Its own region, to name in requests, and a metadata buffer: declared before the fake so
  // they are freed after its domain closes.
  std::vector<uint8_t> region(4096 * 3 * 64, 0);  // not a whole number of pages? see below
  std::vector<uint8_t> meta(4096, 0);
  auto fake = FakePeer::Create([](FakePeer& self, const Frame& f) { self.Record(f); });
  auto spec = MakeEngine(s)->runner().region().spec();
  const uint64_t layer_bytes = spec.page_bytes() * spec.num_layers;
  region.assign(layer_bytes * 10, 0);
  auto mr = fake->domain().RegisterMemory(region.data(), region.size());
  ASSERT_TRUE(mr.ok());
  auto meta_mr = fake->domain().RegisterMemory(meta.data(), meta.size());
  ASSERT_TRUE(meta_mr.ok());

  // Before the handshake a request is dropped; after it, refused with a reason.
  Hello hello{"fake-decode",
              prefill->messenger->format(),
              {1, 2},
              fake->address(),
              "",
              kDefaultMessageBytes,
              {}};
  fake->Send(prefill->messenger->fabric_address(), hello);
  auto reply = fake->Next();
  ASSERT_TRUE(reply.has_value());
  ASSERT_TRUE(std::get<HelloReply>(reply->message).accepted);

  auto good = [&] {
    PrefillRequest r;
    r.request_id = 77;
    r.transfer_imm = 5;
    r.token_ids = PromptOf(9, 1);  // 3 pages of 4
    r.decode_scheme = {1, 2};
    r.rank_regions = {mr->descriptor.ToBytes()};
    r.dst_pages = {0, 1, 2};
    r.metadata_region = meta_mr->descriptor.ToBytes();
    r.metadata_offset = 0;
    r.metadata_bytes = 24 * 4;
    r.deadline_ms = 5000;
    r.metadata_imm = 6;
    return r;
  };
  struct Case {
    std::function<void(PrefillRequest&)> edit;
    StatusCode code;
    const char* text;
  };
  std::vector<Case> cases = {
      {[](PrefillRequest& r) {
         r.dst_pages = {0, 1};
       },
       StatusCode::kInvalidArgument, "dst_pages has 2 ids for 9 tokens"},
      {[](PrefillRequest& r) {
         r.dst_pages = {0, 1, 10};
       },
       StatusCode::kOutOfRange, "dst_pages[2] = 10 is outside the decode region's 10 pages"},
      {[](PrefillRequest& r) { r.metadata_bytes = 8; }, StatusCode::kInvalidArgument,
       "metadata_bytes 8"},
      {[](PrefillRequest& r) { r.metadata_offset = 4090; }, StatusCode::kOutOfRange, ""},
      {[](PrefillRequest& r) {
         r.token_ids = {};
         r.dst_pages = {};
       },
       StatusCode::kInvalidArgument, "token_ids is empty"},
      {[](PrefillRequest& r) {
         r.decode_scheme = {3, 2};  // TP 3 over 2 KV heads: no shard plan
         r.rank_regions = {r.rank_regions[0], r.rank_regions[0], r.rank_regions[0]};
       },
       StatusCode::kFailedPrecondition, "cannot pair prefill tp_size 1 with decode tp_size 3"},
      {[](PrefillRequest& r) { r.token_ids[3] = 9999; }, StatusCode::kInvalidArgument,
       "outside the vocabulary"},
      {[](PrefillRequest& r) { r.metadata_imm = r.transfer_imm; }, StatusCode::kInvalidArgument,
       "metadata_imm equals transfer_imm (5)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    PrefillRequest r = good();
    c.edit(r);
    r.num_tokens = static_cast<uint32_t>(r.token_ids.size());
    r.num_pages = static_cast<uint32_t>(r.dst_pages.size());
    fake->Send(prefill->messenger->fabric_address(), r);
    auto f = fake->Next();
    ASSERT_TRUE(f.has_value());
    const auto& done = std::get<PrefillDone>(f->message);
    EXPECT_EQ(done.request_id, 77u);
    EXPECT_EQ(done.status_code, static_cast<uint16_t>(c.code)) << done.message;
    EXPECT_THAT(done.message, HasSubstr(c.text));
  }
  // The well-formed request goes through: its writes land in the fake's region, then Done OK.
  PrefillRequest whole = good();
  whole.num_tokens = 9;
  whole.num_pages = 3;
  fake->Send(prefill->messenger->fabric_address(), whole);
  auto f = fake->Next();
  ASSERT_TRUE(f.has_value());
  const auto& done = std::get<PrefillDone>(f->message);
  EXPECT_EQ(done.status_code, 0) << done.message;
  EXPECT_EQ(done.num_writes, 3u * 3 + 1);
  EXPECT_EQ(fake->domain().imm_counters().unclaimed(5), 3u * 3);  // the KV page writes
  EXPECT_EQ(fake->domain().imm_counters().unclaimed(6), 1u);      // the metadata write
  EXPECT_TRUE(AllPagesFree(*prefill->engine));
}

// ------------------------------------------------------------------ metadata

TEST(MessengerMetadataTest, TheLastHiddenStateArrivesAndEqualsThePrefillEngines) {
  Shape s{engine::KvLayout::kNHD, 4, 5};  // chunked
  auto prefill = StartPrefill(s);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  std::mutex mu;
  std::map<int64_t, std::vector<float>> got;
  auto decode = StartDecode(s, {{"p0", prefill->messenger->fabric_address()}}, 20000, kSecret,
                            [&](int64_t id, const std::vector<float>& hidden) {
                              std::lock_guard<std::mutex> lock(mu);
                              got[id] = hidden;
                            });
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  const auto prompt = PromptOf(14, 3);
  int64_t id = -1;
  Outcome out = Generate(*decode, prompt, 2, &id);
  ASSERT_EQ(out.finish, engine::FinishReason::kLength) << out.error.ToString();

  // The same prefill on a colocated engine of the same shape.
  auto colocated = Async(MakeEngine(s));
  std::mutex ref_mu;
  std::condition_variable cv;
  std::optional<engine::RequestOutput> ref;
  auto ref_id = colocated->SubmitPrefillOnly(std::vector<int32_t>(prompt.begin(), prompt.end() - 1),
                                             [&](const engine::RequestOutput& o) {
                                               if (!o.finished()) return;
                                               std::lock_guard<std::mutex> lock(ref_mu);
                                               ref = o;
                                               cv.notify_all();
                                             });
  ASSERT_TRUE(ref_id.ok());
  {
    std::unique_lock<std::mutex> lock(ref_mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return ref.has_value(); }));
  }
  ASSERT_NE(ref->prefill_result, nullptr);
  colocated->ReleasePages(ref->prefill_result->page_table);
  // The request decoded without waiting for its metadata, which may land after it ended.
  EXPECT_TRUE(WaitUntil([&] {
    std::lock_guard<std::mutex> lock(mu);
    return got.count(id) == 1;
  }));
  EXPECT_TRUE(WaitUntil([&] { return decode->metrics().fenced() == 0; }));
  EXPECT_EQ(decode->metrics().metadata_missing(), 0u);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(got.count(id), 1u);
  EXPECT_EQ(got[id].size(), static_cast<size_t>(Model().weights.config.hidden_size));
  EXPECT_EQ(got[id], ref->prefill_result->last_hidden);
}

// The delivered hidden state is also kept on the request in the decode engine while it runs
// (DisaggHooks::PrefilledHidden, for a drafter that starts from it): a step of the request sees
// exactly what on_metadata got.
TEST(MessengerMetadataTest, TheHiddenStateIsKeptOnTheDecodeRequest) {
  Shape s{engine::KvLayout::kHND, 3, 6};
  auto prefill = StartPrefill(s);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  std::mutex mu;
  int64_t watched = -1;
  std::vector<float> seen_in_step, delivered;
  auto e = MakeEngine(s);
  engine::DisaggHooks* hooks = e->disagg_hooks();
  ASSERT_NE(hooks, nullptr);
  hooks->SetStepObserver([&, hooks](const engine::StepInfo&) {  // on the engine thread
    std::lock_guard<std::mutex> lock(mu);
    const std::span<const float> h =
        watched >= 0 ? hooks->PrefilledHidden(watched) : std::span<const float>();
    if (!h.empty() && seen_in_step.empty()) seen_in_step.assign(h.begin(), h.end());
  });
  engine::ModelRunner& runner = e->runner();
  DecodeMessengerOptions o =
      testing::BaseDecodeOptions({{"p0", prefill->messenger->fabric_address()}});
  o.on_metadata = [&](int64_t id, const std::vector<float>& hidden) {
    std::lock_guard<std::mutex> lock(mu);
    if (id == watched) delivered = hidden;
  };
  auto made = DecodeMessenger::Create(o, runner, Async(std::move(e)));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  std::unique_ptr<DecodeMessenger> decode = std::move(made).value();
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  // Long enough to be running when the metadata lands (right after the KV); then aborted.
  {
    std::unique_lock<std::mutex> lock(mu);  // held until watched is set: no step reads it before
    PendingRequest request(*decode, PromptOf(14, 5), testing::GreedyParams(100));
    ASSERT_TRUE(request.submitted());
    watched = request.id();
    lock.unlock();
    EXPECT_TRUE(WaitUntil([&] {
      std::lock_guard<std::mutex> l(mu);
      return !seen_in_step.empty();
    })) << "no decode step of the request saw its prefilled hidden state";
    decode->Abort(request.id());
    request.Wait(kDeadlineS);
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen_in_step.size(), static_cast<size_t>(Model().weights.config.hidden_size));
  EXPECT_EQ(seen_in_step, delivered);
}

// A request aborted while its (stalled) prefill instance may still write keeps its pages out of
// the free list until that instance confirms it stopped (PrefillDone): a late write can never land
// in pages another request already uses.
TEST(MessengerFenceTest, AbortedTransferPagesWaitForThePrefillInstanceToStop) {
  Shape s;
  auto accept = FakePrefill(std::nullopt);
  auto fake = FakePeer::Create([accept](FakePeer& self, const Frame& f) {
    if (std::holds_alternative<Hello>(f.message)) {
      accept(self, f);
    } else {
      self.Record(f);  // PrefillRequest, then Cancel
    }
  });
  if (fake == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(s, {{"slow", fake->address()}});
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  const int total = decode->stats().num_total_pages;
  engine::SamplingParams p;
  p.max_tokens = 4;
  PendingRequest pending(*decode, PromptOf(13, 1), p);
  ASSERT_TRUE(pending.submitted());
  std::optional<Frame> request = fake->Next();
  ASSERT_TRUE(request.has_value());
  auto* req = std::get_if<PrefillRequest>(&request->message);
  ASSERT_NE(req, nullptr);
  decode->Abort(pending.id());
  pending.Wait(30);
  std::optional<Frame> cancel = fake->Next();
  ASSERT_TRUE(cancel.has_value());
  ASSERT_TRUE(std::holds_alternative<Cancel>(cancel->message));
  // The request is over, but its pages (13 prompt tokens: 4 pages of 4) are still fenced.
  EXPECT_EQ(decode->stats().num_free_pages, total - 4);
  EXPECT_EQ(decode->stats().num_awaiting_kv, 0);
  // A PrefillDone for another (unknown) transfer lifts nothing.
  auto dst = transfer::MemoryDescriptor::FromBytes(req->rank_regions[0]);
  ASSERT_TRUE(dst.ok());
  fake->Send(dst->fabric_addr, PrefillDone{req->request_id + 1, 1, "cancelled", 0});
  // The instance confirms it stopped writing: the pages are free again.
  fake->Send(dst->fabric_addr, PrefillDone{req->request_id, 1, "cancelled", 0});
  EXPECT_TRUE(AllPagesFree(*decode));
}

}  // namespace
}  // namespace pd::messenger
