// Page-aligned host memory of its own pages (an anonymous mapping) for registered buffers such as
// the messenger's metadata slots: a registration then covers no neighbouring heap object, and a
// buffer unmapped while still registered is caught when its domain closes
// (NumRegionsFreedWhileRegistered). Zero-filled. Thread safety: none needed (no state changes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"

namespace pd::transfer {

class HostBuffer {
 public:
  HostBuffer() = default;
  static Result<HostBuffer> Allocate(size_t size_bytes);
  ~HostBuffer();
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Release();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // size rounded up to whole pages
};

}  // namespace pd::transfer
