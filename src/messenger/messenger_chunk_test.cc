// The control protocol under long prompts and local send failures, inside one process (real
// engines, loopback libfabric): a prompt whose ids need several control messages (a small
// per-message limit stands for the default 256 KiB) gives exactly the colocated greedy tokens,
// whichever side has the smaller limit; a send that fails locally fails its request only; and the
// prefill side's assembly of a prompt's chunks (any order, overlaps, Cancel, timeout) frees what
// it held.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>

#include "messenger/messenger_test_util.h"

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
using testing::Outcome;
using testing::PendingRequest;
using testing::PromptOf;
using testing::WaitUntil;

constexpr int kLongPrompt = 1500;

// The tiny random model with room for prompts of kLongPrompt tokens.
const engine::testing::TinyModel& LongModel() {
  static auto* model = [] {
    engine::testing::TinyModelOptions o;
    o.layers = testing::kModelLayers;
    auto m = engine::testing::MakeTinyModel(o);
    m->weights.config.max_position_embeddings = 2 * kLongPrompt;
    return m.release();
  }();
  return *model;
}

// An engine of LongModel() with room for prompts of kLongPrompt tokens.
std::unique_ptr<engine::Engine> LongEngine(int page_size, int budget) {
  engine::EngineOptions o;
  o.runner.kv.page_size = page_size;
  o.runner.num_pages = 2 * kLongPrompt / page_size + 64;
  o.runner.num_threads = 1;
  o.scheduler.max_num_batched_tokens = budget;
  o.scheduler.max_num_seqs = std::min(8, budget);
  o.scheduler.max_model_len = kLongPrompt + 64;
  auto e = engine::Engine::Create(LongModel().weights, o);
  PD_CHECK(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

struct Pair {
  std::unique_ptr<testing::PrefillInstance> prefill;
  std::unique_ptr<DecodeMessenger> decode;
};

// A prefill and a decode instance with the given control message limits (0: the default).
std::optional<Pair> StartPair(int page_size, int budget, uint32_t prefill_limit,
                              uint32_t decode_limit,
                              std::function<Status(const Message&)> send_fault = {}) {
  PrefillMessengerOptions po;
  po.cluster_secret = kSecret;
  po.model_hash = ModelFingerprint(LongModel().weights);
  po.domain = transfer::testing::LoopbackOptions();
  if (prefill_limit != 0) po.max_message_bytes = prefill_limit;
  Pair p;
  p.prefill = testing::LaunchPrefill(LongEngine(page_size, budget), po);
  if (p.prefill == nullptr) return std::nullopt;
  auto e = LongEngine(page_size, 512);
  engine::ModelRunner& runner = e->runner();
  DecodeMessengerOptions o;
  o.cluster_secret = kSecret;
  o.model_hash = ModelFingerprint(LongModel().weights);
  o.domain = transfer::testing::LoopbackOptions();
  o.peers = {{"p0", p.prefill->messenger->fabric_address()}};
  o.hello_retry_s = 0.05;
  if (decode_limit != 0) o.max_message_bytes = decode_limit;
  o.send_fault = std::move(send_fault);
  auto d = DecodeMessenger::Create(o, runner, Async(std::move(e)));
  PD_CHECK(d.ok()) << d.status().ToString();
  p.decode = std::move(d).value();
  return p;
}

struct LimitCase {
  int page_size;
  uint32_t prefill_limit, decode_limit;
};

class MessengerLongPromptTest : public ::testing::TestWithParam<LimitCase> {};

TEST_P(MessengerLongPromptTest, APromptOfManyControlMessagesGivesTheColocatedTokens) {
  const LimitCase c = GetParam();
  auto pair = StartPair(c.page_size, 256, c.prefill_limit, c.decode_limit);
  if (!pair) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  ASSERT_TRUE(pair->decode->WaitForPeers(kDeadlineS).ok());
  // Its ids (and page ids) take several times the smaller limit of 4 KiB.
  const auto prompt = PromptOf(kLongPrompt, 3);
  ASSERT_GT(prompt.size() * sizeof(int32_t), 4u * kMinMessageBytes / 3);
  auto colocated = Async(LongEngine(c.page_size, 256));
  Outcome want = Generate(*colocated, prompt, 5);
  Outcome got = Generate(*pair->decode, prompt, 5);
  ASSERT_EQ(got.finish, engine::FinishReason::kLength) << got.error.ToString();
  EXPECT_EQ(got.tokens, want.tokens);
  // And a short one after it, in one message.
  EXPECT_EQ(Generate(*pair->decode, PromptOf(9, 1), 3).tokens,
            Generate(*colocated, PromptOf(9, 1), 3).tokens);
  EXPECT_EQ(pair->decode->metrics().failed(), 0u);
  EXPECT_TRUE(AllPagesFree(*pair->decode));
  EXPECT_TRUE(AllPagesFree(*pair->prefill->engine));
}

INSTANTIATE_TEST_SUITE_P(Limits, MessengerLongPromptTest,
                         ::testing::Values(LimitCase{1, kMinMessageBytes, kMinMessageBytes},
                                           LimitCase{4, kMinMessageBytes, 0},
                                           LimitCase{16, 0, kMinMessageBytes}),
                         [](const ::testing::TestParamInfo<LimitCase>& i) {
                           return "page" + std::to_string(i.param.page_size) + "_prefill" +
                                  std::to_string(i.param.prefill_limit) + "_decode" +
                                  std::to_string(i.param.decode_limit);
                         });

// A PrefillRequest that cannot leave this process (here refused by the test's fault hook, as an
// oversized or unencodable message would be) fails that request with a clear error; the peer
// stays accepted and a request in flight on it meanwhile succeeds.
TEST(MessengerLocalSendFailureTest, FailsThatRequestOnlyAndNeverThePeer) {
  constexpr uint32_t kDoomedTokens = 20;  // the prompt of 21 tokens cannot be sent
  auto pair = StartPair(4, 4, 0, 0, [](const Message& m) {
    auto* r = std::get_if<PrefillRequest>(&m);
    return r != nullptr && r->num_tokens == kDoomedTokens
               ? ResourceExhausted("injected: the send queue is full")
               : OkStatus();
  });
  if (!pair) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  DecodeMessenger& decode = *pair->decode;
  ASSERT_TRUE(decode.WaitForPeers(kDeadlineS).ok());
  auto colocated = Async(LongEngine(4, 4));
  const auto long_prompt = PromptOf(kLongPrompt, 5);
  const Outcome want = Generate(*colocated, long_prompt, 4);
  PendingRequest in_flight(decode, long_prompt, testing::GreedyParams(4));
  ASSERT_TRUE(in_flight.submitted());
  ASSERT_TRUE(WaitUntil([&] { return decode.num_active_transfers() > 0; }));
  Outcome doomed = Generate(decode, PromptOf(kDoomedTokens + 1, 2), 4);
  EXPECT_EQ(doomed.finish, engine::FinishReason::kError);
  EXPECT_EQ(doomed.error.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(doomed.error.message(), HasSubstr("a local error"));
  EXPECT_THAT(doomed.error.message(), HasSubstr("injected: the send queue is full"));
  EXPECT_EQ(decode.peers()[0].state, PeerStatus::State::kAccepted);
  const Outcome got = in_flight.Wait();
  ASSERT_EQ(got.finish, engine::FinishReason::kLength) << got.error.ToString();
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(Generate(decode, PromptOf(13, 4), 3).tokens,
            Generate(*colocated, PromptOf(13, 4), 3).tokens);
  EXPECT_EQ(decode.metrics().failed(), 1u);
  EXPECT_TRUE(AllPagesFree(decode));
  EXPECT_TRUE(AllPagesFree(*pair->prefill->engine));
}

// The prefill side's assembly, driven by a scripted decode instance: chunks before or after their
// request, an overlap, a Cancel and a prompt that never completes each end with PrefillDone, and
// nothing is left held.
TEST(MessengerPromptAssemblyTest, ChunksAssembleInAnyOrderAndPartialsAreFreed) {
  PrefillMessengerOptions po;
  po.cluster_secret = kSecret;
  po.model_hash = Hash();
  po.domain = transfer::testing::LoopbackOptions();
  po.prompt_timeout_s = 0.5;
  auto prefill = testing::LaunchPrefill(testing::MakeEngine({}), po);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  // The fake's registered memory, declared before it: freed after its domain closes.
  const auto spec = testing::MakeEngine({})->runner().region().spec();
  std::vector<uint8_t> kv(spec.page_bytes() * spec.num_layers * 10), meta(4096);
  auto fake = FakePeer::Create([](FakePeer& self, const Frame& f) { self.Record(f); });
  ASSERT_NE(fake, nullptr);
  const std::string to = prefill->messenger->fabric_address();
  auto kv_mr = fake->domain().RegisterMemory(kv.data(), kv.size());
  auto meta_mr = fake->domain().RegisterMemory(meta.data(), meta.size());
  ASSERT_TRUE(kv_mr.ok() && meta_mr.ok());
  fake->Send(to, Hello{"fake-decode",
                       prefill->messenger->format(),
                       {1, 2},
                       fake->address(),
                       "",
                       kDefaultMessageBytes,
                       {}});
  auto reply = fake->Next();
  ASSERT_TRUE(reply.has_value());
  ASSERT_TRUE(std::get<HelloReply>(reply->message).accepted);

  const std::vector<int32_t> tokens = PromptOf(9, 1);  // 3 pages of 4
  auto header = [&](uint64_t id, uint32_t first_tokens) {
    PrefillRequest r;
    r.request_id = id;
    r.transfer_imm = static_cast<uint32_t>(id);
    r.metadata_imm = static_cast<uint32_t>(id) + 1000;
    r.num_tokens = 9;
    r.num_pages = 3;
    r.token_ids.assign(tokens.begin(), tokens.begin() + first_tokens);
    r.decode_scheme = {1, 2};
    r.rank_regions = {kv_mr->descriptor.ToBytes()};
    r.metadata_region = meta_mr->descriptor.ToBytes();
    r.metadata_bytes = 24 * 4;
    r.deadline_ms = 5000;
    return r;
  };
  auto rest = [&](uint64_t id, uint32_t from) {
    return PromptChunk{
        id, from, std::vector<int32_t>(tokens.begin() + from, tokens.end()), 0, {0, 1, 2}};
  };
  auto done = [&](uint64_t id) -> std::optional<PrefillDone> {
    for (std::optional<Frame> f; (f = fake->Next());) {
      auto* d = std::get_if<PrefillDone>(&f->message);
      if (d != nullptr && d->request_id == id) return *d;
    }
    return std::nullopt;
  };
  // The request first, then its chunk; then a chunk before its request.
  fake->Send(to, header(1, 4));
  fake->Send(to, rest(1, 4));
  auto d1 = done(1);
  ASSERT_TRUE(d1.has_value());
  EXPECT_EQ(d1->status_code, 0) << d1->message;
  fake->Send(to, rest(2, 2));
  fake->Send(to, header(2, 2));
  auto d2 = done(2);
  ASSERT_TRUE(d2.has_value());
  EXPECT_EQ(d2->status_code, 0) << d2->message;
  // Overlapping ids are refused.
  fake->Send(to, header(3, 4));
  fake->Send(to, rest(3, 3));
  auto d3 = done(3);
  ASSERT_TRUE(d3.has_value());
  EXPECT_EQ(d3->status_code, static_cast<uint16_t>(StatusCode::kInvalidArgument));
  EXPECT_THAT(d3->message, HasSubstr("overlaps"));
  // A Cancel drops a partial prompt; one that never completes times out.
  fake->Send(to, header(4, 4));
  fake->Send(to, Cancel{4});
  auto d4 = done(4);
  ASSERT_TRUE(d4.has_value());
  EXPECT_EQ(d4->status_code, static_cast<uint16_t>(StatusCode::kCancelled));
  fake->Send(to, header(5, 4));
  auto d5 = done(5);
  ASSERT_TRUE(d5.has_value());
  EXPECT_EQ(d5->status_code, static_cast<uint16_t>(StatusCode::kDeadlineExceeded));
  EXPECT_THAT(d5->message, HasSubstr("did not arrive within"));
  // After all that, a whole request still goes through and every page is free.
  fake->Send(to, header(6, 9));
  fake->Send(to, PromptChunk{6, 0, {}, 0, {0, 1, 2}});
  auto d6 = done(6);
  ASSERT_TRUE(d6.has_value());
  EXPECT_EQ(d6->status_code, 0) << d6->message;
  EXPECT_TRUE(AllPagesFree(*prefill->engine));
  EXPECT_EQ(prefill->messenger->num_active_transfers(), 0);
}

}  // namespace
}  // namespace pd::messenger
