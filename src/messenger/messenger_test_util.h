// Set-up shared by the in-process messenger tests (header-only so it is not part of
// pd_messenger): a tiny random model, engines over it, a prefill instance (messenger + engine)
// and a decode messenger on loopback libfabric domains (tcp;ofi_rxm), and greedy requests run to
// their end.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/mutex.h"
#include "common/trace.h"
#include "engine/async_engine.h"
#include "engine/engine.h"
#include "engine/model_runner_test_util.h"
#include "messenger/channel.h"
#include "messenger/decode_side.h"
#include "messenger/handshake.h"
#include "messenger/prefill_side.h"
#include "transfer/test_util.h"

namespace pd::messenger::testing {

inline constexpr double kDeadlineS = 30.0;
inline constexpr int kModelLayers = 3;
inline constexpr char kSecret[] = "test-secret";

// Polls `pred` until it holds or the deadline passes (for state another thread updates).
inline bool WaitUntil(const std::function<bool()>& pred, double timeout_s = kDeadlineS) {
  const double end = NowSeconds() + timeout_s;
  while (!pred()) {
    if (NowSeconds() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The KV cache's shape and the prefill token budget of an engine.
struct Shape {
  engine::KvLayout layout = engine::KvLayout::kHND;
  int page_size = 4;
  int budget = 64;  // prefill tokens per step: small values chunk the prompt
};

// The tiny random model every engine of a test binary serves (kModelLayers layers).
inline const engine::testing::TinyModel& Model() {
  static auto* model = [] {
    engine::testing::TinyModelOptions o;
    o.layers = kModelLayers;
    return engine::testing::MakeTinyModel(o).release();
  }();
  return *model;
}

inline uint64_t Hash() { return ModelFingerprint(Model().weights); }

// An engine of 48 pages on one thread; `tracer` (may be null) traces its model runner.
inline std::unique_ptr<engine::Engine> MakeEngine(const Shape& s, Tracer* tracer = nullptr) {
  engine::EngineOptions o;
  o.runner.kv.page_size = s.page_size;
  o.runner.kv.layout = s.layout;
  o.runner.num_pages = 48;
  o.runner.num_threads = 1;
  o.runner.tracer = tracer;
  o.scheduler.max_num_batched_tokens = s.budget;
  o.scheduler.max_num_seqs = std::min(8, s.budget);
  o.scheduler.max_model_len = 128;
  auto e = engine::Engine::Create(Model().weights, o);
  PD_CHECK(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

inline std::unique_ptr<engine::AsyncEngine> Async(std::unique_ptr<engine::Engine> e) {
  auto a = engine::AsyncEngine::Create(std::move(e), {});
  PD_CHECK(a.ok());
  return std::move(a).value();
}

// Torn down as a server must: the messenger stops (its domain closes), the engine stops, then
// the messenger goes before the engine that owns the KV region it had registered.
struct PrefillInstance {
  std::unique_ptr<PrefillMessenger> messenger;
  std::unique_ptr<engine::AsyncEngine> engine;
  ~PrefillInstance() {
    if (messenger) messenger->Stop();
    if (engine) engine->Shutdown();
    messenger.reset();
    engine.reset();
  }
};

// A started prefill instance ("prefill"), or null when the fabric provider is absent (any other
// Create error also adds a test failure).
// `tracer` (may be null) traces both its engine and its messenger.
// A prefill messenger over `e`, observing its steps, started on its async engine (null when
// the fabric is unavailable).
inline std::unique_ptr<PrefillInstance> LaunchPrefill(std::unique_ptr<engine::Engine> e,
                                                      const PrefillMessengerOptions& o) {
  auto m = PrefillMessenger::Create(o, e->runner());
  if (!m.ok()) {  // null only where the provider is absent (the caller skips): else a failure
    if (!transfer::testing::ProviderAbsent(m.status())) {
      ADD_FAILURE() << "PrefillMessenger::Create: " << m.status().ToString();
    }
    return nullptr;
  }
  PD_CHECK(e->disagg_hooks() != nullptr);
  e->disagg_hooks()->SetStepObserver((*m)->step_observer());
  auto p = std::make_unique<PrefillInstance>();
  p->messenger = std::move(m).value();
  p->engine = Async(std::move(e));
  p->messenger->Start(p->engine.get());
  return p;
}

// The options every test's prefill messenger starts from: the test secret, the tiny model's
// fingerprint, a loopback domain.
inline PrefillMessengerOptions BasePrefillOptions(std::string secret = kSecret) {
  PrefillMessengerOptions o;
  o.instance_name = "prefill";
  o.cluster_secret = std::move(secret);
  o.model_hash = Hash();
  o.domain = transfer::testing::LoopbackOptions();
  return o;
}

// The same for a decode messenger greeting `peers` (quickly re-greeted while they do not answer).
inline DecodeMessengerOptions BaseDecodeOptions(std::vector<PrefillPeer> peers,
                                                std::string secret = kSecret) {
  DecodeMessengerOptions o;
  o.cluster_secret = std::move(secret);
  o.model_hash = Hash();
  o.domain = transfer::testing::LoopbackOptions();
  o.peers = std::move(peers);
  o.hello_retry_s = 0.05;
  return o;
}

inline std::unique_ptr<PrefillInstance> StartPrefill(const Shape& s, std::string secret = kSecret,
                                                     Tracer* tracer = nullptr) {
  PrefillMessengerOptions o = BasePrefillOptions(std::move(secret));
  o.tracer = tracer;
  return LaunchPrefill(MakeEngine(s, tracer), o);
}

// A decode messenger over an untraced engine; `tracer` (may be null) traces the messenger.
inline std::unique_ptr<DecodeMessenger> StartDecode(
    const Shape& s, std::vector<PrefillPeer> peers, uint32_t timeout_ms = 20000,
    std::string secret = kSecret,
    std::function<void(int64_t, const std::vector<float>&)> on_metadata = {},
    Tracer* tracer = nullptr, double fence_grace_s = 5.0) {
  auto e = MakeEngine(s);
  engine::ModelRunner& runner = e->runner();
  DecodeMessengerOptions o = BaseDecodeOptions(std::move(peers), std::move(secret));
  o.transfer_timeout_ms = timeout_ms;
  o.on_metadata = std::move(on_metadata);
  o.tracer = tracer;
  o.fence_grace_s = fence_grace_s;
  auto d = DecodeMessenger::Create(o, runner, Async(std::move(e)));
  PD_CHECK(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

inline std::vector<int32_t> PromptOf(int len, int salt) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = (i * 13 + salt * 7 + 3) % 67;
  return p;
}

struct Outcome {
  std::vector<int32_t> tokens;
  engine::FinishReason finish = engine::FinishReason::kNone;
  Status error;
};

// A request submitted through any AsyncEngine, its outputs collected until it ends: a test can act
// on it between Submit and Wait (a refused Submit ends it at once, with kError). One that has not
// ended when its PendingRequest goes (a test that failed waiting for it) is aborted, and its late
// outputs land in state the callback shares, never in freed memory.
class PendingRequest {
 public:
  PendingRequest(engine::AsyncEngine& engine, const std::vector<int32_t>& prompt,
                 const engine::SamplingParams& params)
      : engine_(engine), state_(std::make_shared<State>()) {
    auto id = engine.Submit(prompt, params, [state = state_](const engine::RequestOutput& out) {
      MutexLock lock(&state->mu);
      state->outcome.tokens.insert(state->outcome.tokens.end(), out.new_token_ids.begin(),
                                   out.new_token_ids.end());
      if (out.finished()) {
        state->outcome.finish = out.finish_reason;
        state->outcome.error = out.error;
        state->done = true;
        state->cv.SignalAll();
      }
    });
    if (id.ok()) {
      id_ = *id;
    } else {
      MutexLock lock(&state_->mu);
      state_->outcome.finish = engine::FinishReason::kError;
      state_->outcome.error = id.status();
      state_->done = true;
    }
  }
  ~PendingRequest() {
    bool done;
    {
      MutexLock lock(&state_->mu);
      done = state_->done;
    }
    if (!done) engine_.Abort(id_);
  }
  PendingRequest(const PendingRequest&) = delete;
  PendingRequest& operator=(const PendingRequest&) = delete;

  bool submitted() const { return id_ >= 0; }
  int64_t id() const { return id_; }

  // The outcome once the request has ended (a test failure if it has not after `timeout_s`).
  Outcome Wait(double timeout_s = kDeadlineS) {
    State* state = state_.get();
    MutexLock lock(&state->mu);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::ceil<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(timeout_s));
    while (!state->done) {
      if (!state->cv.WaitUntil(&state->mu, deadline)) break;
    }
    EXPECT_TRUE(state->done) << "request did not finish";
    return state->outcome;
  }

 private:
  struct State {
    Mutex mu;
    CondVar cv;
    Outcome outcome GUARDED_BY(mu);
    bool done GUARDED_BY(mu) = false;
  };
  engine::AsyncEngine& engine_;
  std::shared_ptr<State> state_;
  int64_t id_ = -1;
};

// Greedy sampling of `max_tokens` tokens, EOS ignored.
inline engine::SamplingParams GreedyParams(int max_tokens) {
  engine::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// Runs one greedy request to its end through any AsyncEngine (a test failure if it has not ended
// after `timeout_s`).
inline Outcome Generate(engine::AsyncEngine& engine, const std::vector<int32_t>& prompt,
                        int max_tokens, int64_t* id_out = nullptr, double timeout_s = kDeadlineS) {
  PendingRequest request(engine, prompt, GreedyParams(max_tokens));
  if (id_out != nullptr && request.submitted()) *id_out = request.id();
  return request.Wait(timeout_s);
}

inline bool AllPagesFree(const engine::AsyncEngine& e, double timeout_s = kDeadlineS) {
  return WaitUntil(
      [&] {
        auto s = e.stats();
        return s.num_free_pages == s.num_total_pages && s.num_awaiting_kv == 0;
      },
      timeout_s);
}

// A bare domain speaking the wire protocol, scripted by the test. Its own thread handles what
// arrives (domain callbacks must not block). It learns each peer's session from its Hello or
// HelloReply and addresses its frames to it; a Hello it sends names its recipient.
class FakePeer {
 public:
  using Handler = std::function<void(FakePeer&, const Frame&)>;
  static std::unique_ptr<FakePeer> Create(Handler handler) {
    auto p = std::unique_ptr<FakePeer>(new FakePeer());
    p->handler_ = std::move(handler);
    transfer::DomainOptions o = transfer::testing::LoopbackOptions();
    o.message_bytes = 256u << 10;
    FakePeer* raw = p.get();
    o.on_message = [raw](std::string_view m) {
      raw->queue_.Post([raw, bytes = std::string(m)] {
        auto f = raw->codec_.Decode(bytes);
        if (!f.ok() || !raw->codec_.CheckRecipient(*f).ok()) return;
        raw->Learn(*f);
        raw->handler_(*raw, *f);
      });
    };
    auto d = transfer::Domain::Create(o);
    if (!d.ok()) {  // null only where the provider is absent (the caller skips): else a failure
      if (!transfer::testing::ProviderAbsent(d.status())) {
        ADD_FAILURE() << "FakePeer: Domain::Create: " << d.status().ToString();
      }
      return nullptr;
    }
    p->domain_ = std::move(d).value();
    p->thread_ = std::thread([raw] {
      while (raw->queue_.RunFor(std::chrono::milliseconds(20))) {
      }
    });
    return p;
  }
  ~FakePeer() {
    queue_.Stop();
    thread_.join();
  }
  const std::string& address() const { return domain_->info().address; }
  void Send(const std::string& to, Message m) {
    auto peer = domain_->AddPeer(to);
    ASSERT_TRUE(peer.ok());
    if (auto* hello = std::get_if<Hello>(&m)) hello->recipient_address = to;
    ASSERT_TRUE(domain_->SubmitSend(*peer, codec_.Encode(m, SessionOf(to)), nullptr).ok());
  }
  uint64_t SessionOf(const std::string& address) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = sessions_.find(address);
    return it == sessions_.end() ? 0 : it->second;
  }
  transfer::Domain& domain() { return *domain_; }
  void Record(const Frame& f) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    received_.push_back(f);
    cv_.SignalAll();
  }
  // Waits for the next recorded frame.
  std::optional<Frame> Next() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (received_.empty()) {
      if (!cv_.WaitUntil(&mu_, deadline)) break;
    }
    if (received_.empty()) return std::nullopt;
    Frame f = received_.front();
    received_.pop_front();
    return f;
  }
  int num_requests = 0;  // PrefillRequests seen (handler thread)

 private:
  void Learn(const Frame& f) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (auto* hello = std::get_if<Hello>(&f.message))
      sessions_[hello->fabric_address] = f.sender_session;
    if (auto* reply = std::get_if<HelloReply>(&f.message)) {
      sessions_[reply->fabric_address] = f.sender_session;
    }
  }
  FakePeer() : codec_(kSecret) {}
  FrameCodec codec_;
  TaskQueue queue_;
  Handler handler_;
  std::unique_ptr<transfer::Domain> domain_;
  std::thread thread_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Frame> received_ GUARDED_BY(mu_);
  std::map<std::string, uint64_t> sessions_ GUARDED_BY(mu_);  // by fabric address
};

}  // namespace pd::messenger::testing
