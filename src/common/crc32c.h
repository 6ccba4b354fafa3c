// CRC32C (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41, reflected 0x82F63B78), used to check
// that KV bytes arrived as they were sent (messenger --kv-checksum).
//
//   uint32_t crc = Crc32c(a, na);          // check value of "123456789": 0xE3069283
//   crc = Crc32c(b, nb, crc);              // == Crc32c(a ++ b)
//
// Crc32c picks, once, the SSE4.2 `crc32` instruction when the CPU has it and a slicing-by-8 table
// otherwise; both are exposed so tests can check one against the other.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pd {

// The CRC of `size` bytes at `data`, continuing `crc` (the CRC of the bytes before; 0 to start).
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

// The table implementation (any CPU).
uint32_t Crc32cTable(const void* data, size_t size, uint32_t crc = 0);
// The SSE4.2 implementation. Only call it when Crc32cHardwareAvailable().
uint32_t Crc32cSse42(const void* data, size_t size, uint32_t crc = 0);
// Whether this CPU has the SSE4.2 crc32 instruction (always false off x86-64).
bool Crc32cHardwareAvailable();
// "sse4.2" or "table": what Crc32c uses on this machine.
const char* Crc32cImplementation();

}  // namespace pd
