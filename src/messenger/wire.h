// The messenger's wire protocol: versioned binary control messages between decode and prefill
// instances, carried as fabric control messages (two-sided sends).
//
// Frame (little-endian):
//   magic u32 'PDKV' | version u16 | type u16 | sender_session u64 | recipient_session u64 |
//   sender_seq u64 | body_len u32 | body | hmac[32]
// The HMAC-SHA256 (key: the cluster secret) covers everything before it. Receivers check magic,
// version, length limits and the MAC before decoding the body, and every body field is
// bounds-checked (ByteReader). Each process draws a random session id at start: every frame
// names its sender's session and its recipient's (learned in the handshake; a Hello, sent before
// that, names 0 and carries the recipient's fabric address in its body), so a frame captured on
// its way to one instance is refused by another and by a restarted one. sender_seq increases per
// sender (from the wall clock, so across restarts too) and a replayed frame is refused.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"

namespace pd::messenger {

inline constexpr uint32_t kWireMagic = 0x564b4450;  // "PDKV"
// Version 2: ShardScheme carries the replicated flag (tensor-parallel transfers).
// Version 3: PrefillRequest carries metadata_imm (the metadata write is counted on its own).
// Version 4: sessions in the header; Hello names its recipient and both handshake messages the
// largest control message their sender receives; a prompt travels as a PrefillRequest and as many
// PromptChunks as its ids need.
// Version 5: KvFormat carries kv_checksum (--kv-checksum, kv_checksum.h).
// Version 6: KvFormat carries latent_dim (an MLA latent cache, replicated on every rank).
// Version 7: PrefillRequest carries first_page (the decode side's prefix cache holds the pages
// before it: only pages [first_page, num_pages) are written); KvFormat carries kv_scales (an
// fp8_e4m3 cache's per-layer scales) and kv_dtype may be fp8_e4m3; several NICs: Hello and
// HelloReply carry the sender's fabric address on each further NIC, PrefillRequest the decode
// regions' descriptors on each further NIC, and Reroute / RerouteReply move a transfer to a fresh
// imm when a NIC fails under it.
// Version 8: Hello and HelloReply carry dp_size (the sender's data-parallel attention ranks),
// PrefillRequest dp_rank (the decode DP rank whose pages it names).
// KvFormat carries speculative (the speculative decoding both sides run: method, K and
// the draft's fingerprint; SpeculativeIdentity in handshake.h).
// Version 9: KvFormat carries draft_kv (the drafter's KV region, sent with the target's) and
// PrefillRequest the decode ranks' draft region descriptors (draft_rank_regions, and
// draft_nic_regions on each further NIC).
inline constexpr uint16_t kWireVersion = 9;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kFrameHeaderBytes = 4 + 2 + 2 + 8 + 8 + 8 + 4;
inline constexpr size_t kBodyLenOffset = kFrameHeaderBytes - 4;
// The smallest control message an instance may announce it receives: a PrefillRequest without
// ids (a few descriptors of at most kMaxStringBytes) must fit, with room for some ids.
inline constexpr uint32_t kMinMessageBytes = 4096;
inline constexpr uint32_t kDefaultMessageBytes = 256u << 10;
inline constexpr size_t kMaxBodyBytes = 8u << 20;
inline constexpr size_t kMaxPromptTokens = 1u << 20;
inline constexpr size_t kMaxPages = 1u << 20;
inline constexpr size_t kMaxRanks = 64;
inline constexpr size_t kMaxStringBytes = 4096;
// NICs (fabric domains) one instance uses at most; also the most imm generations of a transfer.
inline constexpr size_t kMaxNics = 16;

enum class MessageType : uint16_t {
  kHello = 1,
  kHelloReply = 2,
  kPrefillRequest = 3,
  kPrefillDone = 4,
  kCancel = 5,
  kPromptChunk = 6,
  kReroute = 7,
  kRerouteReply = 8,
};

// How an instance shards its KV cache (docs/architecture.md, "Sharded KV transfers").
struct ShardScheme {
  uint16_t tp_size = 1;
  uint16_t num_kv_heads = 1;  // the model's KV heads (all ranks together)
  bool replicated = false;    // every rank holds every KV head (an MLA-like latent cache)
  bool operator==(const ShardScheme&) const = default;
};

// A speculative drafter's KV region (a draft model's; an MTP layer's), kept under the target's
// page ids with the target's page_size: page p of the draft region belongs to the sequence whose
// page table holds p (engine/spec_draft_model.h). A transfer writes each page's draft KV with its
// target KV, into the same destination page ids. Fields as KvFormat's; num_layers 0: no region.
struct DraftKvFormat {
  uint32_t num_layers = 0;
  uint32_t head_dim = 0;      // latent_dim for a latent cache
  uint16_t num_kv_heads = 0;  // the drafter's KV heads (all ranks together); 1 for a latent cache
  uint32_t latent_dim = 0;    // > 0: an MLA latent cache, replicated on every rank
  uint8_t layout = 0;         // engine::KvLayout
  uint8_t kv_dtype = 0;       // engine::KvDType
  uint64_t kv_scales = 0;     // fp8_e4m3: engine::KvScalesFingerprint
  bool operator==(const DraftKvFormat&) const = default;
};

// What both sides must agree on before any KV moves.
struct KvFormat {
  uint64_t model_hash = 0;  // config + tensor names and shapes (see ModelFingerprint)
  uint32_t num_layers = 0;
  uint32_t head_dim = 0;
  uint32_t page_size = 0;
  uint8_t layout = 0;    // engine::KvLayout
  uint8_t kv_dtype = 0;  // engine::KvDType
  // --kv-checksum (kv_checksum.h): 1 when a CRC32C per layer travels with the KV. Both sides must
  // say the same, so a mixed deployment is refused at the handshake rather than half-checked.
  uint8_t kv_checksum = 0;
  // > 0: an MLA latent cache (engine/kv_cache.h): a page is (page_size, latent_dim), token after
  // token, the same on every rank (the scheme says replicated); head_dim equals latent_dim and
  // layout does not apply.
  uint32_t latent_dim = 0;
  // fp8_e4m3: engine::KvScalesFingerprint of the per-layer k_scale / v_scale (what the stored codes
  // are worth); 0 for the other dtypes.
  uint64_t kv_scales = 0;
  // --speculative-config as SpeculativeIdentity (handshake.h) says it; "": none. Both sides must
  // say the same: a draft that starts from what prefill sends (MTP) or whose KV prefill computes
  // (a draft model) needs both to run the same drafter. At most kMaxStringBytes.
  std::string speculative = "";
  // The drafter's KV region both sides keep; num_layers 0 when neither has one (ngram, or no
  // speculative decoding). Both sides must describe the same region.
  DraftKvFormat draft_kv = {};
  bool operator==(const KvFormat&) const = default;
};

struct Hello {
  std::string instance_name;
  KvFormat format;
  ShardScheme scheme;
  std::string fabric_address;     // the sender's endpoint name, for fi_av_insert
  std::string recipient_address;  // the endpoint name the sender meant it for
  uint32_t max_message_bytes = kDefaultMessageBytes;  // the largest control message it receives
  // The sender's endpoint names on its further NICs (NIC 1, 2, ...; NIC 0's is fabric_address).
  std::vector<std::string> nic_addresses;
  // The sender's data-parallel attention ranks (engine/dp_engine.h): N for an instance of N DP
  // ranks, each with its own pages (its scheme is then TP 1: a request's KV goes to one rank).
  uint16_t dp_size = 1;
};

struct HelloReply {
  bool accepted = false;
  std::string reason;  // why not, when refused
  std::string instance_name;
  KvFormat format;
  ShardScheme scheme;
  std::string fabric_address;
  uint32_t max_message_bytes = kDefaultMessageBytes;  // the largest control message it receives
  std::vector<std::string> nic_addresses;             // as in Hello: the sender's further NICs
  uint16_t dp_size = 1;                               // as in Hello
};

// A prompt's ids and pages travel as one PrefillRequest and, when they do not fit in one control
// message, PromptChunks naming the same request_id; the PrefillRequest says how many there are in
// all. The prefill side admits the request once every id and page has arrived, in any order.
struct PrefillRequest {
  uint64_t request_id = 0;
  uint32_t transfer_imm = 0;       // immediate data every KV page write of this transfer carries
  uint32_t num_tokens = 0;         // the prompt without its last token, in all
  uint32_t num_pages = 0;          // decode pages in all, one per page_size tokens
  std::vector<int32_t> token_ids;  // the first ids (every one when they fit)
  ShardScheme decode_scheme;
  std::vector<std::string> rank_regions;  // per decode rank: serialized memory descriptor
  std::vector<int32_t> dst_pages;         // the first decode page ids
  std::string metadata_region;            // serialized descriptor of the metadata buffer
  uint64_t metadata_offset = 0;
  uint32_t metadata_bytes = 0;
  uint32_t deadline_ms = 0;  // relative to receipt
  // Immediate data the metadata write carries (must differ from transfer_imm): the decode side
  // counts it apart from the KV writes, so a request can decode before its metadata lands.
  uint32_t metadata_imm = 0;
  // The decode instance holds the KV of pages [0, first_page) already (its prefix cache): the
  // prefill instance computes the whole prompt (from its own cache where it can) but writes only
  // pages [first_page, num_pages). Below num_pages.
  uint32_t first_page = 0;
  // The decode side's further NICs (those its Hello announced, in that order): per NIC, one
  // serialized descriptor per decode rank, NIC-major (size = NICs x tp_size). Empty: one NIC.
  std::vector<std::string> nic_regions;
  // The decode DP rank whose region rank_regions names and whose page ids dst_pages are: below
  // the dp_size of the decode instance's Hello (0 when that is 1).
  uint16_t dp_rank = 0;
  // With a draft KV region (KvFormat::draft_kv): per decode rank, the serialized descriptor of its
  // draft region, whose pages dst_pages names too; and on each further NIC, as nic_regions.
  // Empty without one.
  std::vector<std::string> draft_rank_regions;
  std::vector<std::string> draft_nic_regions;
};

// PrefillDone's message (with kUnavailable) when a draining prefill instance refuses a request
// before doing any work for it: the decode instance retries elsewhere without counting an attempt
// and sends that instance nothing new.
inline constexpr char kDrainingMessage[] =
    "the prefill instance is draining (shutting down); retry on another";

struct PrefillDone {
  uint64_t request_id = 0;
  uint16_t status_code = 0;  // pd::StatusCode
  std::string message;
  uint32_t num_writes = 0;  // writes posted for the transfer
};

struct Cancel {
  uint64_t request_id = 0;
};

// More of a PrefillRequest's ids and pages: token_ids go at token_offset, dst_pages at
// page_offset (either may be empty).
struct PromptChunk {
  uint64_t request_id = 0;
  uint32_t token_offset = 0;
  std::vector<int32_t> token_ids;
  uint32_t page_offset = 0;
  std::vector<int32_t> dst_pages;
};

// A KV write of the request failed on one of the prefill instance's NICs (`nic`, for the log): it
// asks to re-post every KV write of the transfer on its other NICs under a fresh imm. A write on
// the lost NIC may have landed with only its completion lost, so the writes cannot simply be
// counted again under the old imm (the count would be reached early); and once the decode side's
// counter fired the KV is complete and must not be written again (the request may be decoding
// into its last page).
struct Reroute {
  uint64_t request_id = 0;
  uint16_t nic = 0;
};

// The answer to a Reroute. new_imm != 0: the old imm's counter is gone (nothing counts for it any
// more) and a counter for new_imm expects every KV write of the transfer: the prefill re-posts them
// all under new_imm and posts later ones under it. new_imm == 0: the KV had all landed already
// (the counter fired): nothing is to be re-posted.
struct RerouteReply {
  uint64_t request_id = 0;
  uint32_t new_imm = 0;
};

using Message = std::variant<Hello, HelloReply, PrefillRequest, PrefillDone, Cancel, PromptChunk,
                             Reroute, RerouteReply>;

struct Frame {
  uint64_t sender_session = 0;
  uint64_t recipient_session = 0;  // 0: not known yet (a Hello)
  uint64_t sender_seq = 0;
  Message message;
};

// Bytes a frame takes around its body's variable arrays: header, MAC and fixed fields.
inline constexpr size_t kFrameOverheadBytes = kFrameHeaderBytes + kMacBytes;

// Encodes a message into a frame authenticated with `secret` (may be empty: integrity only).
std::vector<uint8_t> EncodeFrame(const Frame& frame, const std::string& secret);
// Checks the header, the limits and the MAC, then decodes the body. Every failure is an
// InvalidArgument (or Unauthenticated-style FailedPrecondition for a bad MAC) naming the problem.
Result<Frame> DecodeFrame(const uint8_t* data, size_t size, const std::string& secret);

// HMAC-SHA256 (OpenSSL).
std::array<uint8_t, kMacBytes> HmacSha256(const std::string& key, const uint8_t* data, size_t size);

}  // namespace pd::messenger
