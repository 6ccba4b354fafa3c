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
#include "messenger/prefill_side.h"
#include "transfer/test_util.h"

namespace pd::messenger {
namespace {

constexpr double kDeadlineS = 30.0;
constexpr int kLayers = 3;
constexpr int kPageSize = 4;
const char kSecret[] = "trace-secret";

bool WaitUntil(const std::function<bool()>& pred) {
  const double end = NowSeconds() + kDeadlineS;
  while (!pred()) {
    if (NowSeconds() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

const engine::testing::TinyModel& Model() {
  static auto* model = [] {
    engine::testing::TinyModelOptions o;
    o.layers = kLayers;
    return engine::testing::MakeTinyModel(o).release();
  }();
  return *model;
}

std::unique_ptr<engine::Engine> MakeEngine(int budget, Tracer* tracer) {
  engine::EngineOptions o;
  o.runner.kv.page_size = kPageSize;
  o.runner.num_pages = 48;
  o.runner.num_threads = 1;
  o.runner.tracer = tracer;
  o.scheduler.max_num_batched_tokens = budget;
  o.scheduler.max_num_seqs = 8;
  o.scheduler.max_model_len = 128;
  auto e = engine::Engine::Create(Model().weights, o);
  PD_CHECK(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

std::unique_ptr<engine::AsyncEngine> Async(std::unique_ptr<engine::Engine> e) {
  auto a = engine::AsyncEngine::Create(std::move(e), {});
  PD_CHECK(a.ok());
  return std::move(a).value();
}

struct Prefill {
  std::unique_ptr<PrefillMessenger> messenger;
  std::unique_ptr<engine::AsyncEngine> engine;
  ~Prefill() {
    if (messenger) messenger->Stop();
    if (engine) engine->Shutdown();
  }
};

std::unique_ptr<Prefill> StartPrefill(int budget, Tracer* tracer) {
  auto e = MakeEngine(budget, tracer);
  PrefillMessengerOptions o;
  o.cluster_secret = kSecret;
  o.model_hash = ModelFingerprint(Model().weights);
  o.domain = transfer::testing::LoopbackOptions();
  o.tracer = tracer;
  auto m = PrefillMessenger::Create(o, e->runner());
  if (!m.ok()) return nullptr;
  e->SetStepObserver((*m)->step_observer());
  auto p = std::make_unique<Prefill>();
  p->messenger = std::move(m).value();
  p->engine = Async(std::move(e));
  p->messenger->Start(p->engine.get());
  return p;
}

std::unique_ptr<DecodeMessenger> StartDecode(const std::string& prefill_address, Tracer* tracer,
                                             uint32_t timeout_ms = 20000) {
  auto e = MakeEngine(64, nullptr);
  engine::ModelRunner& runner = e->runner();
  DecodeMessengerOptions o;
  o.cluster_secret = kSecret;
  o.model_hash = ModelFingerprint(Model().weights);
  o.domain = transfer::testing::LoopbackOptions();
  o.peers = {{"p0", prefill_address}};
  o.transfer_timeout_ms = timeout_ms;
  o.hello_retry_s = 0.05;
  o.tracer = tracer;
  auto d = DecodeMessenger::Create(o, runner, Async(std::move(e)));
  PD_CHECK(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

// Runs one greedy request to its end; returns its final output's error.
Status Generate(engine::AsyncEngine& engine, int len) {
  std::vector<int32_t> prompt(len);
  for (int i = 0; i < len; ++i) prompt[i] = (i * 13 + len * 7 + 3) % 67;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status error;
  engine::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 3;
  p.ignore_eos = true;
  auto id = engine.Submit(prompt, p, [&](const engine::RequestOutput& out) {
    if (!out.finished()) return;
    std::lock_guard<std::mutex> lock(mu);
    error = out.error;
    done = true;
    cv.notify_all();
  });
  if (!id.ok()) return id.status();
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_for(lock, std::chrono::duration<double>(kDeadlineS), [&] { return done; })) {
    return DeadlineExceeded("request did not finish");
  }
  return error;
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
  auto prefill = StartPrefill(c.budget, &prefill_trace);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(prefill->messenger->fabric_address(), &decode_trace);
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  ASSERT_TRUE(Generate(*decode, c.len).ok());
  ASSERT_TRUE(WaitUntil([&] { return prefill->messenger->metrics().succeeded() == 1; }));
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
  EXPECT_EQ(IntArg(sent[0], "expected_writes"), kLayers * pages + 1);
  EXPECT_EQ(Named(decode_trace, "kv transfer").size(), 1u);
  EXPECT_EQ(Named(decode_trace, "kv ready").size(), 1u);
  EXPECT_TRUE(Named(decode_trace, "transfer failed").empty());
}

INSTANTIATE_TEST_SUITE_P(Prompts, MessengerTraceTest,
                         ::testing::Values(Case{13, 64, 1},   // whole prefill of 12 tokens: 3 pages
                                           Case{16, 64, 1},   // 15 tokens: partial last page
                                           Case{20, 8, 3}));  // chunked: 8 + 8 + 3 tokens

TEST(MessengerTraceFailureTest, AStoppedPrefillTracesTheFailedAttemptAndTheFailure) {
  Tracer decode_trace;
  auto prefill = StartPrefill(64, nullptr);
  if (prefill == nullptr) GTEST_SKIP() << "libfabric tcp;ofi_rxm unavailable";
  auto decode = StartDecode(prefill->messenger->fabric_address(), &decode_trace, 300);
  ASSERT_TRUE(decode->WaitForPeers(kDeadlineS).ok());
  prefill->messenger->Stop();  // the domain stays open, nobody answers: the attempt times out
  Status s = Generate(*decode, 9);
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
