#include "messenger/decode_side.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_map>
#include <utility>

#include "common/log.h"
#include "common/thread_util.h"
#include "messenger/channel.h"
#include "messenger/handshake.h"

namespace pd::messenger {
namespace {

// Shared by a request's engine callbacks and the messenger thread.
struct RequestInfo {
  std::vector<int32_t> prefill_tokens;  // the prompt without its last token
  std::mutex mu;
  Status failure;  // GUARDED_BY(mu): set before the messenger aborts the request
};

struct Req {
  int64_t id = 0;
  uint64_t wire_id = 0;  // the current attempt's (each attempt has its own)
  std::shared_ptr<RequestInfo> info;
  std::vector<int32_t> pages;  // the reserved page table (whole prompt)
  bool holding = false;        // the messenger's own reference on `pages` (RetainPages)
  bool done_received = false;  // the current attempt's PrefillDone (ok) arrived
  int attempts = 0;
  std::vector<int> tried;  // peer indices
  bool in_flight = false;
  int peer = -1;
  uint32_t imm = 0;
  int meta_slot = -1;
  double start = 0.0;
  double deadline = 0.0;
  int64_t attempt_ns = 0;  // when the current attempt's PrefillRequest went out (trace only)
};

struct Peer {
  PrefillPeer config;
  transfer::PeerAddr addr;
  bool have_addr = false;
  PeerStatus::State state = PeerStatus::State::kWaiting;
  std::string reason;
  ShardScheme scheme;
  int outstanding = 0;
  double last_hello = -1e9;
  double hello_interval = 0.0;  // grows while the peer is down
};

struct PendingSend {
  int peer = -1;
  double deadline = 0.0;
};

// An attempt that ended while its prefill instance may still write: its pages (a reference of
// their own) and metadata slot stay out of use until that instance answers PrefillDone (it does so
// once every write it posted has completed), is found unreachable, or the deadline passes.
struct Fence {
  int peer = -1;
  int meta_slot = -1;
  std::vector<int32_t> pages;  // empty: no page reference held
  double deadline = 0.0;
};

bool Retryable(StatusCode code) {
  return code != StatusCode::kInvalidArgument && code != StatusCode::kOutOfRange &&
         code != StatusCode::kFailedPrecondition && code != StatusCode::kUnimplemented;
}

}  // namespace

class DecodeMessenger::Impl {
 public:
  Impl(DecodeMessenger* owner, const DecodeMessengerOptions& options, engine::ModelRunner& runner)
      : owner_(owner),
        options_(options),
        spec_(runner.region().spec()),
        runner_(runner),
        meta_bytes_(static_cast<uint32_t>(runner.config().hidden_size) * 4),
        format_(MakeKvFormat(options.model_hash, spec_)),
        scheme_(MakeShardScheme(runner.config(), runner.num_ranks())),
        codec_(options.cluster_secret),
        queue_(std::make_shared<TaskQueue>()) {
    std::random_device rd;
    wire_prefix_ = (static_cast<uint64_t>(rd()) << 32);
    next_imm_ = rd() | 1u;
    for (const PrefillPeer& p : options.peers) {
      Peer peer;
      peer.config = p;
      peers_.push_back(std::move(peer));
    }
  }

  Status Init();
  void Stop();
  Status WaitForPeers(double timeout_s);
  std::vector<PeerStatus> Peers() const;
  Result<int64_t> Submit(std::vector<int32_t> prompt, const engine::SamplingParams& sampling,
                         engine::OutputCallback on_output);
  const std::string& address() const { return domain_->info().address; }

 private:
  void Loop();
  void Greet();
  void OnMessage(const std::string& bytes);
  void OnHelloReply(const HelloReply& reply, uint64_t seq);
  void OnPrefillDone(const PrefillDone& done, uint64_t seq);
  void OnReserved(int64_t id, std::vector<int32_t> pages, std::shared_ptr<RequestInfo> info);
  void StartAttempt(Req* r, const Status& last_error);
  void OnKvArrived(int64_t id, uint32_t imm);
  void FailAttempt(Req* r, const Status& status);
  // Ends the current attempt; with `fence` its pages and metadata slot wait in fences_ for the
  // prefill instance to stop writing, else the slot is free at once.
  void EndAttempt(Req* r, bool fence);
  void ReleaseHold(Req* r);
  void ReleaseFence(uint64_t wire_id);
  void Fail(Req* r, const Status& status);
  void OnEnded(int64_t id);
  void CheckDeadlines();
  int PickPeer(const Req& r) const;
  Req* Find(int64_t id);
  void UpdateActive();
  // Sends a control message to peers_[peer]; `on_fail` (messenger thread) runs if it fails or
  // misses send_timeout_s, after which the peer is marked down.
  void Send(int peer, const Message& m);
  void OnSendDone(transfer::TransferId id, const Status& status);
  void MarkDown(int peer, const Status& why);

  DecodeMessenger* const owner_;
  const DecodeMessengerOptions options_;
  const engine::KvCacheSpec spec_;
  engine::ModelRunner& runner_;
  const uint32_t meta_bytes_;
  const KvFormat format_;
  const ShardScheme scheme_;
  FrameCodec codec_;
  std::shared_ptr<TaskQueue> queue_;
  std::unique_ptr<transfer::Domain> domain_;
  std::vector<transfer::MemoryRegion> kv_mrs_;  // per rank, all in the one domain
  transfer::MemoryRegion meta_mr_;
  std::vector<uint8_t> meta_buffer_;  // (kMetaSlots, meta_bytes): where prefill writes metadata
  std::thread thread_;
  std::atomic<bool> stopped_{false};
  uint64_t wire_prefix_ = 0;

  mutable std::mutex peers_mu_;  // peers_ is read by WaitForPeers / Peers / Submit
  std::condition_variable peers_cv_;
  std::vector<Peer> peers_;  // GUARDED_BY(peers_mu_) for readers; written on the messenger thread

  // Messenger thread only.
  ReplayGuard replay_;
  std::unordered_map<int64_t, std::unique_ptr<Req>> reqs_;
  std::unordered_map<uint64_t, int64_t> by_wire_;
  std::unordered_map<transfer::TransferId, PendingSend> sends_;
  std::vector<int> free_meta_slots_;
  std::unordered_map<uint64_t, Fence> fences_;  // by attempt wire id
  uint32_t next_imm_ = 1;
  uint32_t next_wire_ = 1;

  static constexpr int kMetaSlots = 1024;
};

Status DecodeMessenger::Impl::Init() {
  ASSIGN_OR_RETURN(domain_, OpenMessengerDomain(options_.domain, queue_,
                                                [this](const std::string& m) { OnMessage(m); }));
  ASSIGN_OR_RETURN(kv_mrs_, RegisterRankRegions(*domain_, runner_));
  PD_LOG_INFO("decode messenger: {} rank KV region(s) registered (tp_size {}, {} KV heads)",
              kv_mrs_.size(), scheme_.tp_size, scheme_.num_kv_heads);
  meta_buffer_.assign(size_t{kMetaSlots} * meta_bytes_, 0);
  ASSIGN_OR_RETURN(meta_mr_, domain_->RegisterMemory(meta_buffer_.data(), meta_buffer_.size()));
  for (int i = kMetaSlots - 1; i >= 0; --i) free_meta_slots_.push_back(i);
  thread_ = std::thread([this] { Loop(); });
  return OkStatus();
}

void DecodeMessenger::Impl::Loop() {
  SetCurrentThreadName("pd-decode-kv");
  if (options_.tracer != nullptr) options_.tracer->SetThreadName("decode messenger");
  do {
    Greet();
    CheckDeadlines();
  } while (queue_->RunFor(std::chrono::milliseconds(20)));
}

void DecodeMessenger::Impl::Stop() {
  if (stopped_.exchange(true)) return;
  queue_->Stop();
  if (thread_.joinable()) thread_.join();
  for (auto& [id, r] : reqs_) {
    if (!r->in_flight) continue;
    domain_->imm_counters().Remove(r->imm);
    if (peers_[r->peer].state == PeerStatus::State::kAccepted) {
      (void)domain_->SubmitSend(peers_[r->peer].addr, codec_.Encode(Cancel{r->wire_id}), nullptr);
    }
  }
  for (auto& [id, r] : reqs_) ReleaseHold(r.get());
  for (auto& [wire, f] : fences_) {
    if (!f.pages.empty()) owner_->inner_->ReleasePages(std::move(f.pages));
  }
  fences_.clear();
  reqs_.clear();
}

// ------------------------------------------------------------------ peers

void DecodeMessenger::Impl::Greet() {
  const double now = NowSeconds();
  for (size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    const bool down = p.state == PeerStatus::State::kDown;
    if ((p.state != PeerStatus::State::kWaiting && !down) ||
        now - p.last_hello < std::max(options_.hello_retry_s, p.hello_interval)) {
      continue;
    }
    p.last_hello = now;
    if (!p.have_addr) {
      auto addr = domain_->AddPeer(p.config.fabric_address);
      if (!addr.ok()) {
        PD_LOG_WARN("decode messenger: prefill peer {}: {}", p.config.name,
                    addr.status().ToString());
        continue;
      }
      std::lock_guard<std::mutex> lock(peers_mu_);
      p.addr = *addr;
      p.have_addr = true;
    }
    Hello hello;
    hello.instance_name = options_.instance_name;
    hello.format = format_;
    hello.scheme = scheme_;
    hello.fabric_address = address();
    Send(static_cast<int>(i), hello);
  }
}

void DecodeMessenger::Impl::Send(int peer, const Message& m) {
  std::weak_ptr<TaskQueue> weak = queue_;
  auto slot = std::make_shared<transfer::TransferId>(0);
  auto id =
      domain_->SubmitSend(peers_[peer].addr, codec_.Encode(m), [this, weak, slot](const Status& s) {
        if (auto q = weak.lock()) {
          q->Post([this, slot, s] { OnSendDone(*slot, s); });
        }
      });
  if (!id.ok()) {
    MarkDown(peer, id.status());
    return;
  }
  *slot = *id;
  sends_[*id] = {peer, NowSeconds() + options_.send_timeout_s};
}

void DecodeMessenger::Impl::OnSendDone(transfer::TransferId id, const Status& status) {
  auto it = sends_.find(id);
  if (it == sends_.end()) return;  // timed out and handled already
  const int peer = it->second.peer;
  sends_.erase(it);
  if (!status.ok()) MarkDown(peer, status);
}

// The peer cannot be reached: fail its transfers now (they retry elsewhere) and greet it again
// with back-off.
void DecodeMessenger::Impl::MarkDown(int peer, const Status& why) {
  Peer& p = peers_[peer];
  if (p.state == PeerStatus::State::kRefused) return;
  if (p.state != PeerStatus::State::kDown) {
    PD_LOG_WARN("decode messenger: prefill instance {} is unreachable: {}", p.config.name,
                why.ToString());
  }
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    if (p.state == PeerStatus::State::kAccepted || p.state == PeerStatus::State::kDown) {
      p.state = PeerStatus::State::kDown;
    }
    p.hello_interval = std::min(30.0, std::max(2.0, 2 * p.hello_interval));
  }
  peers_cv_.notify_all();
  std::vector<Req*> affected;
  for (auto& [id, r] : reqs_) {
    if (r->in_flight && r->peer == peer) affected.push_back(r.get());
  }
  for (Req* r : affected) {
    FailAttempt(r, Unavailable("prefill instance " + p.config.name + " is unreachable (" +
                               why.message() + ")"));
  }
  // An unreachable instance cannot write any more (its connection is gone).
  std::vector<uint64_t> released;
  for (const auto& [wire, f] : fences_) {
    if (f.peer == peer) released.push_back(wire);
  }
  for (uint64_t wire : released) ReleaseFence(wire);
}

void DecodeMessenger::Impl::OnMessage(const std::string& bytes) {
  auto frame = codec_.Decode(bytes);
  if (!frame.ok()) {
    PD_LOG_WARN("decode messenger: dropped a control message: {}", frame.status().ToString());
    return;
  }
  if (auto* reply = std::get_if<HelloReply>(&frame->message)) {
    OnHelloReply(*reply, frame->sender_seq);
  } else if (auto* done = std::get_if<PrefillDone>(&frame->message)) {
    OnPrefillDone(*done, frame->sender_seq);
  } else {
    PD_LOG_WARN("decode messenger: unexpected message type {}", frame->message.index() + 1);
  }
}

void DecodeMessenger::Impl::OnHelloReply(const HelloReply& reply, uint64_t seq) {
  auto it = std::find_if(peers_.begin(), peers_.end(), [&](const Peer& p) {
    return p.config.fabric_address == reply.fabric_address;
  });
  if (it == peers_.end()) {
    PD_LOG_WARN("decode messenger: HelloReply from unknown instance '{}'", reply.instance_name);
    return;
  }
  if (Status s = replay_.Check(reply.fabric_address, seq); !s.ok()) return;
  std::string reason;
  if (!reply.accepted) {
    reason = "prefill instance " + it->config.name + " refused the handshake: " + reply.reason;
  } else if (Status ok = CheckCompatible(format_, reply.format); !ok.ok()) {
    reason = "prefill instance " + it->config.name + ": " + ok.message();
  } else if (Status plan = PlanTransfer(reply.scheme, scheme_, format_, 0).status(); !plan.ok()) {
    reason = "prefill instance " + it->config.name + ": " + plan.message();
  }
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    if (it->state == PeerStatus::State::kWaiting || it->state == PeerStatus::State::kDown) {
      it->state = reason.empty() ? PeerStatus::State::kAccepted : PeerStatus::State::kRefused;
      it->hello_interval = 0.0;
      it->reason = reason;
      it->scheme = reply.scheme;
    }
  }
  peers_cv_.notify_all();
  if (reason.empty()) {
    PD_LOG_INFO("decode messenger: prefill instance {} ('{}') accepted us", it->config.name,
                reply.instance_name);
  } else {
    PD_LOG_ERROR("decode messenger: {}", reason);
  }
}

Status DecodeMessenger::Impl::WaitForPeers(double timeout_s) {
  std::unique_lock<std::mutex> lock(peers_mu_);
  auto all_answered = [&] {
    return std::none_of(peers_.begin(), peers_.end(),
                        [](const Peer& p) { return p.state == PeerStatus::State::kWaiting; });
  };
  peers_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), all_answered);
  std::string refusals, silent;
  int accepted = 0;
  for (const Peer& p : peers_) {
    if (p.state == PeerStatus::State::kAccepted) ++accepted;
    if (p.state == PeerStatus::State::kRefused)
      refusals += (refusals.empty() ? "" : "; ") + p.reason;
    if (p.state == PeerStatus::State::kDown) {
      silent += (silent.empty() ? "" : ", ") + p.config.name + " (unreachable)";
    }
    if (p.state == PeerStatus::State::kWaiting)
      silent += (silent.empty() ? "" : ", ") + p.config.name;
  }
  if (!refusals.empty()) return FailedPrecondition(refusals);
  if (accepted == 0) {
    return Unavailable("no prefill instance answered the handshake within " +
                       std::to_string(timeout_s) + " s (" + silent +
                       "): not running, unreachable, or a different cluster secret");
  }
  if (!silent.empty()) PD_LOG_WARN("decode messenger: no answer yet from {}", silent);
  return OkStatus();
}

std::vector<PeerStatus> DecodeMessenger::Impl::Peers() const {
  std::lock_guard<std::mutex> lock(peers_mu_);
  std::vector<PeerStatus> out;
  for (const Peer& p : peers_) out.push_back({p.config.name, p.state, p.reason, p.outstanding});
  return out;
}

int DecodeMessenger::Impl::PickPeer(const Req& r) const {
  int best = -1;
  for (size_t i = 0; i < peers_.size(); ++i) {
    const Peer& p = peers_[i];
    if (p.state != PeerStatus::State::kAccepted) continue;
    if (std::find(r.tried.begin(), r.tried.end(), static_cast<int>(i)) != r.tried.end()) continue;
    if (best < 0 || p.outstanding < peers_[best].outstanding) best = static_cast<int>(i);
  }
  return best;
}

// ------------------------------------------------------------------ requests

Result<int64_t> DecodeMessenger::Impl::Submit(std::vector<int32_t> prompt,
                                              const engine::SamplingParams& sampling,
                                              engine::OutputCallback on_output) {
  engine::AsyncEngine& inner = *owner_->inner_;
  if (prompt.size() < 2) return inner.Submit(std::move(prompt), sampling, std::move(on_output));
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    if (std::none_of(peers_.begin(), peers_.end(),
                     [](const Peer& p) { return p.state == PeerStatus::State::kAccepted; })) {
      return Unavailable("no prefill instance has accepted this decode instance");
    }
  }
  auto info = std::make_shared<RequestInfo>();
  info->prefill_tokens.assign(prompt.begin(), prompt.end() - 1);
  std::weak_ptr<TaskQueue> weak = queue_;
  auto wrapped = [this, info, weak, cb = std::move(on_output)](const engine::RequestOutput& out) {
    if (!out.finished()) {
      if (cb) cb(out);
      return;
    }
    engine::RequestOutput copy = out;
    {
      std::lock_guard<std::mutex> lock(info->mu);
      if (!info->failure.ok() && copy.finish_reason == engine::FinishReason::kAbort) {
        copy.finish_reason = engine::FinishReason::kError;
        copy.error = info->failure;
      }
    }
    if (auto q = weak.lock()) q->Post([this, id = out.request_id] { OnEnded(id); });
    if (cb) cb(copy);
  };
  // On the engine thread, before an abort of this request could free its pages: the messenger
  // takes a reference of its own for the transfer (see Fence).
  auto on_reserved = [this, info, weak](int64_t id, const std::vector<int32_t>& pages) {
    auto q = weak.lock();
    if (q == nullptr) return;
    owner_->inner_->RetainPages(pages);
    q->Post([this, id, pages, info] { OnReserved(id, pages, info); });
  };
  return inner.SubmitRemoteKv(std::move(prompt), sampling, std::move(wrapped),
                              std::move(on_reserved));
}

void DecodeMessenger::Impl::OnReserved(int64_t id, std::vector<int32_t> pages,
                                       std::shared_ptr<RequestInfo> info) {
  auto r = std::make_unique<Req>();
  r->id = id;
  r->info = std::move(info);
  r->pages = std::move(pages);
  r->holding = true;  // taken in on_reserved
  r->start = NowSeconds();
  Req* raw = r.get();
  reqs_[id] = std::move(r);
  owner_->metrics_.Started();
  StartAttempt(raw, OkStatus());
}

void DecodeMessenger::Impl::StartAttempt(Req* r, const Status& last_error) {
  const int peer = PickPeer(*r);
  if (peer < 0) {
    Fail(r, last_error.ok() ? Unavailable("no prefill instance available")
                            : Status(last_error.code(), last_error.message() +
                                                            " (and no other prefill instance "
                                                            "to retry on)"));
    return;
  }
  if (free_meta_slots_.empty()) {
    Fail(r, ResourceExhausted("every metadata slot is in use"));
    return;
  }
  // A fresh wire id per attempt: a late PrefillDone of an earlier attempt lifts only its fence.
  r->wire_id = wire_prefix_ | next_wire_++;
  r->done_received = false;
  if (!r->holding) {  // a retry: the earlier attempt's reference went to its fence
    owner_->inner_->RetainPages(r->pages);
    r->holding = true;
  }
  const uint32_t num_tokens = static_cast<uint32_t>(r->info->prefill_tokens.size());
  const uint32_t num_pages = PagesForTokens(num_tokens, spec_.page_size);
  auto expected = ExpectedWrites(peers_[peer].scheme, scheme_, format_, num_pages, r->wire_id);
  if (!expected.ok()) {
    Fail(r, expected.status());
    return;
  }
  const uint32_t imm = next_imm_++;
  const int64_t id = r->id;
  std::weak_ptr<TaskQueue> weak = queue_;
  auto waiter = domain_->imm_counters().Expect(imm, *expected, [this, weak, id, imm] {
    if (auto q = weak.lock()) q->Post([this, id, imm] { OnKvArrived(id, imm); });
  });
  if (!waiter.ok()) {
    Fail(r, waiter.status());
    return;
  }
  r->meta_slot = free_meta_slots_.back();
  free_meta_slots_.pop_back();
  by_wire_[r->wire_id] = id;
  // The canary the prefill's metadata write must replace (every float a NaN no computation makes).
  std::memset(meta_buffer_.data() + size_t{meta_bytes_} * r->meta_slot, 0xFF, meta_bytes_);
  r->imm = imm;
  r->peer = peer;
  r->in_flight = true;
  r->attempts++;
  r->tried.push_back(peer);
  r->deadline = NowSeconds() + options_.transfer_timeout_ms / 1000.0;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peers_[peer].outstanding++;
  }
  UpdateActive();
  PrefillRequest m;
  m.request_id = r->wire_id;
  m.transfer_imm = imm;
  m.token_ids = r->info->prefill_tokens;
  m.decode_scheme = scheme_;
  for (const transfer::MemoryRegion& mr : kv_mrs_)
    m.rank_regions.push_back(mr.descriptor.ToBytes());
  m.dst_pages.assign(r->pages.begin(), r->pages.begin() + num_pages);
  m.metadata_region = meta_mr_.descriptor.ToBytes();
  m.metadata_offset = uint64_t{meta_bytes_} * r->meta_slot;
  m.metadata_bytes = meta_bytes_;
  m.deadline_ms = options_.transfer_timeout_ms;
  if (options_.tracer != nullptr) {
    r->attempt_ns = Tracer::NowNs();
    options_.tracer->Instant("prefill request sent", "kv",
                             {{"request", std::to_string(r->wire_id)},
                              {"peer", peers_[peer].config.name},
                              {"attempt", int64_t{r->attempts}},
                              {"tokens", int64_t{num_tokens}},
                              {"expected_writes", static_cast<int64_t>(*expected)}});
  }
  Send(peer, m);  // a failure marks the peer down, which fails this attempt
}

void DecodeMessenger::Impl::OnKvArrived(int64_t id, uint32_t imm) {
  Req* r = Find(id);
  if (r == nullptr || !r->in_flight || r->imm != imm) return;
  std::vector<float> hidden(meta_bytes_ / sizeof(float));
  std::memcpy(hidden.data(), meta_buffer_.data() + size_t{meta_bytes_} * r->meta_slot, meta_bytes_);
  const auto canary = std::count_if(hidden.begin(), hidden.end(), [](float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    return bits == 0xFFFFFFFFu;
  });
  if (canary != 0) {
    r->done_received = true;  // the counter fired: every write of the attempt has landed
    FailAttempt(r, DataLoss("prefill instance " + peers_[r->peer].config.name +
                            ": every write landed but the metadata was not written (" +
                            std::to_string(canary) + " of " + std::to_string(hidden.size()) +
                            " hidden-state values still hold the canary)"));
    return;
  }
  if (options_.on_metadata) options_.on_metadata(id, hidden);
  const uint64_t num_pages =
      PagesForTokens(static_cast<uint32_t>(r->info->prefill_tokens.size()), spec_.page_size);
  const uint64_t bytes = num_pages * spec_.num_layers * spec_.page_bytes() + meta_bytes_;
  owner_->metrics_.Succeeded(NowSeconds() - r->start, bytes, num_pages * spec_.num_layers + 1);
  if (options_.tracer != nullptr) {
    options_.tracer->Complete("kv transfer", "kv", r->attempt_ns, Tracer::NowNs(),
                              {{"request", std::to_string(r->wire_id)},
                               {"peer", peers_[r->peer].config.name},
                               {"attempt", int64_t{r->attempts}},
                               {"bytes", static_cast<int64_t>(bytes)}});
    options_.tracer->Instant("kv ready", "kv", {{"request", std::to_string(r->wire_id)}});
  }
  EndAttempt(r, /*fence=*/false);  // every write of this attempt has landed
  ReleaseHold(r);
  owner_->inner_->MarkKvReady(id);
}

void DecodeMessenger::Impl::OnPrefillDone(const PrefillDone& done, uint64_t seq) {
  if (auto f = fences_.find(done.request_id); f != fences_.end()) {
    if (Status s = replay_.Check(peers_[f->second.peer].config.fabric_address, seq); !s.ok()) {
      return;
    }
    ReleaseFence(done.request_id);  // that instance has stopped writing for the attempt
    return;
  }
  auto it = by_wire_.find(done.request_id);
  if (it == by_wire_.end()) return;
  Req* r = Find(it->second);
  if (r == nullptr || !r->in_flight) return;
  if (Status s = replay_.Check(peers_[r->peer].config.fabric_address, seq); !s.ok()) return;
  if (done.status_code == 0) {  // the imm counter says when the writes have landed
    r->done_received = true;
    return;
  }
  r->done_received = true;  // an error answer: that instance has stopped writing for it
  FailAttempt(r, Status(static_cast<StatusCode>(done.status_code),
                        "prefill instance " + peers_[r->peer].config.name + ": " + done.message));
}

void DecodeMessenger::Impl::EndAttempt(Req* r, bool fence) {
  if (!r->in_flight) return;
  r->in_flight = false;
  domain_->imm_counters().Remove(r->imm);
  by_wire_.erase(r->wire_id);
  if (fence && !r->done_received && peers_[r->peer].state != PeerStatus::State::kDown) {
    Fence& f = fences_[r->wire_id];
    f.peer = r->peer;
    f.meta_slot = r->meta_slot;
    if (r->holding) f.pages = r->pages;  // the attempt's reference moves to the fence
    r->holding = false;
    f.deadline = r->deadline + options_.fence_grace_s;
  } else {
    free_meta_slots_.push_back(r->meta_slot);
  }
  r->meta_slot = -1;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peers_[r->peer].outstanding--;
  }
  UpdateActive();
}

void DecodeMessenger::Impl::FailAttempt(Req* r, const Status& status) {
  if (!r->in_flight) return;
  PD_LOG_WARN("decode messenger: request {} attempt {} failed: {}", r->id, r->attempts,
              status.ToString());
  const int old_peer = r->peer;
  const uint64_t wire_id = r->wire_id;
  if (options_.tracer != nullptr) {
    options_.tracer->Instant("attempt failed", "kv",
                             {{"request", std::to_string(wire_id)},
                              {"peer", peers_[old_peer].config.name},
                              {"attempt", int64_t{r->attempts}},
                              {"error", status.ToString()}});
  }
  EndAttempt(r, /*fence=*/true);
  if (Retryable(status.code()) && r->attempts < options_.max_attempts && PickPeer(*r) >= 0) {
    owner_->metrics_.Retried();
    StartAttempt(r, status);  // before the Cancel, which a dead peer may hold up
  } else {
    Fail(r, status);
  }
  if (peers_[old_peer].state == PeerStatus::State::kAccepted) Send(old_peer, Cancel{wire_id});
}

void DecodeMessenger::Impl::Fail(Req* r, const Status& status) {
  owner_->metrics_.Failed();
  if (options_.tracer != nullptr) {
    options_.tracer->Instant("transfer failed", "kv",
                             {{"request", std::to_string(r->wire_id)},
                              {"attempts", int64_t{r->attempts}},
                              {"error", status.ToString()}});
  }
  {
    std::lock_guard<std::mutex> lock(r->info->mu);
    r->info->failure =
        Status(status.code(), "KV transfer failed after " + std::to_string(r->attempts) +
                                  " attempt(s): " + status.message());
  }
  owner_->inner_->Abort(r->id);  // the final output comes back as kError (see Submit)
}

void DecodeMessenger::Impl::OnEnded(int64_t id) {
  Req* r = Find(id);
  if (r == nullptr) return;
  if (r->in_flight) {
    if (peers_[r->peer].state == PeerStatus::State::kAccepted) Send(r->peer, Cancel{r->wire_id});
    EndAttempt(r, /*fence=*/true);
  }
  ReleaseHold(r);
  reqs_.erase(id);
}

void DecodeMessenger::Impl::ReleaseHold(Req* r) {
  if (!r->holding) return;
  r->holding = false;
  owner_->inner_->ReleasePages(r->pages);
}

void DecodeMessenger::Impl::ReleaseFence(uint64_t wire_id) {
  auto it = fences_.find(wire_id);
  if (it == fences_.end()) return;
  if (!it->second.pages.empty()) owner_->inner_->ReleasePages(std::move(it->second.pages));
  free_meta_slots_.push_back(it->second.meta_slot);
  fences_.erase(it);
}

void DecodeMessenger::Impl::CheckDeadlines() {
  const double now = NowSeconds();
  // The domain posts sends in order, so only the oldest pending send can be the one that is
  // stuck (a dead peer); those behind it were merely waiting and get a fresh deadline.
  if (!sends_.empty()) {
    auto oldest = std::min_element(sends_.begin(), sends_.end(),
                                   [](const auto& a, const auto& b) { return a.first < b.first; });
    if (now > oldest->second.deadline) {
      const transfer::TransferId id = oldest->first;
      const int peer = oldest->second.peer;
      sends_.erase(oldest);
      for (auto& [other, send] : sends_) send.deadline = now + options_.send_timeout_s;
      domain_->Cancel(id);  // unblocks the queue behind it
      MarkDown(peer, DeadlineExceeded("a control message was not delivered within " +
                                      std::to_string(options_.send_timeout_s) + " s"));
    }
  }
  std::vector<uint64_t> expired;
  for (const auto& [wire, f] : fences_) {
    if (now > f.deadline) expired.push_back(wire);
  }
  for (uint64_t wire : expired) {
    PD_LOG_WARN(
        "decode messenger: prefill instance {} never confirmed the end of transfer {}; its "
        "pages are reused after {} s",
        peers_[fences_[wire].peer].config.name, wire, options_.fence_grace_s);
    ReleaseFence(wire);
  }
  std::vector<Req*> late;
  for (auto& [id, r] : reqs_) {
    if (r->in_flight && now > r->deadline) late.push_back(r.get());
  }
  for (Req* r : late) {
    FailAttempt(r, DeadlineExceeded("prefill instance " + peers_[r->peer].config.name +
                                    " did not complete the KV transfer within " +
                                    std::to_string(options_.transfer_timeout_ms) + " ms"));
  }
}

Req* DecodeMessenger::Impl::Find(int64_t id) {
  auto it = reqs_.find(id);
  return it == reqs_.end() ? nullptr : it->second.get();
}

void DecodeMessenger::Impl::UpdateActive() {
  int64_t n = 0;
  for (auto& [id, r] : reqs_) n += r->in_flight ? 1 : 0;
  owner_->metrics_.SetActive(n);
}

// ------------------------------------------------------------------ public

Result<std::unique_ptr<DecodeMessenger>> DecodeMessenger::Create(
    const DecodeMessengerOptions& options, engine::ModelRunner& runner,
    std::unique_ptr<engine::AsyncEngine> inner) {
  if (inner == nullptr) return InvalidArgument("DecodeMessenger needs an engine");
  if (options.peers.empty()) return InvalidArgument("DecodeMessenger needs prefill peers");
  std::unique_ptr<DecodeMessenger> m(new DecodeMessenger());
  m->inner_ = std::move(inner);
  m->impl_ = std::make_unique<Impl>(m.get(), options, runner);
  RETURN_IF_ERROR(m->impl_->Init());
  return m;
}

DecodeMessenger::~DecodeMessenger() { Shutdown(); }

Status DecodeMessenger::WaitForPeers(double timeout_s) { return impl_->WaitForPeers(timeout_s); }
std::vector<PeerStatus> DecodeMessenger::peers() const { return impl_->Peers(); }

Result<int64_t> DecodeMessenger::Submit(std::vector<int32_t> prompt_ids,
                                        const engine::SamplingParams& sampling,
                                        engine::OutputCallback on_output) {
  return impl_->Submit(std::move(prompt_ids), sampling, std::move(on_output));
}

void DecodeMessenger::Abort(int64_t request_id) { inner_->Abort(request_id); }
engine::EngineStats DecodeMessenger::stats() const { return inner_->stats(); }
const model::ModelConfig& DecodeMessenger::config() const { return inner_->config(); }

void DecodeMessenger::Shutdown() {
  if (impl_) impl_->Stop();
  if (inner_) inner_->Shutdown();
}

const std::string& DecodeMessenger::fabric_address() const { return impl_->address(); }

}  // namespace pd::messenger
