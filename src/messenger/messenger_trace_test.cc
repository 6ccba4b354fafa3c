// --trace end to end inside one process: a traced prefill instance streams KV into a traced
// decode instance over tcp;ofi_rxm (as in messenger_test.cc), and the traces must hold one
// "post writes" event per layer per chunk of each transfer, each after its layer's compute event
// began (causal order, never timing), plus the decode side's request/ready/failure events.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "common/trace.h"
#include "common/trace_summary.h"
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

using testing::Generate;
using testing::kDeadlineS;
using testing::kSecret;
using testing::PromptOf;
using testing::Shape;
using testing::StartDecode;
using testing::StartPrefill;
using testing::WaitUntil;

constexpr int kLayers = testing::kModelLayers;
constexpr int kPageSize = 4;

// The prefill engine's shape: pages of kPageSize tokens, `budget` prefill tokens per step.
Shape TraceShape(int budget) { return Shape{engine::KvLayout::kHND, kPageSize, budget}; }

// Runs one greedy request (a prompt of `len` tokens, 3 new tokens) to its end; returns its error.
Status GenerateStatus(engine::AsyncEngine& engine, int len) {
  return Generate(engine, PromptOf(len, len), 3).error;
}

std::string StrArg(const TraceEvent& e, const std::string& key) {
  for (const TraceArg& a : e.args) {
    if (a.key == key) return std::get<std::string>(a.value);
  }
  return "";
}
int64_t IntArg(const TraceEvent& e, const std::string& key) {
  for (const TraceArg& a : e.args) {
    if (a.key == key) return std::get<int64_t>(a.value);
  }
  return -1;
}
std::vector<TraceEvent> Named(const Tracer& t, const std::string& name) {
  std::vector<TraceEvent> out;
  for (TraceEvent& e : t.Events())
    if (e.name == name) out.push_back(std::move(e));
  return out;
}

// Prompt lengths, the prefill's token budget per step, and the chunks (steps) each prompt takes.
struct Case {
  int len;
  int budget;
  int chunks;
};

class MessengerTraceTest : public ::testing::TestWithParam<Case> {};

TEST_P(MessengerTraceTest, OneCausalPostPerLayerPerChunk) {
  const Case c = GetParam();
  Tracer prefill_trace, decode_trace;
  auto prefill = StartPrefill(TraceShape(c.budget), kSecret, &prefill_trace);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(TraceShape(64), {{"p0", prefill->messenger->fabric_address()}}, 20000,
                            kSecret, {}, &decode_trace);
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  int64_t engine_id = -1;
  ASSERT_TRUE(Generate(*decode, PromptOf(c.len, c.len), 3, &engine_id).error.ok());
  ASSERT_TRUE(WaitUntil([&] { return prefill->messenger->metrics().succeeded() == 1; }));
  ASSERT_TRUE(WaitUntil([&] { return decode->metrics().fenced() == 0; }));  // metadata landed
  prefill->messenger->Stop();
  decode->Shutdown();

  // Prefill side: one request, every layer posted once per chunk, pages adding up to the prompt.
  auto requests = Named(prefill_trace, "prefill request");
  ASSERT_EQ(requests.size(), 1u);
  const std::string id = StrArg(requests[0], "request");
  // The decode side prefills all but the prompt's last token (its first decode step).
  const int pages = (c.len - 1 + kPageSize - 1) / kPageSize;
  EXPECT_EQ(IntArg(requests[0], "pages"), pages);
  std::map<int64_t, int> posts_per_layer, pages_per_layer;
  std::set<int64_t> steps;
  for (const TraceEvent& e : Named(prefill_trace, "post writes")) {
    EXPECT_EQ(StrArg(e, "request"), id);
    posts_per_layer[IntArg(e, "layer")]++;
    pages_per_layer[IntArg(e, "layer")] += static_cast<int>(IntArg(e, "pages"));
    steps.insert(IntArg(e, "step"));
  }
  ASSERT_EQ(posts_per_layer.size(), static_cast<size_t>(kLayers));
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(posts_per_layer[l], c.chunks) << "layer " << l;
    EXPECT_EQ(pages_per_layer[l], pages) << "layer " << l;
  }
  EXPECT_EQ(steps.size(), static_cast<size_t>(c.chunks));
  EXPECT_EQ(Named(prefill_trace, "write layer").size(), static_cast<size_t>(kLayers * c.chunks));
  for (const TraceEvent& e : Named(prefill_trace, "write layer")) EXPECT_EQ(IntArg(e, "ok"), 1);
  EXPECT_EQ(Named(prefill_trace, "post metadata").size(), 1u);
  auto transfers = Named(prefill_trace, "transfer");
  ASSERT_EQ(transfers.size(), 1u);
  EXPECT_EQ(StrArg(transfers[0], "status"), "ok");
  EXPECT_EQ(IntArg(transfers[0], "writes"), kLayers * pages + 1);
  EXPECT_GE(Named(prefill_trace, "step").size(), static_cast<size_t>(c.chunks));

  // Causal: each post began after its step's layer began computing (it waits for the layer's
  // progress bump), read through the file format and the checker.
  auto summary = SummarizePrefillTrace(prefill_trace.ToJson());
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->num_layers, kLayers);
  EXPECT_EQ(summary->rows.size(), static_cast<size_t>(kLayers * c.chunks));
  EXPECT_EQ(summary->num_posts_without_compute, 0);
  EXPECT_EQ(summary->num_posts_before_compute_began, 0);
  EXPECT_EQ(summary->num_with_next, (kLayers - 1) * c.chunks);
  for (const TraceLayerRow& r : summary->rows) EXPECT_GE(r.posted_us, r.compute_begin_us);

  // Decode side: the request went out once and its KV arrived.
  auto sent = Named(decode_trace, "prefill request sent");
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(StrArg(sent[0], "request"), id);
  EXPECT_EQ(IntArg(sent[0], "engine_request"), engine_id);         // as the HTTP instants name it
  EXPECT_EQ(IntArg(sent[0], "expected_writes"), kLayers * pages);  // the metadata counts apart
  EXPECT_EQ(Named(decode_trace, "kv transfer").size(), 1u);
  EXPECT_EQ(Named(decode_trace, "kv ready").size(), 1u);
  auto landed = Named(decode_trace, "metadata landed");
  ASSERT_EQ(landed.size(), 1u);
  EXPECT_EQ(IntArg(landed[0], "canary"), 0);
  EXPECT_TRUE(Named(decode_trace, "transfer failed").empty());
}

INSTANTIATE_TEST_SUITE_P(Prompts, MessengerTraceTest,
                         ::testing::Values(Case{13, 64, 1},   // whole prefill of 12 tokens: 3 pages
                                           Case{16, 64, 1},   // 15 tokens: partial last page
                                           Case{20, 8, 3}));  // chunked: 8 + 8 + 3 tokens

TEST(MessengerTraceFailureTest, AStoppedPrefillTracesTheFailedAttemptAndTheFailure) {
  Tracer decode_trace;
  auto prefill = StartPrefill(TraceShape(64));
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(TraceShape(64), {{"p0", prefill->messenger->fabric_address()}}, 300,
                            kSecret, {}, &decode_trace);
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  prefill->messenger->Stop();  // the domain stays open, nobody answers: the attempt times out
  Status s = GenerateStatus(*decode, 9);
  EXPECT_FALSE(s.ok());
  decode->Shutdown();
  ASSERT_EQ(Named(decode_trace, "prefill request sent").size(), 1u);
  auto attempt = Named(decode_trace, "attempt failed");
  ASSERT_EQ(attempt.size(), 1u);
  EXPECT_EQ(StrArg(attempt[0], "peer"), "p0");
  auto failed = Named(decode_trace, "transfer failed");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(IntArg(failed[0], "attempts"), 1);
  EXPECT_FALSE(StrArg(failed[0], "error").empty());
  EXPECT_TRUE(Named(decode_trace, "kv ready").empty());
}

}  // namespace
}  // namespace pd::messenger
