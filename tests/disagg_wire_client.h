// Test helper (header-only): a fake decode instance that joins a real prefill instance over the
// fabric with its own transfer::Domain and speaks the messenger's wire protocol
// (messenger/wire.h) directly, so a test can send it well-formed, malformed, truncated and
// unauthenticated control messages and watch what comes back.
//
//   auto c = WireClient::Create(prefill_fabric_address, secret, hidden_size, &why);
//   ASSERT_TRUE(c->Handshake());                  // learns the prefill's KV format
//   PrefillRequest r = c->Request(1, imm, tokens);  // writes go into c's own regions
//   c->SendFrame(r);  auto done = c->WaitDone(1, 10s);
//
// Frames name the client's session (one per WireClient) and the current prefill instance's,
// learned from its HelloReply; SwitchTo talks to another instance (Handshake with it first).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "messenger/channel.h"
#include "messenger/handshake.h"
#include "messenger/wire.h"
#include "transfer/domain.h"

namespace pd::testing {

class WireClient {
 public:
  static constexpr int kRegionPages = 8;
  static constexpr int kMetaSlots = 4;

  static std::unique_ptr<WireClient> Create(const std::string& prefill_address,
                                            const std::string& secret, int hidden_size,
                                            std::string* why) {
    std::unique_ptr<WireClient> c(new WireClient(secret, hidden_size));
    transfer::DomainOptions o;
    o.provider = "tcp;ofi_rxm";
    o.node = "127.0.0.1";
    o.message_bytes = 256u << 10;
    o.op_timeout_s = 5.0;
    o.on_message = [raw = c.get()](std::string_view m) { raw->OnMessage(m); };
    auto d = transfer::Domain::Create(o);
    if (!d.ok()) {
      *why = d.status().ToString();
      return nullptr;
    }
    c->domain_ = std::move(*d);
    if (!c->SwitchTo(prefill_address, why)) return nullptr;
    return c;
  }
  // From now on frames go to the prefill instance at `prefill_address` (its session as learned
  // from its last HelloReply, if any).
  bool SwitchTo(const std::string& prefill_address, std::string* why) {
    auto peer = domain_->AddPeer(prefill_address);
    if (!peer.ok()) {
      *why = peer.status().ToString();
      return false;
    }
    peer_ = *peer;
    peer_address_ = prefill_address;
    std::lock_guard<std::mutex> lock(mu_);
    peer_session_ = sessions_[prefill_address];
    return true;
  }
  ~WireClient() { domain_.reset(); }

  // Sends raw bytes as one control message; true once the fabric delivered them.
  bool SendRaw(std::string bytes) {
    auto done = std::make_shared<std::promise<Status>>();
    auto f = done->get_future();
    auto id = domain_->SubmitSend(peer_, std::move(bytes),
                                  [done](const Status& s) { done->set_value(s); });
    if (!id.ok()) return false;
    return f.wait_for(std::chrono::seconds(10)) == std::future_status::ready && f.get().ok();
  }
  // A frame to the current instance (a Hello names it as its recipient).
  std::string Encode(messenger::Message m) {
    if (auto* hello = std::get_if<messenger::Hello>(&m)) hello->recipient_address = peer_address_;
    std::lock_guard<std::mutex> lock(mu_);
    return codec_.Encode(m, std::holds_alternative<messenger::Hello>(m) ? 0 : peer_session_);
  }
  bool SendFrame(const messenger::Message& m) { return SendRaw(Encode(m)); }

  // Hello with a wrong model hash (must be refused with the reason), then with the format the
  // refusal carried (must be accepted). Registers the KV and metadata regions.
  bool Handshake() {
    messenger::Hello hello;
    hello.instance_name = "wire-test-client";
    hello.format.model_hash = 1;
    hello.scheme = {1, 1};
    hello.fabric_address = domain_->info().address;
    if (!SendFrame(hello)) return false;
    auto refused = Next<messenger::HelloReply>(std::chrono::seconds(10));
    if (!refused || refused->accepted || refused->reason.find("model") == std::string::npos) {
      return false;
    }
    format_ = refused->format;
    hello.format = format_;
    hello.scheme = refused->scheme;
    if (!SendFrame(hello)) return false;
    auto accepted = Next<messenger::HelloReply>(std::chrono::seconds(10));
    if (!accepted || !accepted->accepted) return false;
    scheme_ = accepted->scheme;
    spec_.num_layers = static_cast<int>(format_.num_layers);
    spec_.num_kv_heads = scheme_.num_kv_heads;
    spec_.head_dim = static_cast<int>(format_.head_dim);
    spec_.page_size = static_cast<int>(format_.page_size);
    spec_.layout = static_cast<engine::KvLayout>(format_.layout);
    spec_.dtype = static_cast<engine::KvDType>(format_.kv_dtype);
    kv_.assign(spec_.page_bytes() * spec_.num_layers * kRegionPages, 0);
    meta_.assign(size_t{meta_bytes_} * kMetaSlots, 0);
    auto kv = domain_->RegisterMemory(kv_.data(), kv_.size());
    auto meta = domain_->RegisterMemory(meta_.data(), meta_.size());
    if (!kv.ok() || !meta.ok()) return false;
    kv_mr_ = *kv;
    meta_mr_ = *meta;
    return true;
  }

  // A well-formed request for `tokens` into pages 0.. of our region and metadata slot 0.
  messenger::PrefillRequest Request(uint64_t id, uint32_t imm, std::vector<int32_t> tokens) const {
    messenger::PrefillRequest r;
    r.request_id = id;
    r.transfer_imm = imm;
    r.metadata_imm = MetadataImm(imm);
    r.decode_scheme = scheme_;
    r.rank_regions = {kv_mr_.descriptor.ToBytes()};
    const uint32_t pages =
        messenger::PagesForTokens(static_cast<uint32_t>(tokens.size()), format_.page_size);
    for (uint32_t p = 0; p < pages; ++p) r.dst_pages.push_back(static_cast<int32_t>(p));
    r.num_tokens = static_cast<uint32_t>(tokens.size());
    r.num_pages = pages;
    r.token_ids = std::move(tokens);
    r.metadata_region = meta_mr_.descriptor.ToBytes();
    r.metadata_offset = 0;
    r.metadata_bytes = meta_bytes_;
    r.deadline_ms = 20000;
    return r;
  }
  // The metadata write's imm of a request whose KV writes carry `imm`.
  static uint32_t MetadataImm(uint32_t imm) { return imm ^ 0x80000000u; }
  // KV page writes (carrying transfer_imm) a transfer of `r` lands in our region; the metadata
  // write carries metadata_imm and is counted apart.
  uint64_t ExpectedWrites(const messenger::PrefillRequest& r) const {
    auto n = messenger::ExpectedWrites(scheme_, scheme_, format_.num_layers,
                                       static_cast<uint32_t>(r.dst_pages.size()));
    return n.ok() ? *n : 0;
  }
  transfer::ImmCounterTable& imm_counters() { return domain_->imm_counters(); }

  // The next PrefillDone for `request_id` (others are dropped), or nothing within `timeout`.
  std::optional<messenger::PrefillDone> WaitDone(uint64_t request_id,
                                                 std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto d = Next<messenger::PrefillDone>(left);
      if (!d) return std::nullopt;
      if (d->request_id == request_id) return d;
    }
  }
  // Drops every message received so far.
  void ClearInbox() {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.clear();
  }

  // The bytes of our region that hold the KV of the first `num_tokens` token positions (pages
  // 0.., every layer, head, K and V); a partial last page's other slots carry whatever the
  // prefill's source page held, so they are left out.
  std::vector<uint8_t> TokenKv(int num_tokens) const {
    std::vector<uint8_t> out;
    const size_t row = size_t{spec_.elem_bytes()} * spec_.head_dim;
    for (int layer = 0; layer < spec_.num_layers; ++layer) {
      for (int pos = 0; pos < num_tokens; ++pos) {
        const int page = pos / spec_.page_size, t = pos % spec_.page_size;
        const size_t block =
            (static_cast<size_t>(layer) * kRegionPages + page) * spec_.page_bytes();
        for (int h = 0; h < spec_.num_kv_heads; ++h) {
          for (int kv = 0; kv < 2; ++kv) {
            const uint8_t* p = kv_.data() + block + spec_.ElemOffset(t, h, kv) * spec_.elem_bytes();
            out.insert(out.end(), p, p + row);
          }
        }
      }
    }
    return out;
  }
  std::vector<uint8_t>& kv() { return kv_; }
  std::vector<uint8_t>& meta() { return meta_; }
  uint32_t meta_bytes() const { return meta_bytes_; }
  const messenger::KvFormat& format() const { return format_; }
  const std::string& secret() const { return secret_; }

 private:
  WireClient(const std::string& secret, int hidden_size)
      : secret_(secret), codec_(secret), meta_bytes_(static_cast<uint32_t>(hidden_size) * 4) {}

  void OnMessage(std::string_view m) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      inbox_.emplace_back(m);
    }
    cv_.notify_all();
  }

  // The next message that decodes (with our secret) as a T; others are dropped.
  template <typename T>
  std::optional<T> Next(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (true) {
      while (!inbox_.empty()) {
        std::string bytes = std::move(inbox_.front());
        inbox_.pop_front();
        auto frame = codec_.Decode(bytes);
        if (!frame.ok() || !codec_.CheckRecipient(*frame).ok()) continue;
        if (auto* reply = std::get_if<messenger::HelloReply>(&frame->message)) {
          sessions_[reply->fabric_address] = frame->sender_session;
          if (reply->fabric_address == peer_address_) peer_session_ = frame->sender_session;
        }
        if (auto* t = std::get_if<T>(&frame->message)) return *t;
      }
      if (cv_.wait_until(lock, end) == std::cv_status::timeout && inbox_.empty()) {
        return std::nullopt;
      }
    }
  }

  const std::string secret_;
  messenger::FrameCodec codec_;
  const uint32_t meta_bytes_;
  std::unique_ptr<transfer::Domain> domain_;
  transfer::PeerAddr peer_;
  std::string peer_address_;
  messenger::KvFormat format_;
  messenger::ShardScheme scheme_;
  engine::KvCacheSpec spec_;
  std::vector<uint8_t> kv_, meta_;
  transfer::MemoryRegion kv_mr_, meta_mr_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> inbox_;             // GUARDED_BY(mu_)
  uint64_t peer_session_ = 0;                 // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> sessions_;  // by fabric address, GUARDED_BY(mu_)
};

}  // namespace pd::testing
