// What a peer needs to write into one of our registered regions: where it is, how long, the remote
// key and our fabric address. Descriptors travel between processes as bytes; ToBytes/FromBytes use
// a versioned little-endian format with a CRC-32 so a truncated or corrupted descriptor is
// rejected before anything is written with it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pd::transfer {

struct MemoryDescriptor {
  // Remote address of byte 0 of the region as the owner's provider expects it in fi_write: the
  // virtual address when the provider uses FI_MR_VIRT_ADDR, otherwise 0 (offset addressing).
  uint64_t addr = 0;
  uint64_t length = 0;      // bytes
  uint64_t rkey = 0;        // remote key (fi_mr_key)
  bool has_key = false;     // false for a default-constructed descriptor
  std::string fabric_addr;  // the owner's endpoint name (fi_getname bytes)

  std::string ToBytes() const;
  static Result<MemoryDescriptor> FromBytes(std::string_view bytes);

  // OK when [offset, offset + len) lies inside the region (no overflow), len > 0 and the
  // descriptor carries a key and an address; otherwise InvalidArgument / OutOfRange naming it.
  Status CheckRange(uint64_t offset, uint64_t len) const;
  // Shape checks that need no range: key present, address present, length > 0, no wrap-around.
  Status Validate() const;
};

// One region registered on every domain of a DomainGroup: one descriptor per domain.
struct GroupDescriptor {
  std::vector<MemoryDescriptor> domains;

  std::string ToBytes() const;
  static Result<GroupDescriptor> FromBytes(std::string_view bytes);
};

// CRC-32 (IEEE, reflected), exposed for tests of the wire format.
uint32_t Crc32(std::string_view bytes);

}  // namespace pd::transfer
