#include "messenger/wire.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "engine/kv_cache.h"
#include "messenger/byte_io.h"

namespace pd::messenger {
namespace {

void PutFormat(ByteWriter& w, const KvFormat& f) {
  w.Put(f.model_hash);
  w.Put(f.num_layers);
  w.Put(f.head_dim);
  w.Put(f.page_size);
  w.Put(f.layout);
  w.Put(f.kv_dtype);
  w.Put(f.kv_checksum);
  w.Put(f.latent_dim);
  w.Put(f.kv_scales);
  w.PutBytes(f.speculative);
  const DraftKvFormat& d = f.draft_kv;
  w.Put(d.num_layers);
  w.Put(d.head_dim);
  w.Put(d.num_kv_heads);
  w.Put(d.latent_dim);
  w.Put(d.layout);
  w.Put(d.kv_dtype);
  w.Put(d.kv_scales);
}

Status GetDraftFormat(ByteReader& r, DraftKvFormat* d) {
  RETURN_IF_ERROR(r.Get("format.draft_kv.num_layers", &d->num_layers));
  RETURN_IF_ERROR(r.Get("format.draft_kv.head_dim", &d->head_dim));
  RETURN_IF_ERROR(r.Get("format.draft_kv.num_kv_heads", &d->num_kv_heads));
  RETURN_IF_ERROR(r.Get("format.draft_kv.latent_dim", &d->latent_dim));
  RETURN_IF_ERROR(r.Get("format.draft_kv.layout", &d->layout));
  RETURN_IF_ERROR(r.Get("format.draft_kv.kv_dtype", &d->kv_dtype));
  RETURN_IF_ERROR(r.Get("format.draft_kv.kv_scales", &d->kv_scales));
  if (d->num_layers == 0) {
    if (*d != DraftKvFormat{})
      return InvalidArgument("format.draft_kv describes a region of 0 layers");
    return OkStatus();
  }
  if (d->head_dim == 0 || d->num_kv_heads == 0)
    return InvalidArgument("format.draft_kv: head_dim " + std::to_string(d->head_dim) +
                           " and num_kv_heads " + std::to_string(d->num_kv_heads) +
                           " must be positive");
  if (d->latent_dim != 0 && (d->latent_dim != d->head_dim || d->num_kv_heads != 1))
    return InvalidArgument("format.draft_kv.latent_dim " + std::to_string(d->latent_dim) +
                           " needs head_dim equal to it and one KV head");
  if (d->layout > 1)
    return InvalidArgument("format.draft_kv.layout " + std::to_string(d->layout) + " unknown");
  if (d->kv_dtype > static_cast<uint8_t>(engine::KvDType::kFP8E4M3))
    return InvalidArgument("format.draft_kv.kv_dtype " + std::to_string(d->kv_dtype) + " unknown");
  return OkStatus();
}

Status GetFormat(ByteReader& r, KvFormat* f) {
  RETURN_IF_ERROR(r.Get("format.model_hash", &f->model_hash));
  RETURN_IF_ERROR(r.Get("format.num_layers", &f->num_layers));
  RETURN_IF_ERROR(r.Get("format.head_dim", &f->head_dim));
  RETURN_IF_ERROR(r.Get("format.page_size", &f->page_size));
  RETURN_IF_ERROR(r.Get("format.layout", &f->layout));
  RETURN_IF_ERROR(r.Get("format.kv_dtype", &f->kv_dtype));
  RETURN_IF_ERROR(r.Get("format.kv_checksum", &f->kv_checksum));
  RETURN_IF_ERROR(r.Get("format.latent_dim", &f->latent_dim));
  RETURN_IF_ERROR(r.Get("format.kv_scales", &f->kv_scales));
  RETURN_IF_ERROR(r.GetBytes("format.speculative", kMaxStringBytes, &f->speculative));
  if (f->kv_checksum > 1) {
    return InvalidArgument("format.kv_checksum " + std::to_string(f->kv_checksum) +
                           " is not 0 or 1");
  }
  if (f->latent_dim != 0 && f->latent_dim != f->head_dim) {
    return InvalidArgument("format.latent_dim " + std::to_string(f->latent_dim) +
                           " differs from format.head_dim " + std::to_string(f->head_dim));
  }
  if (f->layout > 1)
    return InvalidArgument("format.layout " + std::to_string(f->layout) + " unknown");
  if (f->kv_dtype > static_cast<uint8_t>(engine::KvDType::kFP8E4M3))
    return InvalidArgument("format.kv_dtype " + std::to_string(f->kv_dtype) + " unknown");
  return GetDraftFormat(r, &f->draft_kv);
}

void PutScheme(ByteWriter& w, const ShardScheme& s) {
  w.Put(s.tp_size);
  w.Put(s.num_kv_heads);
  w.Put<uint8_t>(s.replicated ? 1 : 0);
}

Status GetScheme(ByteReader& r, const char* field, ShardScheme* s) {
  RETURN_IF_ERROR(r.Get(field, &s->tp_size));
  RETURN_IF_ERROR(r.Get(field, &s->num_kv_heads));
  uint8_t replicated = 0;
  RETURN_IF_ERROR(r.Get(field, &replicated));
  if (replicated > 1)
    return InvalidArgument(std::string(field) + ": replicated flag " + std::to_string(replicated) +
                           " is not 0 or 1");
  s->replicated = replicated != 0;
  if (s->tp_size == 0 || s->tp_size > kMaxRanks || s->num_kv_heads == 0)
    return InvalidArgument(std::string(field) + ": tp_size " + std::to_string(s->tp_size) +
                           " / num_kv_heads " + std::to_string(s->num_kv_heads) + " invalid");
  return OkStatus();
}

void PutStrings(ByteWriter& w, const std::vector<std::string>& values) {
  w.Put<uint32_t>(static_cast<uint32_t>(values.size()));
  for (const auto& v : values) w.PutBytes(v);
}

Status GetStrings(ByteReader& r, const char* field, size_t max_count,
                  std::vector<std::string>* out) {
  uint32_t n = 0;
  RETURN_IF_ERROR(r.Get(field, &n));
  if (n > max_count) {
    return InvalidArgument(std::string(field) + " has " + std::to_string(n) +
                           " entries, above the limit of " + std::to_string(max_count));
  }
  out->resize(n);
  for (auto& v : *out) RETURN_IF_ERROR(r.GetBytes(field, kMaxStringBytes, &v));
  return OkStatus();
}

struct BodyEncoder {
  ByteWriter& w;
  void operator()(const Hello& m) {
    w.PutBytes(m.instance_name);
    PutFormat(w, m.format);
    PutScheme(w, m.scheme);
    w.PutBytes(m.fabric_address);
    w.PutBytes(m.recipient_address);
    w.Put(m.max_message_bytes);
    PutStrings(w, m.nic_addresses);
    w.Put(m.dp_size);
  }
  void operator()(const HelloReply& m) {
    w.Put<uint8_t>(m.accepted ? 1 : 0);
    w.PutBytes(m.reason);
    w.PutBytes(m.instance_name);
    PutFormat(w, m.format);
    PutScheme(w, m.scheme);
    w.PutBytes(m.fabric_address);
    w.Put(m.max_message_bytes);
    PutStrings(w, m.nic_addresses);
    w.Put(m.dp_size);
  }
  void operator()(const PrefillRequest& m) {
    w.Put(m.request_id);
    w.Put(m.transfer_imm);
    w.Put(m.num_tokens);
    w.Put(m.num_pages);
    w.PutArray(m.token_ids);
    PutScheme(w, m.decode_scheme);
    w.Put<uint32_t>(static_cast<uint32_t>(m.rank_regions.size()));
    for (const auto& region : m.rank_regions) w.PutBytes(region);
    w.PutArray(m.dst_pages);
    w.PutBytes(m.metadata_region);
    w.Put(m.metadata_offset);
    w.Put(m.metadata_bytes);
    w.Put(m.deadline_ms);
    w.Put(m.metadata_imm);
    w.Put(m.first_page);
    PutStrings(w, m.nic_regions);
    w.Put(m.dp_rank);
    PutStrings(w, m.draft_rank_regions);
    PutStrings(w, m.draft_nic_regions);
  }
  void operator()(const PrefillDone& m) {
    w.Put(m.request_id);
    w.Put(m.status_code);
    w.PutBytes(m.message);
    w.Put(m.num_writes);
  }
  void operator()(const Cancel& m) { w.Put(m.request_id); }
  void operator()(const PromptChunk& m) {
    w.Put(m.request_id);
    w.Put(m.token_offset);
    w.PutArray(m.token_ids);
    w.Put(m.page_offset);
    w.PutArray(m.dst_pages);
  }
  void operator()(const Reroute& m) {
    w.Put(m.request_id);
    w.Put(m.nic);
  }
  void operator()(const RerouteReply& m) {
    w.Put(m.request_id);
    w.Put(m.new_imm);
  }
};

Status GetMessageBytes(ByteReader& r, uint32_t* out) {
  RETURN_IF_ERROR(r.Get("max_message_bytes", out));
  if (*out < kMinMessageBytes) {
    return InvalidArgument("max_message_bytes " + std::to_string(*out) + " is below " +
                           std::to_string(kMinMessageBytes));
  }
  return OkStatus();
}

Status GetDpSize(ByteReader& r, uint16_t* out) {
  RETURN_IF_ERROR(r.Get("dp_size", out));
  if (*out == 0 || *out > kMaxRanks)
    return InvalidArgument("dp_size " + std::to_string(*out) + " is not in [1, " +
                           std::to_string(kMaxRanks) + "]");
  return OkStatus();
}

Status CheckPages(const std::vector<int32_t>& pages) {
  for (int32_t page : pages)
    if (page < 0)
      return InvalidArgument("dst_pages has a negative page id " + std::to_string(page));
  return OkStatus();
}

Result<Message> DecodeHello(ByteReader& r) {
  Hello m;
  RETURN_IF_ERROR(r.GetBytes("instance_name", kMaxStringBytes, &m.instance_name));
  RETURN_IF_ERROR(GetFormat(r, &m.format));
  RETURN_IF_ERROR(GetScheme(r, "scheme", &m.scheme));
  RETURN_IF_ERROR(r.GetBytes("fabric_address", kMaxStringBytes, &m.fabric_address));
  RETURN_IF_ERROR(r.GetBytes("recipient_address", kMaxStringBytes, &m.recipient_address));
  RETURN_IF_ERROR(GetMessageBytes(r, &m.max_message_bytes));
  RETURN_IF_ERROR(GetStrings(r, "nic_addresses", kMaxNics - 1, &m.nic_addresses));
  RETURN_IF_ERROR(GetDpSize(r, &m.dp_size));
  return Message(std::move(m));
}

Result<Message> DecodeHelloReply(ByteReader& r) {
  HelloReply m;
  uint8_t accepted = 0;
  RETURN_IF_ERROR(r.Get("accepted", &accepted));
  m.accepted = accepted != 0;
  RETURN_IF_ERROR(r.GetBytes("reason", kMaxStringBytes, &m.reason));
  RETURN_IF_ERROR(r.GetBytes("instance_name", kMaxStringBytes, &m.instance_name));
  RETURN_IF_ERROR(GetFormat(r, &m.format));
  RETURN_IF_ERROR(GetScheme(r, "scheme", &m.scheme));
  RETURN_IF_ERROR(r.GetBytes("fabric_address", kMaxStringBytes, &m.fabric_address));
  RETURN_IF_ERROR(GetMessageBytes(r, &m.max_message_bytes));
  RETURN_IF_ERROR(GetStrings(r, "nic_addresses", kMaxNics - 1, &m.nic_addresses));
  RETURN_IF_ERROR(GetDpSize(r, &m.dp_size));
  return Message(std::move(m));
}

Result<Message> DecodePrefillRequest(ByteReader& r) {
  PrefillRequest m;
  RETURN_IF_ERROR(r.Get("request_id", &m.request_id));
  RETURN_IF_ERROR(r.Get("transfer_imm", &m.transfer_imm));
  RETURN_IF_ERROR(r.Get("num_tokens", &m.num_tokens));
  RETURN_IF_ERROR(r.Get("num_pages", &m.num_pages));
  if (m.num_tokens > kMaxPromptTokens || m.num_pages > kMaxPages) {
    return InvalidArgument("num_tokens " + std::to_string(m.num_tokens) + " / num_pages " +
                           std::to_string(m.num_pages) + " above the limits of " +
                           std::to_string(kMaxPromptTokens) + " / " + std::to_string(kMaxPages));
  }
  RETURN_IF_ERROR(r.GetArray("token_ids", m.num_tokens, &m.token_ids));
  RETURN_IF_ERROR(GetScheme(r, "decode_scheme", &m.decode_scheme));
  uint32_t num_regions = 0;
  RETURN_IF_ERROR(r.Get("rank_regions", &num_regions));
  if (num_regions != m.decode_scheme.tp_size)
    return InvalidArgument("rank_regions has " + std::to_string(num_regions) +
                           " entries for a decode tp_size of " +
                           std::to_string(m.decode_scheme.tp_size));
  m.rank_regions.resize(num_regions);
  for (auto& region : m.rank_regions)
    RETURN_IF_ERROR(r.GetBytes("rank_regions[]", kMaxStringBytes, &region));
  RETURN_IF_ERROR(r.GetArray("dst_pages", m.num_pages, &m.dst_pages));
  RETURN_IF_ERROR(CheckPages(m.dst_pages));
  RETURN_IF_ERROR(r.GetBytes("metadata_region", kMaxStringBytes, &m.metadata_region));
  RETURN_IF_ERROR(r.Get("metadata_offset", &m.metadata_offset));
  RETURN_IF_ERROR(r.Get("metadata_bytes", &m.metadata_bytes));
  RETURN_IF_ERROR(r.Get("deadline_ms", &m.deadline_ms));
  RETURN_IF_ERROR(r.Get("metadata_imm", &m.metadata_imm));
  RETURN_IF_ERROR(r.Get("first_page", &m.first_page));
  if (m.first_page >= m.num_pages && m.num_pages > 0)
    return InvalidArgument("first_page " + std::to_string(m.first_page) +
                           " is not below num_pages " + std::to_string(m.num_pages) +
                           " (nothing would be written)");
  RETURN_IF_ERROR(
      GetStrings(r, "nic_regions", (kMaxNics - 1) * m.decode_scheme.tp_size, &m.nic_regions));
  if (m.nic_regions.size() % m.decode_scheme.tp_size != 0) {
    return InvalidArgument("nic_regions has " + std::to_string(m.nic_regions.size()) +
                           " entries, not a multiple of the decode tp_size " +
                           std::to_string(m.decode_scheme.tp_size));
  }
  RETURN_IF_ERROR(r.Get("dp_rank", &m.dp_rank));
  if (m.dp_rank >= kMaxRanks)
    return InvalidArgument("dp_rank " + std::to_string(m.dp_rank) + " is not below the limit of " +
                           std::to_string(kMaxRanks) + " ranks");
  RETURN_IF_ERROR(
      GetStrings(r, "draft_rank_regions", m.decode_scheme.tp_size, &m.draft_rank_regions));
  if (!m.draft_rank_regions.empty() && m.draft_rank_regions.size() != m.decode_scheme.tp_size) {
    return InvalidArgument("draft_rank_regions has " + std::to_string(m.draft_rank_regions.size()) +
                           " entries for a decode tp_size of " +
                           std::to_string(m.decode_scheme.tp_size));
  }
  RETURN_IF_ERROR(GetStrings(r, "draft_nic_regions", m.nic_regions.size(), &m.draft_nic_regions));
  if (m.draft_nic_regions.size() != (m.draft_rank_regions.empty() ? 0 : m.nic_regions.size())) {
    return InvalidArgument("draft_nic_regions has " + std::to_string(m.draft_nic_regions.size()) +
                           " entries; one per nic_regions entry with draft_rank_regions, else "
                           "none");
  }
  return Message(std::move(m));
}

Result<Message> DecodePrefillDone(ByteReader& r) {
  PrefillDone m;
  RETURN_IF_ERROR(r.Get("request_id", &m.request_id));
  RETURN_IF_ERROR(r.Get("status_code", &m.status_code));
  if (m.status_code > static_cast<uint16_t>(StatusCode::kIoError))
    return InvalidArgument("status_code " + std::to_string(m.status_code) + " unknown");
  RETURN_IF_ERROR(r.GetBytes("message", kMaxStringBytes, &m.message));
  RETURN_IF_ERROR(r.Get("num_writes", &m.num_writes));
  return Message(std::move(m));
}

Result<Message> DecodePromptChunk(ByteReader& r) {
  PromptChunk m;
  RETURN_IF_ERROR(r.Get("request_id", &m.request_id));
  RETURN_IF_ERROR(r.Get("token_offset", &m.token_offset));
  RETURN_IF_ERROR(r.GetArray("token_ids", kMaxPromptTokens, &m.token_ids));
  RETURN_IF_ERROR(r.Get("page_offset", &m.page_offset));
  RETURN_IF_ERROR(r.GetArray("dst_pages", kMaxPages, &m.dst_pages));
  RETURN_IF_ERROR(CheckPages(m.dst_pages));
  if (uint64_t{m.token_offset} + m.token_ids.size() > kMaxPromptTokens ||
      uint64_t{m.page_offset} + m.dst_pages.size() > kMaxPages) {
    return InvalidArgument("prompt chunk beyond the limits (token_offset " +
                           std::to_string(m.token_offset) + ", page_offset " +
                           std::to_string(m.page_offset) + ")");
  }
  return Message(std::move(m));
}

Result<Message> DecodeBody(MessageType type, ByteReader& r) {
  switch (type) {
    case MessageType::kHello:
      return DecodeHello(r);
    case MessageType::kHelloReply:
      return DecodeHelloReply(r);
    case MessageType::kPrefillRequest:
      return DecodePrefillRequest(r);
    case MessageType::kPrefillDone:
      return DecodePrefillDone(r);
    case MessageType::kCancel: {
      Cancel m;
      RETURN_IF_ERROR(r.Get("request_id", &m.request_id));
      return Message(m);
    }
    case MessageType::kPromptChunk:
      return DecodePromptChunk(r);
    case MessageType::kReroute: {
      Reroute m;
      RETURN_IF_ERROR(r.Get("request_id", &m.request_id));
      RETURN_IF_ERROR(r.Get("nic", &m.nic));
      if (m.nic >= kMaxNics) return InvalidArgument("nic " + std::to_string(m.nic) + " unknown");
      return Message(m);
    }
    case MessageType::kRerouteReply: {
      RerouteReply m;
      RETURN_IF_ERROR(r.Get("request_id", &m.request_id));
      RETURN_IF_ERROR(r.Get("new_imm", &m.new_imm));
      return Message(m);
    }
  }
  return InvalidArgument("unknown message type " + std::to_string(static_cast<int>(type)));
}

}  // namespace

std::array<uint8_t, kMacBytes> HmacSha256(const std::string& key, const uint8_t* data,
                                          size_t size) {
  std::array<uint8_t, kMacBytes> mac{};
  size_t mac_len = 0;
  // EVP_Q_mac with a NULL libctx uses the default provider; it fails only on allocation failure.
  unsigned char* out = EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, key.data(),
                                 key.size(), data, size, mac.data(), mac.size(), &mac_len);
  PD_CHECK(out != nullptr && mac_len == kMacBytes) << "HMAC-SHA256 failed";
  return mac;
}

std::vector<uint8_t> EncodeFrame(const Frame& frame, const std::string& secret) {
  ByteWriter body;
  std::visit(BodyEncoder{body}, frame.message);
  ByteWriter w;
  w.Put(kWireMagic);
  w.Put(kWireVersion);
  w.Put<uint16_t>(static_cast<uint16_t>(frame.message.index() + 1));
  w.Put(frame.sender_session);
  w.Put(frame.recipient_session);
  w.Put(frame.sender_seq);
  w.Put<uint32_t>(static_cast<uint32_t>(body.bytes().size()));
  auto& out = w.bytes();
  out.insert(out.end(), body.bytes().begin(), body.bytes().end());
  auto mac = HmacSha256(secret, out.data(), out.size());
  out.insert(out.end(), mac.begin(), mac.end());
  return std::move(out);
}

Result<Frame> DecodeFrame(const uint8_t* data, size_t size, const std::string& secret) {
  if (size < kFrameHeaderBytes + kMacBytes)
    return InvalidArgument("frame of " + std::to_string(size) + " bytes is shorter than a header");
  ByteReader header(data, kFrameHeaderBytes);
  uint32_t magic = 0, body_len = 0;
  uint16_t version = 0, type = 0;
  Frame frame;
  RETURN_IF_ERROR(header.Get("magic", &magic));
  RETURN_IF_ERROR(header.Get("version", &version));
  RETURN_IF_ERROR(header.Get("type", &type));
  RETURN_IF_ERROR(header.Get("sender_session", &frame.sender_session));
  RETURN_IF_ERROR(header.Get("recipient_session", &frame.recipient_session));
  RETURN_IF_ERROR(header.Get("sender_seq", &frame.sender_seq));
  RETURN_IF_ERROR(header.Get("body_len", &body_len));
  if (magic != kWireMagic) return InvalidArgument("bad frame magic (not a pdserve peer?)");
  if (version != kWireVersion)
    return InvalidArgument("wire protocol version " + std::to_string(version) +
                           " is not supported (this build speaks " + std::to_string(kWireVersion) +
                           ")");
  if (body_len > kMaxBodyBytes || size != kFrameHeaderBytes + body_len + kMacBytes)
    return InvalidArgument("frame body_len " + std::to_string(body_len) + " does not match the " +
                           std::to_string(size) + " bytes received");
  auto mac = HmacSha256(secret, data, kFrameHeaderBytes + body_len);
  if (CRYPTO_memcmp(mac.data(), data + kFrameHeaderBytes + body_len, kMacBytes) != 0)
    return FailedPrecondition("frame authentication failed (wrong cluster secret?)");
  ByteReader body(data + kFrameHeaderBytes, body_len);
  ASSIGN_OR_RETURN(frame.message, DecodeBody(static_cast<MessageType>(type), body));
  RETURN_IF_ERROR(body.ExpectEnd("frame body"));
  return frame;
}

}  // namespace pd::messenger
