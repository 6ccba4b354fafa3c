// The metadata write (the last prefilled position's hidden state) is counted apart from the KV
// page writes: a request decodes as soon as its KV has landed. These tests script a prefill
// instance (a bare domain) that lands every KV write at once and posts the metadata write only
// when the test says so (or first, or never), and check that the request never waits for it,
// that its slot stays fenced until it lands (or PrefillDone, or the deadline + grace), that a bad
// or missing metadata is counted and fails nothing, and that every page ends free.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "messenger/decode_side.h"
#include "messenger/handshake.h"
#include "messenger/messenger_test_util.h"
#include "transfer/test_util.h"

namespace pd::messenger {
namespace {

using testing::AllPagesFree;
using testing::FakePeer;
using testing::Generate;
using testing::GreedyParams;
using testing::kDeadlineS;
using testing::Model;
using testing::Outcome;
using testing::PendingRequest;
using testing::PromptOf;
using testing::Shape;
using testing::StartDecode;
using testing::WaitUntil;

// A metadata write's source on the fake prefill's domain: hidden_size floats.
struct MetaSource {
  std::vector<float> values;
  std::optional<transfer::MemoryRegion> mr;
};

std::vector<float> Hidden(float scale) {
  std::vector<float> h(static_cast<size_t>(Model().weights.config.hidden_size));
  for (size_t i = 0; i < h.size(); ++i) h[i] = scale * static_cast<float>(i + 1);
  return h;
}

// Every float's bits 0xFFFFFFFF: the canary the decode side fills each slot with.
std::vector<float> Canary() {
  std::vector<float> h(static_cast<size_t>(Model().weights.config.hidden_size));
  std::memset(h.data(), 0xFF, h.size() * sizeof(float));
  return h;
}

// Posts `req`'s metadata write from `fake`, from `src` (which must outlive the write).
void PostMetadata(FakePeer& fake, const PrefillRequest& req, MetaSource& src) {
  if (!src.mr) {
    auto mr = fake.domain().RegisterMemory(src.values.data(), src.values.size() * sizeof(float));
    ASSERT_TRUE(mr.ok());
    src.mr = *mr;
  }
  auto desc = transfer::MemoryDescriptor::FromBytes(req.metadata_region);
  ASSERT_TRUE(desc.ok());
  auto remote = fake.domain().AddRemote(*desc);
  ASSERT_TRUE(remote.ok());
  transfer::WriteRequest w{*src.mr,         0, req.metadata_bytes, *remote, req.metadata_offset,
                           req.metadata_imm};
  ASSERT_TRUE(fake.domain().SubmitWrite(w, nullptr).ok());
}

// A prefill instance that accepts the handshake and, for each PrefillRequest, lands every KV write
// at once (zeros, all into the first page: the tokens are not checked) and records the request
// for the test. With `meta_first` it posts the metadata write (from it) before the KV writes.
FakePeer::Handler KvOnlyPrefill(const Shape& s, std::shared_ptr<MetaSource> meta_first = nullptr) {
  auto src = std::make_shared<std::vector<uint8_t>>(64, 0);
  auto src_mr = std::make_shared<std::optional<transfer::MemoryRegion>>();
  return [s, src, src_mr, meta_first](FakePeer& self, const Frame& f) {
    if (auto* hello = std::get_if<Hello>(&f.message)) {
      HelloReply r{
          true, "", "fake", hello->format, hello->scheme, self.address(), kDefaultMessageBytes, {}};
      self.Send(hello->fabric_address, r);
      return;
    }
    auto* req = std::get_if<PrefillRequest>(&f.message);
    if (req == nullptr) return;
    if (!src_mr->has_value()) *src_mr = *self.domain().RegisterMemory(src->data(), src->size());
    if (meta_first) PostMetadata(self, *req, *meta_first);
    auto desc = transfer::MemoryDescriptor::FromBytes(req->rank_regions[0]);
    auto remote = self.domain().AddRemote(*desc);
    ASSERT_TRUE(remote.ok());
    const uint32_t pages =
        PagesForTokens(static_cast<uint32_t>(req->token_ids.size()), s.page_size);
    auto n = ExpectedWrites(req->decode_scheme, req->decode_scheme, 3, pages);
    ASSERT_TRUE(n.ok());
    for (uint64_t k = 0; k < *n; ++k) {
      transfer::WriteRequest w{**src_mr, 0, src->size(), *remote, 0, req->transfer_imm};
      ASSERT_TRUE(self.domain().SubmitWrite(w, nullptr).ok());
    }
    self.Record(f);
  };
}

// What on_metadata delivered, by request id.
struct Delivered {
  std::mutex mu;
  std::map<int64_t, std::vector<float>> by_id;
  std::function<void(int64_t, const std::vector<float>&)> Callback() {
    return [this](int64_t id, const std::vector<float>& h) {
      std::lock_guard<std::mutex> lock(mu);
      by_id[id] = h;
    };
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return by_id.size();
  }
};

struct Harness {
  std::unique_ptr<FakePeer> fake;
  std::unique_ptr<DecodeMessenger> decode;
};

// A KV-only fake prefill and a decode messenger over it (null fake: no fabric).
Harness Start(const Shape& s, Delivered* delivered, uint32_t timeout_ms = 20000,
              double fence_grace_s = 5.0, std::shared_ptr<MetaSource> meta_first = nullptr) {
  Harness st;
  st.fake = FakePeer::Create(KvOnlyPrefill(s, std::move(meta_first)));
  if (st.fake == nullptr) return st;
  st.decode = StartDecode(s, {{"fake", st.fake->address()}}, timeout_ms, testing::kSecret,
                          delivered->Callback(), nullptr, fence_grace_s);
  EXPECT_TRUE(st.decode->WaitForPeers(kDeadlineS).ok());
  return st;
}

PrefillRequest NextRequest(FakePeer& fake) {
  std::optional<Frame> f = fake.Next();
  EXPECT_TRUE(f.has_value());
  if (!f.has_value()) return {};
  auto* req = std::get_if<PrefillRequest>(&f->message);
  EXPECT_NE(req, nullptr);
  return req != nullptr ? *req : PrefillRequest{};
}

TEST(MessengerMetadataApartTest, ARequestDecodesToItsEndBeforeItsMetadataLands) {
  Shape s;
  Delivered delivered;
  MetaSource src{Hidden(0.5f), std::nullopt};  // registered by the fake: outlives it
  Harness st = Start(s, &delivered);
  if (st.fake == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  int64_t id = -1;
  Outcome got = Generate(*st.decode, PromptOf(9, 1), 4, &id);  // the metadata is held back
  EXPECT_EQ(got.finish, engine::FinishReason::kLength) << got.error.ToString();
  EXPECT_EQ(got.tokens.size(), 4u);
  EXPECT_EQ(st.decode->metrics().succeeded(), 1u);
  EXPECT_EQ(delivered.size(), 0u);
  // The request ended: its pages are free, only its metadata slot is still fenced.
  EXPECT_TRUE(AllPagesFree(*st.decode));
  EXPECT_EQ(st.decode->metrics().fenced(), 1);
  // The metadata lands after the request's end: delivered, and the slot is free.
  PrefillRequest req = NextRequest(*st.fake);
  PostMetadata(*st.fake, req, src);
  EXPECT_TRUE(WaitUntil([&] { return delivered.size() == 1; }));
  EXPECT_TRUE(WaitUntil([&] { return st.decode->metrics().fenced() == 0; }));
  std::lock_guard<std::mutex> lock(delivered.mu);
  EXPECT_EQ(delivered.by_id[id], Hidden(0.5f));
  EXPECT_EQ(st.decode->metrics().metadata_missing(), 0u);
  EXPECT_EQ(st.decode->metrics().metadata_bad(), 0u);
}

TEST(MessengerMetadataApartTest, AMetadataPostedBeforeTheKvIsDeliveredAndFreesItsSlot) {
  Shape s;
  Delivered delivered;
  auto first = std::make_shared<MetaSource>(MetaSource{Hidden(-2.0f), std::nullopt});
  Harness st = Start(s, &delivered, 20000, 5.0, first);
  if (st.fake == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  int64_t id = -1;
  Outcome got = Generate(*st.decode, PromptOf(10, 2), 3, &id);
  EXPECT_EQ(got.finish, engine::FinishReason::kLength) << got.error.ToString();
  EXPECT_TRUE(WaitUntil([&] { return delivered.size() == 1; }));
  EXPECT_TRUE(AllPagesFree(*st.decode));
  EXPECT_TRUE(WaitUntil([&] { return st.decode->metrics().fenced() == 0; }));
  std::lock_guard<std::mutex> lock(delivered.mu);
  EXPECT_EQ(delivered.by_id[id], Hidden(-2.0f));
  EXPECT_EQ(st.decode->metrics().metadata_missing(), 0u);
}

TEST(MessengerMetadataApartTest, ACanaryMetadataAfterReadyIsCountedAndFailsNothing) {
  Shape s;
  Delivered delivered;
  // "Lands" but leaves the canary: written elsewhere. Registered by the fake: outlives it.
  MetaSource src{Canary(), std::nullopt};
  Harness st = Start(s, &delivered);
  if (st.fake == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  Outcome got = Generate(*st.decode, PromptOf(9, 3), 4);
  EXPECT_EQ(got.finish, engine::FinishReason::kLength) << got.error.ToString();
  PrefillRequest req = NextRequest(*st.fake);
  PostMetadata(*st.fake, req, src);
  EXPECT_TRUE(WaitUntil([&] { return st.decode->metrics().metadata_bad() == 1; }));
  EXPECT_TRUE(WaitUntil([&] { return st.decode->metrics().fenced() == 0; }));
  EXPECT_EQ(delivered.size(), 0u);
  EXPECT_EQ(st.decode->metrics().failed(), 0u);
  EXPECT_EQ(st.decode->metrics().succeeded(), 1u);
  EXPECT_TRUE(AllPagesFree(*st.decode));
  // The slot went back to the free list: the next request gets it and completes.
  Outcome next = Generate(*st.decode, PromptOf(9, 4), 2);
  EXPECT_EQ(next.finish, engine::FinishReason::kLength) << next.error.ToString();
}

// The prefill instance dies after its last KV write, before the metadata: the request completes;
// the slot stays fenced until the deadline + grace (nothing tells the decode side the instance
// stopped), then is freed and the missing metadata counted; every page is free.
TEST(MessengerMetadataApartTest, APrefillKilledBetweenTheLastKvWriteAndTheMetadata) {
  Shape s;
  Delivered delivered;
  Harness st = Start(s, &delivered, /*timeout_ms=*/300, /*fence_grace_s=*/0.2);
  if (st.fake == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  PendingRequest request(*st.decode, PromptOf(9, 5), GreedyParams(4));
  ASSERT_TRUE(request.submitted());
  NextRequest(*st.fake);  // every KV write was posted
  ASSERT_TRUE(WaitUntil([&] { return st.decode->metrics().succeeded() == 1; }));  // and landed
  st.fake.reset();  // killed: the metadata never comes
  const Outcome got = request.Wait(30);
  EXPECT_EQ(got.finish, engine::FinishReason::kLength);
  EXPECT_EQ(got.tokens.size(), 4u);
  EXPECT_TRUE(WaitUntil([&] { return st.decode->metrics().fenced() == 0; }));
  EXPECT_EQ(st.decode->metrics().metadata_missing(), 1u);
  EXPECT_EQ(st.decode->metrics().failed(), 0u);
  EXPECT_EQ(delivered.size(), 0u);
  EXPECT_TRUE(AllPagesFree(*st.decode));
  EXPECT_EQ(st.decode->num_active_transfers(), 0);
}

// Aborted while decoding, before its metadata: the pages are free at once, the slot waits for the
// prefill instance's PrefillDone, which lifts it (the metadata never came: counted).
TEST(MessengerMetadataApartTest, AnAbortBeforeTheMetadataFreesThePagesAndFencesOnlyTheSlot) {
  Shape s;
  Delivered delivered;
  Harness st = Start(s, &delivered);
  if (st.fake == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  engine::SamplingParams p;
  p.max_tokens = 100;
  p.ignore_eos = true;
  PendingRequest request(*st.decode, PromptOf(9, 6), p);
  ASSERT_TRUE(request.submitted());
  ASSERT_TRUE(WaitUntil([&] { return st.decode->metrics().succeeded() == 1; }));  // decoding
  st.decode->Abort(request.id());
  const engine::FinishReason finish = request.Wait(30).finish;
  EXPECT_TRUE(finish == engine::FinishReason::kAbort || finish == engine::FinishReason::kLength);
  EXPECT_TRUE(AllPagesFree(*st.decode));
  EXPECT_EQ(st.decode->metrics().fenced(), 1);
  PrefillRequest req = NextRequest(*st.fake);
  auto dst = transfer::MemoryDescriptor::FromBytes(req.rank_regions[0]);
  ASSERT_TRUE(dst.ok());
  st.fake->Send(dst->fabric_addr, PrefillDone{req.request_id + 1, 0, "", 0});  // not ours
  st.fake->Send(dst->fabric_addr, PrefillDone{req.request_id, 0, "", 0});
  EXPECT_TRUE(WaitUntil([&] { return st.decode->metrics().fenced() == 0; }));
  EXPECT_EQ(st.decode->metrics().metadata_missing(), 1u);
  EXPECT_EQ(delivered.size(), 0u);
  EXPECT_EQ(st.decode->metrics().failed(), 0u);
}

}  // namespace
}  // namespace pd::messenger
