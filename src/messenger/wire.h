// The messenger's wire protocol: versioned binary control messages between decode and prefill
// instances, carried as fabric control messages (two-sided sends).
//
// Frame (little-endian):
//   magic u32 'PDKV' | version u16 | type u16 | sender_seq u64 | body_len u32 | body | hmac[32]
// The HMAC-SHA256 (key: the cluster secret) covers everything before it. Receivers check magic,
// version, length limits and the MAC before decoding the body, and every body field is
// bounds-checked (ByteReader). sender_seq increases per sender so a replayed frame is refused.
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
// Version 4: KvFormat carries kv_checksum (--kv-checksum, kv_checksum.h).
inline constexpr uint16_t kWireVersion = 4;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kFrameHeaderBytes = 4 + 2 + 2 + 8 + 4;
inline constexpr size_t kMaxBodyBytes = 8u << 20;
inline constexpr size_t kMaxPromptTokens = 1u << 20;
inline constexpr size_t kMaxPages = 1u << 20;
inline constexpr size_t kMaxRanks = 64;
inline constexpr size_t kMaxStringBytes = 4096;

enum class MessageType : uint16_t {
  kHello = 1,
  kHelloReply = 2,
  kPrefillRequest = 3,
  kPrefillDone = 4,
  kCancel = 5,
};

// How an instance shards its KV cache (docs/architecture.md, "Sharded KV transfers").
struct ShardScheme {
  uint16_t tp_size = 1;
  uint16_t num_kv_heads = 1;  // the model's KV heads (all ranks together)
  bool replicated = false;    // every rank holds every KV head (an MLA-like latent cache)
  bool operator==(const ShardScheme&) const = default;
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
  bool operator==(const KvFormat&) const = default;
};

struct Hello {
  std::string instance_name;
  KvFormat format;
  ShardScheme scheme;
  std::string fabric_address;  // the sender's endpoint name, for fi_av_insert
};

struct HelloReply {
  bool accepted = false;
  std::string reason;  // why not, when refused
  std::string instance_name;
  KvFormat format;
  ShardScheme scheme;
  std::string fabric_address;
};

struct PrefillRequest {
  uint64_t request_id = 0;
  uint32_t transfer_imm = 0;       // immediate data every KV page write of this transfer carries
  std::vector<int32_t> token_ids;  // the prompt without its last token
  ShardScheme decode_scheme;
  std::vector<std::string> rank_regions;  // per decode rank: serialized memory descriptor
  std::vector<int32_t> dst_pages;         // decode page ids, one per page_size tokens
  std::string metadata_region;            // serialized descriptor of the metadata buffer
  uint64_t metadata_offset = 0;
  uint32_t metadata_bytes = 0;
  uint32_t deadline_ms = 0;  // relative to receipt
  // Immediate data the metadata write carries (must differ from transfer_imm): the decode side
  // counts it apart from the KV writes, so a request can decode before its metadata lands.
  uint32_t metadata_imm = 0;
};

struct PrefillDone {
  uint64_t request_id = 0;
  uint16_t status_code = 0;  // pd::StatusCode
  std::string message;
  uint32_t num_writes = 0;  // writes posted for the transfer
};

struct Cancel {
  uint64_t request_id = 0;
};

using Message = std::variant<Hello, HelloReply, PrefillRequest, PrefillDone, Cancel>;

struct Frame {
  uint64_t sender_seq = 0;
  Message message;
};

// Encodes a message into a frame authenticated with `secret` (may be empty: integrity only).
std::vector<uint8_t> EncodeFrame(const Frame& frame, const std::string& secret);
// Checks the header, the limits and the MAC, then decodes the body. Every failure is an
// InvalidArgument (or Unauthenticated-style FailedPrecondition for a bad MAC) naming the problem.
Result<Frame> DecodeFrame(const uint8_t* data, size_t size, const std::string& secret);

// HMAC-SHA256 (OpenSSL).
std::array<uint8_t, kMacBytes> HmacSha256(const std::string& key, const uint8_t* data, size_t size);

}  // namespace pd::messenger
