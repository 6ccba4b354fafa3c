// Little-endian byte writer and bounds-checked reader for the messenger's wire protocol.
// Every read checks the remaining length; a short or malformed buffer is a Status, never a crash.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/status.h"

namespace pd::messenger {

class ByteWriter {
 public:
  template <typename T>
  requires std::is_arithmetic_v<T>
  void Put(T value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));  // x86-64 and aarch64 are little-endian
  }
  void PutBytes(std::string_view bytes) {
    Put<uint32_t>(static_cast<uint32_t>(bytes.size()));
    bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
  }
  template <typename T>
  requires std::is_arithmetic_v<T>
  void PutArray(const std::vector<T>& values) {
    Put<uint32_t>(static_cast<uint32_t>(values.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(values.data());
    bytes_.insert(bytes_.end(), p, p + values.size() * sizeof(T));
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  requires std::is_arithmetic_v<T> Status Get(const char* field, T* out) {
    if (remaining() < sizeof(T)) return Truncated(field, sizeof(T));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return OkStatus();
  }
  // A length-prefixed byte string of at most max_bytes.
  Status GetBytes(const char* field, size_t max_bytes, std::string* out);
  // A length-prefixed array of at most max_count elements.
  template <typename T>
  requires std::is_arithmetic_v<T> Status GetArray(const char* field, size_t max_count,
                                                   std::vector<T>* out) {
    uint32_t count = 0;
    RETURN_IF_ERROR(Get(field, &count));
    if (count > max_count) return TooLong(field, count, max_count);
    if (remaining() < size_t{count} * sizeof(T)) return Truncated(field, size_t{count} * sizeof(T));
    out->resize(count);
    // An empty vector's data() may be null, and memcpy from or to null is undefined even for 0.
    if (count != 0) std::memcpy(out->data(), data_ + pos_, size_t{count} * sizeof(T));
    pos_ += size_t{count} * sizeof(T);
    return OkStatus();
  }
  size_t remaining() const { return size_ - pos_; }
  // InvalidArgument if bytes are left over after the last field.
  Status ExpectEnd(const char* message) const;

 private:
  Status Truncated(const char* field, size_t need) const;
  static Status TooLong(const char* field, size_t count, size_t max_count);

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace pd::messenger
