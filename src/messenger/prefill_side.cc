// The prefill messenger's lifecycle (Init, Start, the loop, Stop), its control messages (Hello
// and the handshake, PrefillRequest validated field by field and admitted as a prefill-only engine
// request, Cancel, PrefillDone) and the public PrefillMessenger class. Engine events, the
// layer-by-layer write posting and transfer tracking are in prefill_side_transfer.cc; Impl's
// definition in prefill_side_impl.h.
#include "messenger/prefill_side.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/thread_util.h"
#include "messenger/nics.h"
#include "messenger/prefill_side_impl.h"

namespace pd::messenger {
namespace {

constexpr int kDeadlineScanMs = 20;  // the longest the loop sleeps without a task or a bump

}  // namespace

Status PrefillMessenger::Impl::Init() {
  ControlInbox inbox;
  inbox.codec = codec_;
  inbox.queue = queue_;
  inbox.on_frame = [this](Frame f) { OnFrame(std::move(f)); };
  inbox.metrics = &owner_->metrics_;
  inbox.side = "prefill messenger";
  inbox.max_queued = options_.max_queued_messages;
  transfer::DomainOptions first =
      options_.nics.empty() ? options_.domain : NicDomainOptions(options_.domain, options_.nics[0]);
  ASSIGN_OR_RETURN(domain_, OpenMessengerDomain(first, options_.max_message_bytes, inbox));
  address_ = domain_->info().address;
  RETURN_IF_ERROR(OpenNics());
  ASSIGN_OR_RETURN(kv_mrs_,
                   RegisterRankRegions(*domain_, runner_, transfer::RegionAccess::kLocalSource));
  for (auto& d : extra_domains_) {
    ASSIGN_OR_RETURN(auto mrs,
                     RegisterRankRegions(*d, runner_, transfer::RegionAccess::kLocalSource));
    extra_kv_mrs_.push_back(std::move(mrs));
  }
  if (has_draft_kv()) {
    for (size_t nic = 0; nic < num_nics(); ++nic) {
      auto mrs =
          RegisterRankRegions(Nic(nic), *options_.draft_kv, transfer::RegionAccess::kLocalSource);
      if (!mrs.ok()) return mrs.status().WithContext("the draft KV region");
      draft_mrs_.push_back(std::move(mrs).value());
    }
  }
  PD_LOG_INFO("prefill messenger: {} rank KV region(s) registered (tp_size {}, {})", kv_mrs_.size(),
              scheme_.tp_size, DescribeKvCache(owner_->format_, scheme_));
  ASSIGN_OR_RETURN(meta_staging_, transfer::HostBuffer::Allocate(
                                      static_cast<size_t>(options_.max_transfers) * meta_bytes_));
  ASSIGN_OR_RETURN(meta_mr_, domain_->RegisterMemory(meta_staging_.data(), meta_staging_.size(),
                                                     transfer::RegionAccess::kLocalSource));
  for (int i = options_.max_transfers - 1; i >= 0; --i) free_meta_slots_.push_back(i);
  if (options_.kv_checksum) RETURN_IF_ERROR(InitChecksums());
  return OkStatus();
}

engine::StepObserver PrefillMessenger::Impl::Observer() {
  std::weak_ptr<TaskQueue> weak = queue_;
  return [this, weak](const engine::StepInfo& info) {
    if (info.prefill_chunks.empty()) return;
    if (auto q = weak.lock()) q->Post([this, info] { OnStep(info); });
  };
}

void PrefillMessenger::Impl::Start(engine::AsyncEngine* engine) {
  engine_ = engine;
  std::weak_ptr<TaskQueue> weak = queue_;
  for (int r = 0; r < dp_size_; ++r) {
    RankProgress(r).SetListener([weak] {
      if (auto q = weak.lock()) q->Wake();
    });
  }
  thread_ = std::thread([this] { Loop(); });
}

void PrefillMessenger::Impl::Loop() {
  SetCurrentThreadName("pd-prefill-kv");
  if (options_.tracer != nullptr) options_.tracer->SetThreadName("prefill messenger");
  std::vector<uint64_t> v(dp_size_);
  while (!stop_.load()) {
    // Read progress before the queued tasks: whatever step reached this value was announced
    // (and any failure of the step before it reported) before the value was read.
    for (int r = 0; r < dp_size_; ++r) v[r] = RankProgress(r).Value();
    if (!queue_->RunFor(std::chrono::milliseconds(0))) break;
    PostReady(v);
    CheckDeadlines();
    CheckPartials(NowSeconds());
    bool ready = false;  // a layer of some work is final by now
    for (const LayerWork& w : work_) {
      const uint64_t target = w.runner_step * num_layers_ + w.next_layer + 1;
      ready = ready || RankProgress(w.dp_rank).Value() >= target;
    }
    // Sleeps until a task arrives or a layer is bumped (the listener wakes the queue), or at the
    // latest when deadlines are due for a look: no polling on the compute's core.
    if (!ready) {
      if (!queue_->RunFor(std::chrono::milliseconds(kDeadlineScanMs))) break;
    }
  }
}

void PrefillMessenger::Impl::Stop() {
  if (stop_.exchange(true)) return;
  for (int r = 0; r < dp_size_; ++r) RankProgress(r).SetListener(nullptr);
  queue_->Wake();
  if (thread_.joinable()) thread_.join();
  queue_->Stop();
  // Closing the domain ends every write still posted (nothing of ours can land any more) before
  // the source pages go back to the engine, and before the runner's KV regions and our buffers
  // can be freed by whoever owns them.
  domain_.reset();
  extra_domains_.clear();
  partials_.clear();
  partial_bytes_ = 0;
  set_aside_.clear();  // their writes went with the domain
  for (auto& [id, t] : transfers_) {
    if (!t->kept_pages.empty()) engine_->ReleasePages(t->kept_pages);
    if (!t->engine_done && engine_ != nullptr) engine_->Abort(t->engine_id);
  }
  transfers_.clear();
  owner_->metrics_.SetActive(0);
}

// ------------------------------------------------------------------ control messages

void PrefillMessenger::Impl::OnFrame(Frame frame) {
  if (auto* hello = std::get_if<Hello>(&frame.message)) {
    OnHello(*hello, frame);
  } else if (auto* request = std::get_if<PrefillRequest>(&frame.message)) {
    OnPrefillRequest(std::move(*request), frame);
  } else if (auto* chunk = std::get_if<PromptChunk>(&frame.message)) {
    OnPromptChunk(std::move(*chunk), frame);
  } else if (auto* cancel = std::get_if<Cancel>(&frame.message)) {
    OnCancel(*cancel, frame);
  } else if (auto* reply = std::get_if<RerouteReply>(&frame.message)) {
    OnRerouteReply(*reply, frame);
  } else {
    Warn("type", "unexpected message type " + std::to_string(frame.message.index() + 1));
    owner_->metrics_.Rejected();
  }
}

void PrefillMessenger::Impl::Warn(const std::string& key, const std::string& what) {
  PD_LOG_WARN_LIMITED(warnings_, key, "prefill messenger: {}", what);
}

void PrefillMessenger::Impl::OnHello(const Hello& hello, const Frame& frame) {
  if (hello.recipient_address != address()) {
    Warn("replay", "Hello from '" + hello.instance_name +
                       "' is meant for another instance (replayed?): dropped");
    owner_->metrics_.Replayed();
    return;
  }
  if (Status s = hello_replay_.Check(hello.fabric_address, frame.sender_seq); !s.ok()) {
    Warn("replay", "Hello from '" + hello.instance_name + "': " + s.ToString());
    owner_->metrics_.Replayed();
    return;
  }
  // A known peer's Hello is a heartbeat: its address is in the AV already.
  auto known = peers_.find(hello.fabric_address);
  if (known != peers_.end() && known->second.session != frame.sender_session) {
    PeerRestarted(hello.fabric_address, known->second.session);
    known = peers_.end();  // PeerRestarted forgot it
  }
  Result<transfer::PeerAddr> peer =
      known != peers_.end() ? known->second.addr : domain_->AddPeer(hello.fabric_address);
  if (!peer.ok()) {
    Warn("hello", "Hello from '" + hello.instance_name + "': " + peer.status().ToString());
    owner_->metrics_.Rejected();
    return;
  }
  Status ok = CheckCompatible(owner_->format_, hello.format);
  if (ok.ok()) ok = PlanTransfer(scheme_, hello.scheme, owner_->format_, 0).status();
  if (ok.ok() && has_draft_kv())
    ok = PlanDraftTransfer(scheme_, hello.scheme, owner_->format_, 0).status();
  if (ok.ok()) ok = CheckDataParallel(dp_size_, scheme_, hello.dp_size, hello.scheme);
  HelloReply reply;
  reply.accepted = ok.ok();
  reply.reason = ok.ok() ? "" : ok.message();
  reply.instance_name = options_.instance_name;
  reply.format = owner_->format_;
  reply.scheme = scheme_;
  reply.fabric_address = address();
  reply.max_message_bytes = options_.max_message_bytes;
  for (const auto& d : extra_domains_) reply.nic_addresses.push_back(d->info().address);
  reply.dp_size = dp_size_;
  DecodePeer accepted{*peer, frame.sender_session, {}, {}, {}, hello.dp_size};
  if (ok.ok() && known == peers_.end()) {
    ok = AddPeerNics(hello, &accepted);
    reply.accepted = ok.ok();
    reply.reason = ok.ok() ? "" : ok.message();
  }
  if (ok.ok()) {
    Heard(hello.fabric_address);
    if (peers_.emplace(hello.fabric_address, std::move(accepted)).second) {
      by_session_[frame.sender_session] = hello.fabric_address;
      owner_->num_peers_.fetch_add(1);
      PD_LOG_INFO("prefill messenger: accepted decode instance '{}'", hello.instance_name);
    }
  } else {
    PD_LOG_WARN("prefill messenger: refused decode instance '{}': {}", hello.instance_name,
                ok.message());
  }
  (void)domain_->SubmitSend(*peer, codec_->Encode(reply, frame.sender_session), nullptr);
}

void PrefillMessenger::Impl::PeerRestarted(const std::string& address, uint64_t old_session) {
  PD_LOG_WARN(
      "prefill messenger: the decode instance at this address came back with a new session: "
      "dropping what its previous run had here");
  // Forgotten first: nothing below answers the previous run (its frames would be refused).
  peers_.erase(address);
  owner_->num_peers_.fetch_sub(1);
  by_session_.erase(old_session);
  replay_.Forget(std::to_string(old_session));
  if (retired_sessions_.size() >= kMaxRetiredSessions) retired_sessions_.clear();
  retired_sessions_.insert(old_session);
  const Status gone = Unavailable("the decode instance restarted (new session)");
  std::vector<Transfer*> stale;
  for (auto& [id, t] : transfers_) {
    if (t->peer.fabric_addr == address && t->error.ok()) stale.push_back(t.get());
  }
  for (Transfer* t : stale) Fail(t, gone);
  std::vector<uint64_t> partial;
  for (const auto& [id, p] : partials_) {
    if (p.peer_address == address) partial.push_back(id);
  }
  for (uint64_t id : partial) DropPartial(id, OkStatus());
}

const std::string* PrefillMessenger::Impl::Sender(const Frame& frame, const char* what,
                                                  uint64_t request_id) {
  auto it = by_session_.find(frame.sender_session);
  if (it == by_session_.end()) {
    const bool stale = retired_sessions_.count(frame.sender_session) != 0;
    Warn(stale ? "replay" : "unknown",
         std::string(what) + " " + std::to_string(request_id) +
             (stale ? " from a previous session of its decode instance (replayed?): dropped"
                    : " from a peer without a handshake: dropped"));
    if (stale) {
      owner_->metrics_.Replayed();
    } else {
      owner_->metrics_.Rejected();
    }
    return nullptr;
  }
  if (Status s = replay_.Check(std::to_string(frame.sender_session), frame.sender_seq); !s.ok()) {
    Warn("replay", std::string(what) + " " + std::to_string(request_id) + ": " + s.ToString());
    owner_->metrics_.Replayed();
    return nullptr;
  }
  Heard(it->second);
  return &it->second;
}

void PrefillMessenger::Impl::SendDone(const transfer::PeerAddr& peer, uint64_t request_id,
                                      const Status& status, uint32_t num_writes) {
  auto it = peers_.find(peer.fabric_addr);
  if (it == peers_.end()) return;  // restarted or never accepted: nobody to tell
  PrefillDone done;
  done.request_id = request_id;
  done.status_code = static_cast<uint16_t>(status.code());
  done.message = status.message().substr(0, kMaxStringBytes);
  done.num_writes = num_writes;
  (void)domain_->SubmitSend(peer, codec_->Encode(done, it->second.session), nullptr);
}

void PrefillMessenger::Impl::Begin(const PrefillRequest& request, const std::string& peer_address) {
  const DecodePeer& peer = peers_.at(peer_address);
  // The sender owns the regions it asks us to write.
  auto region = request.rank_regions.empty()
                    ? Result<transfer::MemoryDescriptor>(InvalidArgument("no rank region"))
                    : transfer::MemoryDescriptor::FromBytes(request.rank_regions[0]);
  Status owner = region.ok() ? OkStatus() : region.status();
  if (owner.ok() && region->fabric_addr != peer_address) {
    owner = InvalidArgument("request " + std::to_string(request.request_id) +
                            " names regions of another instance than its sender");
  }
  auto t = std::make_unique<Transfer>();
  t->request_id = request.request_id;
  t->peer = peer.addr;
  if (Status s = owner.ok() ? Admit(request, peer, t.get()) : owner; !s.ok()) {
    PD_LOG_WARN("prefill messenger: refused PrefillRequest {}: {}", request.request_id,
                s.ToString());
    SendDone(peer.addr, request.request_id, s, 0);
    return;
  }
  std::weak_ptr<TaskQueue> weak = queue_;
  auto id =
      engine_->SubmitPrefillOnly(request.token_ids, [this, weak](const engine::RequestOutput& out) {
        if (!out.finished()) return;
        if (auto q = weak.lock()) q->Post([this, out] { OnEngineDone(out); });
      });
  if (!id.ok()) {
    SendDone(peer.addr, request.request_id, id.status(), 0);
    return;
  }
  t->engine_id = *id;
  t->meta_slot = free_meta_slots_.back();
  free_meta_slots_.pop_back();
  by_engine_id_[*id] = t->request_id;
  transfers_[t->request_id] = std::move(t);
  owner_->metrics_.Started();
  owner_->metrics_.SetActive(static_cast<int64_t>(transfers_.size()));
  if (options_.tracer != nullptr) {
    options_.tracer->Instant("prefill request", "kv",
                             {{"request", std::to_string(request.request_id)},
                              {"tokens", static_cast<int64_t>(request.token_ids.size())},
                              {"pages", static_cast<int64_t>(request.dst_pages.size())},
                              {"dp_rank", static_cast<int64_t>(request.dp_rank)}});
  }
}

// Every decode rank's region: a valid descriptor of the same instance holding the same whole
// number of KV pages (all layers of `layer_bytes` each) as rank 0's.
Status PrefillMessenger::Impl::ParseRankRegions(const PrefillRequest& r,
                                                const std::vector<std::string>& regions,
                                                uint64_t layer_bytes,
                                                std::vector<transfer::MemoryDescriptor>* out) {
  const std::string id = "request " + std::to_string(r.request_id);
  const char* what = &regions == &r.rank_regions ? "region" : "draft KV region";
  for (size_t k = 0; k < regions.size(); ++k) {
    const std::string name = id + ": decode rank " + std::to_string(k) + "'s " + what;
    ASSIGN_OR_RETURN(transfer::MemoryDescriptor d,
                     transfer::MemoryDescriptor::FromBytes(regions[k]));
    RETURN_IF_ERROR(d.Validate().WithContext(name));
    if (d.length % layer_bytes != 0) {
      return InvalidArgument(name + " of " + std::to_string(d.length) +
                             " bytes is not a whole number of KV pages of " +
                             std::to_string(layer_bytes) + " bytes (all layers)");
    }
    if (!out->empty() &&
        (d.length != out->front().length || d.fabric_addr != out->front().fabric_addr)) {
      return InvalidArgument(name + " differs from rank 0's in size or owner");
    }
    out->push_back(std::move(d));
  }
  if (out->empty()) return InvalidArgument(id + ": no rank " + what + "s");
  return OkStatus();
}

// Checks every field of a request against our format and the peer's regions.
Status PrefillMessenger::Impl::Admit(const PrefillRequest& r, const DecodePeer& peer, Transfer* t) {
  const std::string id = "request " + std::to_string(r.request_id);
  if (transfers_.count(r.request_id) != 0) return AlreadyExists(id + " is already in flight");
  if (r.dp_rank >= peer.dp_size)
    return InvalidArgument(id + ": dp_rank " + std::to_string(r.dp_rank) +
                           " is not below the decode instance's dp_size " +
                           std::to_string(peer.dp_size));
  if (r.token_ids.empty()) return InvalidArgument(id + ": token_ids is empty");
  const uint32_t pages = PagesForTokens(static_cast<uint32_t>(r.token_ids.size()), spec_.page_size);
  ASSIGN_OR_RETURN(t->plan, PlanTransfer(scheme_, r.decode_scheme, owner_->format_, r.request_id));
  if (r.dst_pages.size() != pages) {
    return InvalidArgument(id + ": dst_pages has " + std::to_string(r.dst_pages.size()) +
                           " ids for " + std::to_string(r.token_ids.size()) + " tokens (" +
                           std::to_string(pages) + " pages of " + std::to_string(spec_.page_size) +
                           ")");
  }
  if (r.first_page >= pages) {
    return InvalidArgument(id + ": first_page " + std::to_string(r.first_page) +
                           " is not below the prompt's " + std::to_string(pages) + " pages");
  }
  std::vector<transfer::MemoryDescriptor> dsts;
  RETURN_IF_ERROR(ParseRankRegions(r, r.rank_regions, t->plan.dst_page_bytes * num_layers_, &dsts));
  const transfer::MemoryDescriptor& dst = dsts[0];
  t->dst_num_pages = dst.length / (t->plan.dst_page_bytes * num_layers_);
  for (size_t k = 0; k < r.dst_pages.size(); ++k) {
    if (static_cast<uint64_t>(r.dst_pages[k]) >= t->dst_num_pages) {
      return OutOfRange(
          id + ": dst_pages[" + std::to_string(k) + "] = " + std::to_string(r.dst_pages[k]) +
          " is outside the decode region's " + std::to_string(t->dst_num_pages) + " pages");
    }
  }
  ASSIGN_OR_RETURN(auto meta, transfer::MemoryDescriptor::FromBytes(r.metadata_region));
  if (r.metadata_bytes != meta_bytes_) {
    return InvalidArgument(id + ": metadata_bytes " + std::to_string(r.metadata_bytes) +
                           " (expected " + std::to_string(meta_bytes_) + ": hidden_size floats)");
  }
  RETURN_IF_ERROR(meta.CheckRange(r.metadata_offset, r.metadata_bytes));
  if (options_.kv_checksum) {  // the checksum record follows the metadata (kv_checksum.h)
    RETURN_IF_ERROR(meta.CheckRange(r.metadata_offset + r.metadata_bytes,
                                    ChecksumBytes(static_cast<uint32_t>(num_layers_))));
  }
  if (meta.fabric_addr != dst.fabric_addr) {
    return InvalidArgument(id + ": the metadata region belongs to another instance");
  }
  if (r.deadline_ms == 0) return InvalidArgument(id + ": deadline_ms is 0");
  if (r.metadata_imm == r.transfer_imm) {
    return InvalidArgument(id + ": metadata_imm equals transfer_imm (" +
                           std::to_string(r.transfer_imm) +
                           "): the metadata write is counted apart");
  }
  if (static_cast<int>(transfers_.size()) >= options_.max_transfers || free_meta_slots_.empty()) {
    return ResourceExhausted("prefill instance busy: " + std::to_string(transfers_.size()) +
                             " transfers in flight (max " + std::to_string(options_.max_transfers) +
                             ")");
  }
  RETURN_IF_ERROR(meta.Validate().WithContext(id + ": the metadata region"));
  // Every region belongs to the sender (checked above and in OnPrefillRequest), whose address is
  // in the AV since its Hello: no Domain::AddRemote, a round trip through the fabric worker per
  // region on the way to the prefill's start.
  for (const transfer::MemoryDescriptor& d : dsts) t->dst.push_back({d, t->peer.fi_addr});
  t->meta = {meta, t->peer.fi_addr};
  const DecodePeer& peer_nics = peers_.at(t->peer.fabric_addr);
  RETURN_IF_ERROR(ParseNicRegions(r, r.nic_regions, peer_nics, t->dst, &t->nic_dst));
  RETURN_IF_ERROR(AdmitDraft(r, peer_nics, t));
  t->imm = r.transfer_imm;
  t->meta_imm = r.metadata_imm;
  t->num_tokens = static_cast<int>(r.token_ids.size());
  t->dst_pages = r.dst_pages;
  t->first_page = static_cast<int>(r.first_page);
  t->pages_scheduled = t->first_page;  // the decode side holds the pages before it
  t->meta_offset = r.metadata_offset;
  t->start_time = NowSeconds();
  t->deadline = t->start_time + std::min(r.deadline_ms, options_.max_deadline_ms) / 1000.0;
  return OkStatus();
}

void PrefillMessenger::Impl::OnCancel(const Cancel& cancel, const Frame& frame) {
  const std::string* sender = Sender(frame, "Cancel", cancel.request_id);
  if (sender == nullptr) return;
  const Status cancelled = Cancelled("request " + std::to_string(cancel.request_id) +
                                     " cancelled by the decode instance");
  if (auto p = partials_.find(cancel.request_id);
      p != partials_.end() && p->second.peer_address == *sender) {
    DropPartial(cancel.request_id, cancelled);
    return;
  }
  Transfer* t = Find(cancel.request_id);
  if (t == nullptr || t->peer.fabric_addr != *sender) return;  // finished already
  Fail(t, cancelled);
}

// ------------------------------------------------------------------ public

PrefillMessenger::PrefillMessenger(KvFormat format) : format_(std::move(format)) {}

PrefillMessenger::~PrefillMessenger() { Stop(); }

Result<std::unique_ptr<PrefillMessenger>> PrefillMessenger::Create(
    const PrefillMessengerOptions& options, engine::ModelRunner& runner) {
  if (options.max_transfers < 1) return InvalidArgument("max_transfers must be >= 1");
  if (options.max_queued_messages < 1) return InvalidArgument("max_queued_messages must be >= 1");
  RETURN_IF_ERROR(CheckDraftKvRunner(runner, options.draft_kv));
  std::unique_ptr<PrefillMessenger> m(new PrefillMessenger(
      MakeKvFormat(options.model_hash, runner.region().spec(), options.kv_checksum,
                   options.speculative, MakeDraftKvFormat(options.draft_kv))));
  m->impl_ = std::make_unique<Impl>(m.get(), options, runner);
  m->metrics_.SetBytesPerToken(
      KvBytesPerToken(m->format_, MakeShardScheme(runner.config(), runner.num_ranks())));
  m->metrics_.SetNumRanks(runner.num_ranks());
  RETURN_IF_ERROR(m->impl_->Init());
  return m;
}

engine::StepObserver PrefillMessenger::step_observer() { return impl_->Observer(); }
void PrefillMessenger::Start(engine::AsyncEngine* engine) { impl_->Start(engine); }
void PrefillMessenger::Stop() {
  if (impl_) impl_->Stop();
}
void PrefillMessenger::BeginDrain() { impl_->BeginDrain(); }
const std::string& PrefillMessenger::fabric_address() const { return impl_->address(); }
int PrefillMessenger::num_nics() const { return static_cast<int>(impl_->num_nics()); }

}  // namespace pd::messenger
