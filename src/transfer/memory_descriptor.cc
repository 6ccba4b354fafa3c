#include "transfer/memory_descriptor.h"

#include <array>
#include <cstring>

namespace pd::transfer {
namespace {

constexpr uint32_t kDescriptorMagic = 0x444d4450;  // "PDMD"
constexpr uint32_t kGroupMagic = 0x474d4450;       // "PDMG"
constexpr uint16_t kVersion = 1;
constexpr size_t kMaxAddrBytes = 4096;

class Writer {
 public:
  template <typename T>
  void Put(T value) {
    char buf[sizeof(T)];
    std::memcpy(buf, &value, sizeof(T));  // the wire format is little-endian, like our hosts
    out_.append(buf, sizeof(T));
  }
  void PutBytes(std::string_view bytes) { out_.append(bytes); }
  void PutCrc() { Put<uint32_t>(Crc32(out_)); }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* value) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetBytes(size_t n, std::string* out) {
    if (in_.size() - pos_ < n) return false;
    out->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

// Checks the trailing CRC and returns the body without it.
Result<std::string_view> CheckCrc(std::string_view bytes, const char* what) {
  if (bytes.size() < 4) return InvalidArgument(std::string(what) + ": truncated");
  std::string_view body = bytes.substr(0, bytes.size() - 4);
  uint32_t stored;
  std::memcpy(&stored, bytes.data() + body.size(), 4);
  if (stored != Crc32(body)) return InvalidArgument(std::string(what) + ": checksum mismatch");
  return body;
}

}  // namespace

uint32_t Crc32(std::string_view bytes) {
  static const std::array<uint32_t, 256> kTable = [] {
    std::array<uint32_t, 256> table{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    return table;
  }();
  uint32_t crc = 0xffffffffu;
  for (unsigned char b : bytes) crc = kTable[(crc ^ b) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

std::string MemoryDescriptor::ToBytes() const {
  Writer w;
  w.Put<uint32_t>(kDescriptorMagic);
  w.Put<uint16_t>(kVersion);
  w.Put<uint16_t>(has_key ? 1 : 0);
  w.Put<uint64_t>(addr);
  w.Put<uint64_t>(length);
  w.Put<uint64_t>(rkey);
  w.Put<uint32_t>(static_cast<uint32_t>(fabric_addr.size()));
  w.PutBytes(fabric_addr);
  w.PutCrc();
  return w.Take();
}

Result<MemoryDescriptor> MemoryDescriptor::FromBytes(std::string_view bytes) {
  ASSIGN_OR_RETURN(std::string_view body, CheckCrc(bytes, "memory descriptor"));
  Reader r(body);
  uint32_t magic = 0, addr_len = 0;
  uint16_t version = 0, flags = 0;
  MemoryDescriptor d;
  if (!r.Get(&magic) || magic != kDescriptorMagic) {
    return InvalidArgument("memory descriptor: bad magic");
  }
  if (!r.Get(&version) || version != kVersion) {
    return InvalidArgument("memory descriptor: unsupported version " + std::to_string(version));
  }
  if (!r.Get(&flags) || !r.Get(&d.addr) || !r.Get(&d.length) || !r.Get(&d.rkey) ||
      !r.Get(&addr_len)) {
    return InvalidArgument("memory descriptor: truncated header");
  }
  if (addr_len > kMaxAddrBytes || !r.GetBytes(addr_len, &d.fabric_addr) || r.remaining() != 0) {
    return InvalidArgument("memory descriptor: bad fabric address length " +
                           std::to_string(addr_len));
  }
  d.has_key = (flags & 1) != 0;
  RETURN_IF_ERROR(d.Validate());
  return d;
}

Status MemoryDescriptor::Validate() const {
  if (!has_key) return InvalidArgument("memory descriptor has no remote key");
  if (fabric_addr.empty()) return InvalidArgument("memory descriptor has no fabric address");
  if (length == 0) return InvalidArgument("memory descriptor has length 0");
  if (addr + length < addr) {
    return InvalidArgument("memory descriptor wraps around: addr " + std::to_string(addr) +
                           " length " + std::to_string(length));
  }
  return OkStatus();
}

Status MemoryDescriptor::CheckRange(uint64_t offset, uint64_t len) const {
  RETURN_IF_ERROR(Validate());
  if (len == 0) return InvalidArgument("write of 0 bytes");
  if (offset > length || len > length - offset) {
    return OutOfRange("bytes [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                      ") outside the remote region of " + std::to_string(length) + " bytes");
  }
  return OkStatus();
}

std::string GroupDescriptor::ToBytes() const {
  Writer w;
  w.Put<uint32_t>(kGroupMagic);
  w.Put<uint16_t>(kVersion);
  w.Put<uint16_t>(static_cast<uint16_t>(domains.size()));
  for (const auto& d : domains) {
    std::string one = d.ToBytes();
    w.Put<uint32_t>(static_cast<uint32_t>(one.size()));
    w.PutBytes(one);
  }
  w.PutCrc();
  return w.Take();
}

Result<GroupDescriptor> GroupDescriptor::FromBytes(std::string_view bytes) {
  ASSIGN_OR_RETURN(std::string_view body, CheckCrc(bytes, "group descriptor"));
  Reader r(body);
  uint32_t magic = 0;
  uint16_t version = 0, count = 0;
  if (!r.Get(&magic) || magic != kGroupMagic) return InvalidArgument("group descriptor: bad magic");
  if (!r.Get(&version) || version != kVersion || !r.Get(&count) || count == 0) {
    return InvalidArgument("group descriptor: bad header");
  }
  GroupDescriptor g;
  for (uint16_t i = 0; i < count; ++i) {
    uint32_t len = 0;
    std::string one;
    if (!r.Get(&len) || !r.GetBytes(len, &one)) {
      return InvalidArgument("group descriptor: truncated entry " + std::to_string(i));
    }
    ASSIGN_OR_RETURN(MemoryDescriptor d, MemoryDescriptor::FromBytes(one));
    g.domains.push_back(std::move(d));
  }
  if (r.remaining() != 0) return InvalidArgument("group descriptor: trailing bytes");
  return g;
}

}  // namespace pd::transfer
