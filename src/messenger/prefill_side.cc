#include "messenger/prefill_side.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/thread_util.h"
#include "messenger/channel.h"
#include "messenger/handshake.h"
#include "messenger/shard_writes.h"

namespace pd::messenger {
namespace {

constexpr int kDeadlineScanMs = 20;  // the longest the loop sleeps without a task or a bump

// Pages [first_page, end_page) of one request, computed by runner step `runner_step`: layer l of
// them may be written once progress >= runner_step * num_layers + l + 1.
struct LayerWork {
  uint64_t request_id = 0;
  uint64_t runner_step = 0;
  int first_page = 0;
  int end_page = 0;
  int next_layer = 0;
  bool is_last = false;
};

struct Transfer {
  uint64_t request_id = 0;  // the decode side's id (unique per decode instance, random prefix)
  transfer::PeerAddr peer;
  uint32_t imm = 0;
  int64_t engine_id = -1;
  int num_tokens = 0;
  ShardPlan plan;                           // seeded with request_id
  std::vector<transfer::RemoteRegion> dst;  // per decode rank
  uint64_t dst_num_pages = 0;               // pages in one layer of every decode rank's region
  std::vector<int32_t> dst_pages;
  transfer::RemoteRegion meta;
  uint64_t meta_offset = 0;
  int meta_slot = -1;
  double start_time = 0.0;
  double deadline = 0.0;

  std::vector<int32_t> src_pages;   // the engine's page table (from the step observer)
  int pages_scheduled = 0;          // pages handed to LayerWork so far
  bool kv_posted = false;           // every layer of every page posted
  bool engine_done = false;         // the engine's final output arrived
  std::vector<int32_t> kept_pages;  // referenced for us until we release them
  std::vector<float> last_hidden;
  bool meta_posted = false;
  int outstanding = 0;  // submitted writes not yet completed
  std::unordered_set<transfer::TransferId> inflight;
  uint32_t num_writes = 0;
  uint64_t bytes = 0;
  Status error;
};

}  // namespace

class PrefillMessenger::Impl {
 public:
  Impl(PrefillMessenger* owner, const PrefillMessengerOptions& options, engine::ModelRunner& runner)
      : owner_(owner),
        options_(options),
        runner_(runner),
        spec_(runner.region().spec()),
        scheme_(MakeShardScheme(runner.config(), runner.num_ranks())),
        num_layers_(spec_.num_layers),
        meta_bytes_(static_cast<uint32_t>(runner.config().hidden_size) * 4),
        codec_(options.cluster_secret),
        queue_(std::make_shared<TaskQueue>()) {}

  Status Init();
  void Start(engine::AsyncEngine* engine);
  void Stop();
  engine::StepObserver Observer();
  const std::string& address() const { return domain_->info().address; }

 private:
  void Loop();
  void OnMessage(const std::string& bytes);
  void OnHello(const Hello& hello, uint64_t seq);
  void OnPrefillRequest(const PrefillRequest& request, uint64_t seq);
  Status Admit(const PrefillRequest& request, Transfer* t);
  Status ParseRankRegions(const PrefillRequest& r, uint64_t layer_bytes,
                          std::vector<transfer::MemoryDescriptor>* out);
  void OnCancel(const Cancel& cancel, uint64_t seq);
  void OnStep(const engine::StepInfo& info);
  void OnEngineDone(const engine::RequestOutput& out);
  void OnWriteDone(uint64_t request_id, transfer::TransferId id, const Status& status);
  void TracePosted(Result<transfer::TransferId> id, uint64_t request_id, int layer,
                   int64_t begin_ns, TraceArgs args);
  void PostReady(uint64_t progress);
  void PostLayer(Transfer* t, const LayerWork& w, int layer);
  void MaybePostMetadata(Transfer* t);
  void Track(Transfer* t, Result<transfer::TransferId> id, uint64_t bytes, uint32_t writes);
  void Fail(Transfer* t, const Status& status);
  void TryFinish(Transfer* t);
  void CheckDeadlines();
  void SendDone(const transfer::PeerAddr& peer, uint64_t request_id, const Status& status,
                uint32_t num_writes);
  Transfer* Find(uint64_t request_id);
  transfer::Completion WriteDone(uint64_t request_id, std::shared_ptr<transfer::TransferId> id);

  PrefillMessenger* const owner_;
  const PrefillMessengerOptions options_;
  engine::ModelRunner& runner_;
  const engine::KvCacheSpec spec_;  // rank 0's
  const ShardScheme scheme_;
  const int num_layers_;
  const uint32_t meta_bytes_;
  FrameCodec codec_;
  std::shared_ptr<TaskQueue> queue_;  // shared with callbacks that may outlive us
  std::unique_ptr<transfer::Domain> domain_;
  std::vector<transfer::MemoryRegion> kv_mrs_;  // per rank, all in the one domain
  transfer::MemoryRegion meta_mr_;
  std::vector<uint8_t> meta_staging_;  // (max_transfers, meta_bytes): metadata write sources
  engine::AsyncEngine* engine_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  // Messenger thread only.
  ReplayGuard replay_;
  std::unordered_map<std::string, transfer::PeerAddr> peers_;  // accepted, by fabric address
  std::unordered_map<uint64_t, std::unique_ptr<Transfer>> transfers_;
  std::unordered_map<int64_t, uint64_t> by_engine_id_;
  std::vector<int> free_meta_slots_;
  std::vector<LayerWork> work_;
  struct TracedWrite {
    uint64_t request_id;
    int layer;  // -1: metadata
    int64_t posted_ns;
  };
  std::unordered_map<transfer::TransferId, TracedWrite> traced_;  // only when tracing
};

Status PrefillMessenger::Impl::Init() {
  ASSIGN_OR_RETURN(domain_, OpenMessengerDomain(options_.domain, queue_,
                                                [this](const std::string& m) { OnMessage(m); }));
  ASSIGN_OR_RETURN(kv_mrs_, RegisterRankRegions(*domain_, runner_));
  PD_LOG_INFO("prefill messenger: {} rank KV region(s) registered (tp_size {}, {} KV heads)",
              kv_mrs_.size(), scheme_.tp_size, scheme_.num_kv_heads);
  meta_staging_.assign(static_cast<size_t>(options_.max_transfers) * meta_bytes_, 0);
  ASSIGN_OR_RETURN(meta_mr_, domain_->RegisterMemory(meta_staging_.data(), meta_staging_.size()));
  for (int i = options_.max_transfers - 1; i >= 0; --i) free_meta_slots_.push_back(i);
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
  runner_.progress().SetListener([weak] {
    if (auto q = weak.lock()) q->Wake();
  });
  thread_ = std::thread([this] { Loop(); });
}

void PrefillMessenger::Impl::Loop() {
  SetCurrentThreadName("pd-prefill-kv");
  if (options_.tracer != nullptr) options_.tracer->SetThreadName("prefill messenger");
  const engine::LayerProgress& progress = runner_.progress();
  while (!stop_.load()) {
    // Read progress before the queued tasks: whatever step reached this value was announced
    // (and any failure of the step before it reported) before the value was read.
    const uint64_t v = progress.Value();
    if (!queue_->RunFor(std::chrono::milliseconds(0))) break;
    PostReady(v);
    CheckDeadlines();
    uint64_t next = 0;
    for (const LayerWork& w : work_) {
      uint64_t target = w.runner_step * num_layers_ + w.next_layer + 1;
      if (next == 0 || target < next) next = target;
    }
    // Sleeps until a task arrives or a layer is bumped (the listener wakes the queue), or at the
    // latest when deadlines are due for a look: no polling on the compute's core.
    if (next == 0 || progress.Value() < next) {
      if (!queue_->RunFor(std::chrono::milliseconds(kDeadlineScanMs))) break;
    }
  }
}

void PrefillMessenger::Impl::Stop() {
  if (stop_.exchange(true)) return;
  runner_.progress().SetListener(nullptr);
  queue_->Wake();
  if (thread_.joinable()) thread_.join();
  queue_->Stop();
  for (auto& [id, t] : transfers_) {
    for (transfer::TransferId x : t->inflight) domain_->Cancel(x);
    if (!t->kept_pages.empty()) engine_->ReleasePages(t->kept_pages);
    if (!t->engine_done && engine_ != nullptr) engine_->Abort(t->engine_id);
  }
  transfers_.clear();
  owner_->metrics_.SetActive(0);
}

// ------------------------------------------------------------------ control messages

void PrefillMessenger::Impl::OnMessage(const std::string& bytes) {
  auto frame = codec_.Decode(bytes);
  if (!frame.ok()) {
    PD_LOG_WARN("prefill messenger: dropped a control message: {}", frame.status().ToString());
    owner_->metrics_.Rejected();
    return;
  }
  if (auto* hello = std::get_if<Hello>(&frame->message)) {
    OnHello(*hello, frame->sender_seq);
  } else if (auto* request = std::get_if<PrefillRequest>(&frame->message)) {
    OnPrefillRequest(*request, frame->sender_seq);
  } else if (auto* cancel = std::get_if<Cancel>(&frame->message)) {
    OnCancel(*cancel, frame->sender_seq);
  } else {
    PD_LOG_WARN("prefill messenger: unexpected message type {}", frame->message.index() + 1);
    owner_->metrics_.Rejected();
  }
}

void PrefillMessenger::Impl::OnHello(const Hello& hello, uint64_t seq) {
  if (Status s = replay_.Check(hello.fabric_address, seq); !s.ok()) {
    PD_LOG_WARN("prefill messenger: Hello from '{}': {}", hello.instance_name, s.ToString());
    owner_->metrics_.Rejected();
    return;
  }
  auto peer = domain_->AddPeer(hello.fabric_address);
  if (!peer.ok()) {
    PD_LOG_WARN("prefill messenger: Hello from '{}': {}", hello.instance_name,
                peer.status().ToString());
    owner_->metrics_.Rejected();
    return;
  }
  Status ok = CheckCompatible(owner_->format_, hello.format);
  if (ok.ok()) ok = PlanTransfer(scheme_, hello.scheme, owner_->format_, 0).status();
  HelloReply reply;
  reply.accepted = ok.ok();
  reply.reason = ok.ok() ? "" : ok.message();
  reply.instance_name = options_.instance_name;
  reply.format = owner_->format_;
  reply.scheme = scheme_;
  reply.fabric_address = address();
  if (ok.ok()) {
    if (peers_.emplace(hello.fabric_address, *peer).second) owner_->num_peers_.fetch_add(1);
    PD_LOG_INFO("prefill messenger: accepted decode instance '{}'", hello.instance_name);
  } else {
    PD_LOG_WARN("prefill messenger: refused decode instance '{}': {}", hello.instance_name,
                ok.message());
  }
  (void)domain_->SubmitSend(*peer, codec_.Encode(reply), nullptr);
}

void PrefillMessenger::Impl::SendDone(const transfer::PeerAddr& peer, uint64_t request_id,
                                      const Status& status, uint32_t num_writes) {
  PrefillDone done;
  done.request_id = request_id;
  done.status_code = static_cast<uint16_t>(status.code());
  done.message = status.message().substr(0, kMaxStringBytes);
  done.num_writes = num_writes;
  (void)domain_->SubmitSend(peer, codec_.Encode(done), nullptr);
}

void PrefillMessenger::Impl::OnPrefillRequest(const PrefillRequest& request, uint64_t seq) {
  // The sender is the owner of the regions it asks us to write: it must be a peer we accepted.
  auto region = request.rank_regions.empty()
                    ? Result<transfer::MemoryDescriptor>(InvalidArgument("no rank region"))
                    : transfer::MemoryDescriptor::FromBytes(request.rank_regions[0]);
  if (!region.ok()) {
    PD_LOG_WARN("prefill messenger: PrefillRequest {}: {}", request.request_id,
                region.status().ToString());
    owner_->metrics_.Rejected();
    return;
  }
  auto peer = peers_.find(region->fabric_addr);
  if (peer == peers_.end()) {
    PD_LOG_WARN("prefill messenger: PrefillRequest {} from a peer without a handshake: dropped",
                request.request_id);
    owner_->metrics_.Rejected();
    return;
  }
  if (Status s = replay_.Check(region->fabric_addr, seq); !s.ok()) {
    PD_LOG_WARN("prefill messenger: PrefillRequest {}: {}", request.request_id, s.ToString());
    owner_->metrics_.Rejected();
    return;
  }
  auto t = std::make_unique<Transfer>();
  t->request_id = request.request_id;
  t->peer = peer->second;
  if (Status s = Admit(request, t.get()); !s.ok()) {
    PD_LOG_WARN("prefill messenger: refused PrefillRequest {}: {}", request.request_id,
                s.ToString());
    SendDone(peer->second, request.request_id, s, 0);
    return;
  }
  std::weak_ptr<TaskQueue> weak = queue_;
  auto id =
      engine_->SubmitPrefillOnly(request.token_ids, [this, weak](const engine::RequestOutput& out) {
        if (!out.finished()) return;
        if (auto q = weak.lock()) q->Post([this, out] { OnEngineDone(out); });
      });
  if (!id.ok()) {
    SendDone(peer->second, request.request_id, id.status(), 0);
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
                              {"pages", static_cast<int64_t>(request.dst_pages.size())}});
  }
}

// Every decode rank's region: a valid descriptor of the same instance holding the same whole
// number of KV pages (all layers of `layer_bytes` each) as rank 0's.
Status PrefillMessenger::Impl::ParseRankRegions(const PrefillRequest& r, uint64_t layer_bytes,
                                                std::vector<transfer::MemoryDescriptor>* out) {
  const std::string id = "request " + std::to_string(r.request_id);
  for (size_t k = 0; k < r.rank_regions.size(); ++k) {
    const std::string name = id + ": decode rank " + std::to_string(k) + "'s region";
    ASSIGN_OR_RETURN(transfer::MemoryDescriptor d,
                     transfer::MemoryDescriptor::FromBytes(r.rank_regions[k]));
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
  if (out->empty()) return InvalidArgument(id + ": no rank regions");
  return OkStatus();
}

// Checks every field of a request against our format and the peer's regions.
Status PrefillMessenger::Impl::Admit(const PrefillRequest& r, Transfer* t) {
  const std::string id = "request " + std::to_string(r.request_id);
  if (transfers_.count(r.request_id) != 0) return AlreadyExists(id + " is already in flight");
  if (r.token_ids.empty()) return InvalidArgument(id + ": token_ids is empty");
  const uint32_t pages = PagesForTokens(static_cast<uint32_t>(r.token_ids.size()), spec_.page_size);
  ASSIGN_OR_RETURN(t->plan, PlanTransfer(scheme_, r.decode_scheme, owner_->format_, r.request_id));
  if (r.dst_pages.size() != pages) {
    return InvalidArgument(id + ": dst_pages has " + std::to_string(r.dst_pages.size()) +
                           " ids for " + std::to_string(r.token_ids.size()) + " tokens (" +
                           std::to_string(pages) + " pages of " + std::to_string(spec_.page_size) +
                           ")");
  }
  std::vector<transfer::MemoryDescriptor> dsts;
  RETURN_IF_ERROR(ParseRankRegions(r, t->plan.dst_page_bytes * num_layers_, &dsts));
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
  if (meta.fabric_addr != dst.fabric_addr) {
    return InvalidArgument(id + ": the metadata region belongs to another instance");
  }
  if (r.deadline_ms == 0) return InvalidArgument(id + ": deadline_ms is 0");
  if (static_cast<int>(transfers_.size()) >= options_.max_transfers || free_meta_slots_.empty()) {
    return ResourceExhausted("prefill instance busy: " + std::to_string(transfers_.size()) +
                             " transfers in flight (max " + std::to_string(options_.max_transfers) +
                             ")");
  }
  for (const transfer::MemoryDescriptor& d : dsts) {
    ASSIGN_OR_RETURN(transfer::RemoteRegion remote, domain_->AddRemote(d));
    t->dst.push_back(std::move(remote));
  }
  ASSIGN_OR_RETURN(t->meta, domain_->AddRemote(meta));
  t->imm = r.transfer_imm;
  t->num_tokens = static_cast<int>(r.token_ids.size());
  t->dst_pages = r.dst_pages;
  t->meta_offset = r.metadata_offset;
  t->start_time = NowSeconds();
  t->deadline = t->start_time + std::min(r.deadline_ms, options_.max_deadline_ms) / 1000.0;
  return OkStatus();
}

void PrefillMessenger::Impl::OnCancel(const Cancel& cancel, uint64_t seq) {
  Transfer* t = Find(cancel.request_id);
  if (t == nullptr) return;  // finished already
  if (Status s = replay_.Check(t->peer.fabric_addr, seq); !s.ok()) {
    PD_LOG_WARN("prefill messenger: Cancel {}: {}", cancel.request_id, s.ToString());
    owner_->metrics_.Rejected();
    return;
  }
  Fail(t, Cancelled("request " + std::to_string(cancel.request_id) +
                    " cancelled by the decode instance"));
}

// ------------------------------------------------------------------ engine events

void PrefillMessenger::Impl::OnStep(const engine::StepInfo& info) {
  // A step index seen again means the step that had it failed before running: forget its work.
  work_.erase(std::remove_if(work_.begin(), work_.end(),
                             [&](const LayerWork& w) { return w.runner_step >= info.runner_step; }),
              work_.end());
  for (const engine::PrefillChunk& c : info.prefill_chunks) {
    auto it = by_engine_id_.find(c.request_id);
    if (it == by_engine_id_.end()) continue;
    Transfer* t = Find(it->second);
    if (t == nullptr || !t->error.ok()) continue;
    if (t->src_pages.empty()) t->src_pages = c.page_table;
    if (t->src_pages != c.page_table || t->src_pages.size() != t->dst_pages.size()) {
      Fail(t, Internal("the engine's page table of request " + std::to_string(t->request_id) +
                       " changed or does not match the destination pages"));
      continue;
    }
    const int end = c.start_pos + c.num_tokens;
    const int target =
        c.is_last_chunk ? (end + spec_.page_size - 1) / spec_.page_size : end / spec_.page_size;
    if (target > t->pages_scheduled || c.is_last_chunk) {
      work_.push_back(
          {t->request_id, info.runner_step, t->pages_scheduled, target, 0, c.is_last_chunk});
      t->pages_scheduled = target;
    }
  }
}

void PrefillMessenger::Impl::OnEngineDone(const engine::RequestOutput& out) {
  auto it = by_engine_id_.find(out.request_id);
  if (it == by_engine_id_.end()) return;
  Transfer* t = Find(it->second);
  by_engine_id_.erase(it);
  if (t == nullptr) {  // cannot happen: transfers wait for their engine request
    if (out.prefill_result) engine_->ReleasePages(out.prefill_result->page_table);
    return;
  }
  t->engine_done = true;
  if (out.prefill_result) {
    t->kept_pages = out.prefill_result->page_table;
    t->last_hidden = out.prefill_result->last_hidden;
  } else if (t->error.ok()) {
    Fail(t, out.error.ok() ? Cancelled("the prefill engine aborted the request") : out.error);
    return;
  }
  MaybePostMetadata(t);
  TryFinish(t);
}

// ------------------------------------------------------------------ writes

void PrefillMessenger::Impl::PostReady(uint64_t progress) {
  for (LayerWork& w : work_) {
    Transfer* t = Find(w.request_id);
    if (t == nullptr || !t->error.ok()) {
      w.next_layer = num_layers_;  // dropped below
      continue;
    }
    while (w.next_layer < num_layers_ &&
           progress >= w.runner_step * num_layers_ + w.next_layer + 1) {
      if (w.end_page > w.first_page) PostLayer(t, w, w.next_layer);
      ++w.next_layer;
      if (!t->error.ok()) break;
    }
    if (w.next_layer == num_layers_ && w.is_last && t->error.ok()) {
      t->kv_posted = true;
      MaybePostMetadata(t);
    }
  }
  work_.erase(std::remove_if(work_.begin(), work_.end(),
                             [&](const LayerWork& w) { return w.next_layer >= num_layers_; }),
              work_.end());
}

transfer::Completion PrefillMessenger::Impl::WriteDone(uint64_t request_id,
                                                       std::shared_ptr<transfer::TransferId> id) {
  std::weak_ptr<TaskQueue> weak = queue_;
  return [this, weak, request_id, id](const Status& status) {
    if (auto q = weak.lock())
      q->Post([this, request_id, id, status] { OnWriteDone(request_id, *id, status); });
  };
}

void PrefillMessenger::Impl::Track(Transfer* t, Result<transfer::TransferId> id, uint64_t bytes,
                                   uint32_t writes) {
  if (!id.ok()) {
    Fail(t, id.status().WithContext("posting KV writes"));
    return;
  }
  t->outstanding++;
  t->inflight.insert(*id);
  t->num_writes += writes;
  t->bytes += bytes;
}

// One paged write per run of the transfer's shard plan: from the run's source rank's region into
// its destination rank's region, for pages [w.first_page, w.end_page) of layer `layer`.
void PrefillMessenger::Impl::PostLayer(Transfer* t, const LayerWork& w, int layer) {
  const int64_t begin_ns = options_.tracer != nullptr ? Tracer::NowNs() : 0;
  std::vector<uint32_t> src_pages, dst_pages;
  for (int k = w.first_page; k < w.end_page; ++k) {
    src_pages.push_back(static_cast<uint32_t>(t->src_pages[k]));
    dst_pages.push_back(static_cast<uint32_t>(t->dst_pages[k]));
  }
  const uint32_t n = static_cast<uint32_t>(src_pages.size());
  const RunGeometry g{layer, static_cast<uint64_t>(runner_.region().num_pages()), t->dst_num_pages,
                      0, 0};
  uint64_t layer_bytes = 0;
  uint32_t layer_writes = 0;
  Result<transfer::TransferId> last = Internal("no run");
  for (const ShardSlice& slice : t->plan.slices) {
    for (const PageRun& run : slice.runs) {
      transfer::PagedWriteRequest req;
      req.src = kv_mrs_[static_cast<size_t>(slice.src_rank)];
      req.dst = t->dst[static_cast<size_t>(slice.dst_rank)];
      req.src_pages = src_pages;
      req.dst_pages = dst_pages;
      SetRunGeometry(t->plan, run, g, &req);
      req.imm = t->imm;
      // The completion carries the id, which exists only once Submit returns: share a slot.
      auto slot = std::make_shared<transfer::TransferId>(0);
      last = domain_->SubmitPagedWrite(std::move(req), WriteDone(t->request_id, slot));
      if (last.ok()) *slot = *last;
      layer_bytes += uint64_t{n} * run.bytes;
      layer_writes += n;
      Track(t, last, uint64_t{n} * run.bytes, n);
      if (!t->error.ok()) return;
    }
  }
  if (options_.tracer != nullptr) {
    TracePosted(last, t->request_id, layer, begin_ns,
                {{"request", std::to_string(t->request_id)},
                 {"layer", int64_t{layer}},
                 {"step", static_cast<int64_t>(w.runner_step)},
                 {"first_page", int64_t{w.first_page}},
                 {"pages", int64_t{n}},
                 {"writes", int64_t{layer_writes}},
                 {"bytes", static_cast<int64_t>(layer_bytes)}});
  }
}

// "post writes" (or "post metadata") over the submit call; the write's flight is traced when
// its completion arrives (OnWriteDone).
void PrefillMessenger::Impl::TracePosted(Result<transfer::TransferId> id, uint64_t request_id,
                                         int layer, int64_t begin_ns, TraceArgs args) {
  const int64_t now = Tracer::NowNs();
  if (!id.ok()) args.push_back({"error", id.status().ToString()});
  options_.tracer->Complete(layer < 0 ? "post metadata" : "post writes", "kv", begin_ns, now,
                            std::move(args));
  if (id.ok()) traced_[*id] = {request_id, layer, now};
}

void PrefillMessenger::Impl::MaybePostMetadata(Transfer* t) {
  if (!t->kv_posted || !t->engine_done || t->meta_posted || !t->error.ok()) return;
  if (t->last_hidden.size() * sizeof(float) != meta_bytes_) {
    Fail(t, Internal("the engine's last hidden state has " + std::to_string(t->last_hidden.size()) +
                     " floats, expected " + std::to_string(meta_bytes_ / 4)));
    return;
  }
  const uint64_t offset = uint64_t{meta_bytes_} * t->meta_slot;
  std::memcpy(meta_staging_.data() + offset, t->last_hidden.data(), meta_bytes_);
  transfer::WriteRequest req;
  req.src = meta_mr_;
  req.src_offset = offset;
  req.length = meta_bytes_;
  req.dst = t->meta;
  req.dst_offset = t->meta_offset;
  req.imm = t->imm;
  t->meta_posted = true;
  const int64_t begin_ns = options_.tracer != nullptr ? Tracer::NowNs() : 0;
  auto slot = std::make_shared<transfer::TransferId>(0);
  auto id = domain_->SubmitWrite(req, WriteDone(t->request_id, slot));
  if (id.ok()) *slot = *id;
  if (options_.tracer != nullptr) {
    TracePosted(
        id, t->request_id, -1, begin_ns,
        {{"request", std::to_string(t->request_id)}, {"bytes", static_cast<int64_t>(meta_bytes_)}});
  }
  Track(t, id, meta_bytes_, 1);
}

void PrefillMessenger::Impl::OnWriteDone(uint64_t request_id, transfer::TransferId id,
                                         const Status& status) {
  if (auto it = traced_.find(id); it != traced_.end()) {
    const TracedWrite w = it->second;
    traced_.erase(it);
    options_.tracer->Complete(w.layer < 0 ? "metadata write" : "write layer", "kv", w.posted_ns,
                              Tracer::NowNs(),
                              {{"request", std::to_string(w.request_id)},
                               {"layer", int64_t{w.layer}},
                               {"ok", int64_t{status.ok() ? 1 : 0}}});
  }
  Transfer* t = Find(request_id);
  if (t == nullptr) return;
  t->outstanding--;
  t->inflight.erase(id);
  if (!status.ok() && t->error.ok()) Fail(t, status.WithContext("KV write"));
  TryFinish(t);
}

// ------------------------------------------------------------------ life cycle

void PrefillMessenger::Impl::Fail(Transfer* t, const Status& status) {
  if (!t->error.ok()) return;
  t->error = status;
  if (options_.tracer != nullptr) {
    options_.tracer->Instant(
        "transfer failed", "kv",
        {{"request", std::to_string(t->request_id)}, {"error", status.ToString()}});
  }
  for (transfer::TransferId x : t->inflight) domain_->Cancel(x);
  if (!t->engine_done) engine_->Abort(t->engine_id);
  TryFinish(t);
}

void PrefillMessenger::Impl::TryFinish(Transfer* t) {
  if (!t->engine_done || t->outstanding > 0) return;
  if (t->error.ok() && !t->meta_posted) return;  // writes still to come
  if (!t->kept_pages.empty()) engine_->ReleasePages(std::move(t->kept_pages));
  free_meta_slots_.push_back(t->meta_slot);
  SendDone(t->peer, t->request_id, t->error, t->num_writes);
  if (options_.tracer != nullptr) {
    options_.tracer->Complete(
        "transfer", "kv", static_cast<int64_t>(t->start_time * 1e9), Tracer::NowNs(),
        {{"request", std::to_string(t->request_id)},
         {"tokens", int64_t{t->num_tokens}},
         {"writes", int64_t{t->num_writes}},
         {"bytes", static_cast<int64_t>(t->bytes)},
         {"status", t->error.ok() ? std::string("ok") : t->error.ToString()}});
  }
  if (t->error.ok()) {
    owner_->metrics_.Succeeded(NowSeconds() - t->start_time, t->bytes, t->num_writes);
  } else {
    owner_->metrics_.Failed();
    PD_LOG_WARN("prefill messenger: request {} failed: {}", t->request_id, t->error.ToString());
  }
  transfers_.erase(t->request_id);  // t is gone
  owner_->metrics_.SetActive(static_cast<int64_t>(transfers_.size()));
}

void PrefillMessenger::Impl::CheckDeadlines() {
  const double now = NowSeconds();
  std::vector<Transfer*> late;
  for (auto& [id, t] : transfers_) {
    if (t->error.ok() && now > t->deadline) late.push_back(t.get());
  }
  for (Transfer* t : late) {
    Fail(t, DeadlineExceeded("KV transfer of request " + std::to_string(t->request_id) +
                             " missed its deadline"));
  }
}

Transfer* PrefillMessenger::Impl::Find(uint64_t request_id) {
  auto it = transfers_.find(request_id);
  return it == transfers_.end() ? nullptr : it->second.get();
}

// ------------------------------------------------------------------ public

PrefillMessenger::PrefillMessenger(KvFormat format) : format_(format) {}

PrefillMessenger::~PrefillMessenger() { Stop(); }

Result<std::unique_ptr<PrefillMessenger>> PrefillMessenger::Create(
    const PrefillMessengerOptions& options, engine::ModelRunner& runner) {
  if (options.max_transfers < 1) return InvalidArgument("max_transfers must be >= 1");
  std::unique_ptr<PrefillMessenger> m(
      new PrefillMessenger(MakeKvFormat(options.model_hash, runner.region().spec())));
  m->impl_ = std::make_unique<Impl>(m.get(), options, runner);
  RETURN_IF_ERROR(m->impl_->Init());
  return m;
}

engine::StepObserver PrefillMessenger::step_observer() { return impl_->Observer(); }
void PrefillMessenger::Start(engine::AsyncEngine* engine) { impl_->Start(engine); }
void PrefillMessenger::Stop() {
  if (impl_) impl_->Stop();
}
const std::string& PrefillMessenger::fabric_address() const { return impl_->address(); }

}  // namespace pd::messenger
